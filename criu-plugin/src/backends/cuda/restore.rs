//! A restore of an image with CUDA state.
//!
//! `init`, before CRIU creates anything, refuses what cannot succeed: a missing or damaged
//! record, image files that differ from what the dump wrote, no driver, no GPU, GPUs that do not
//! fit. The first RESUME_DEVICES_LATE restores every CUDA process of the restored tree at once.
//! CRIU ignores that hook's errors, so a failed GPU restore kills the restored tree: CRIU then
//! reports the restore as failed, and the images, which a restore never changes, serve for the
//! next attempt. The guardian kills a half-restored tree if CRIU dies before the GPU state is
//! back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::ProcessState;

use criu_gpu_image::cuda::{CudaImage, ProcessRecord};
use criu_gpu_image::placement::Plan;
use criu_gpu_image::restorable::{self, CudaHolds as Holds, Listed, NvidiaNode};

use super::error::{RestoreError, Who};
use super::procs::Procs;
use super::{action_limit, gib, SpawnGuardian, UPSTREAM_PLUGIN};
use crate::core::{Claims, HookError, HookResult, Host, Settings, ThreadWindow, Verdict};
use crate::guardian::proto::{Act, Answer, Order, Watch};
use crate::guardian::Guardian;

enum Phase {
    /// The image holds no CUDA state.
    NoCuda,
    Ready(Box<Ready>),
    /// After the first RESUME_DEVICES_LATE: each CUDA process's outcome.
    Resumed(BTreeMap<i32, Result<(), String>>),
}

/// What `init` prepared for the first RESUME_DEVICES_LATE.
struct Ready {
    holds: Holds,
    plan: Plan,
    guardian: Guardian,
    /// Large pages images the guardian checks against their digests while CRIU restores.
    later: Option<Later>,
}

struct Later {
    seq: u64,
    bytes: u64,
}

pub struct Restore {
    settings: Settings,
    procs: Box<dyn Procs>,
    phase: Phase,
}

impl Restore {
    pub fn init(
        host: &dyn Host,
        claims: &Claims,
        settings: Settings,
        procs: Box<dyn Procs>,
        spawn: SpawnGuardian,
    ) -> Result<Restore, HookError> {
        let mut r = Restore {
            settings,
            procs,
            phase: Phase::NoCuda,
        };
        let Some(dir) = host.image_dir() else {
            return Ok(r);
        };
        let listed = Listed {
            list: claims.listed,
            ours: claims.ours,
            upstream: claims.others.iter().any(|o| o == UPSTREAM_PLUGIN),
        };
        let check = |e: restorable::CudaCheckError| HookError::gpu(RestoreError::Check(e));
        let Some(holds) = restorable::holds(&dir, listed).map_err(check)? else {
            return Ok(r);
        };
        if host.lazy_pages() {
            return Err(HookError::gpu(RestoreError::LazyPages));
        }
        let placement = restorable::placement(&r.settings).map_err(check)?;
        // Forked before any thread of the plugin's runs in CRIU (the digests are hashed on some).
        let mut g = spawn(Watch::Restore)?;
        let mut later = None;
        if let Holds::Record(img) = &holds {
            let start = Instant::now();
            if let Some(checked) =
                restorable::verify_digests(img, &dir, &r.settings).map_err(check)?
            {
                let bytes: u64 = checked.later.iter().map(|d| d.size).sum();
                tracing::info!(
                    "image files checked against their digests: {} files, {:.2} GiB, in {:.2} s; \
                     {:.2} GiB of pages images are checked while CRIU restores",
                    img.digests.len() - checked.later.len(),
                    gib(checked.bytes),
                    start.elapsed().as_secs_f64(),
                    gib(bytes)
                );
                if !checked.later.is_empty() {
                    let seq = g.verify(checked.later)?;
                    later = Some(Later { seq, bytes });
                }
            }
        }
        let driver = g.driver()?.cloned().map_err(str::to_owned);
        if let Holds::Record(img) = &holds {
            g.order(&Order::Expect {
                pids: img.tree.clone(),
            })?;
        }
        let inventory = match driver {
            // No driver: the check says so; NVML is not asked.
            Err(_) => Err("no driver".to_owned()),
            Ok(_) => {
                let seq = g.ask_inventory()?;
                g.wait_all(&[seq], Instant::now() + Duration::from_secs(30), &mut || {})?;
                g.take_inventory(seq)
                    .unwrap_or_else(|| Err("NVML did not answer within 30 s".into()))
            }
        };
        let node = NvidiaNode {
            driver: driver.as_ref().map_err(String::as_str),
            inventory: inventory.as_ref().map_err(String::as_str),
        };
        let checked = restorable::check_node(&holds, node, &placement).map_err(check)?;
        for n in &checked.notes {
            tracing::info!("{n}");
        }
        for w in &checked.warnings {
            tracing::warn!("{w}");
        }
        if let Holds::Record(img) = &holds {
            overlap(host, &r.settings, img)?;
        }
        r.phase = Phase::Ready(Box::new(Ready {
            holds,
            plan: checked.plan,
            guardian: g,
            later,
        }));
        Ok(r)
    }

    pub fn resume(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        match std::mem::replace(&mut self.phase, Phase::NoCuda) {
            Phase::NoCuda => return Ok(Verdict::NotMine),
            Phase::Ready(ready) => {
                let Ready {
                    holds,
                    plan,
                    mut guardian,
                    later,
                } = *ready;
                // The first call is for the root of the restored tree: all of it now.
                let mut results = self.restore_tree(host, pid, &holds, &plan, &mut guardian);
                if let (Some(later), true) = (later, results.values().all(|r| r.is_ok())) {
                    if let Err(e) = checked_later(&mut guardian, &later) {
                        tracing::error!("{e}");
                        results.insert(pid, Err(e));
                    }
                }
                if results.values().any(|r| r.is_err()) {
                    let tree = self.procs.tree(pid);
                    tracing::error!(
                        "killing the restored process tree ({} processes) so that criu reports \
                         the restore as failed; the images are unchanged and can be restored \
                         again",
                        tree.len()
                    );
                    for p in tree.iter().rev() {
                        self.procs.kill(*p);
                    }
                } else {
                    let _ = guardian.order(&Order::Restored);
                }
                let _ = guardian.order(&Order::Bye);
                self.phase = Phase::Resumed(results);
            }
            resumed @ Phase::Resumed(_) => self.phase = resumed,
        }
        match &self.phase {
            Phase::Resumed(results) => match results.get(&pid) {
                None => Ok(Verdict::NotMine),
                Some(Ok(())) => Ok(Verdict::Done(())),
                Some(Err(e)) => Err(HookError::Backend(e.clone())),
            },
            _ => Ok(Verdict::NotMine),
        }
    }

    /// Finds the restored CUDA processes under `root` and restores them at once.
    fn restore_tree(
        &self,
        host: &dyn Host,
        root: i32,
        holds: &Holds,
        plan: &Plan,
        g: &mut Guardian,
    ) -> BTreeMap<i32, Result<(), String>> {
        let procs = &*self.procs;
        let mut results = BTreeMap::new();
        let tree = procs.tree(root);
        let _ = g.order(&Order::Restoring {
            tree: tree
                .iter()
                .filter_map(|p| Some((*p, procs.starttime(*p)?)))
                .collect(),
        });
        // (pid, what it was before the dump)
        let mut todo: Vec<(i32, ProcessRecord)> = Vec::new();
        match holds {
            Holds::Record(img) => {
                for p in &img.processes {
                    match tree
                        .iter()
                        .find(|&&pid| procs.ns_pid(pid) == Some(p.ns_pid))
                    {
                        Some(&pid) => todo.push((pid, p.clone())),
                        None => {
                            let e = RestoreError::NotInTree {
                                ns_pid: p.ns_pid,
                                comm: p.comm.clone(),
                            };
                            results.insert(root, Err(e.to_string()));
                        }
                    }
                }
            }
            Holds::Upstream => {
                for &pid in &tree {
                    if procs.libraries(pid).is_ok_and(|l| l.libcuda) {
                        todo.push((
                            pid,
                            ProcessRecord {
                                ns_pid: procs.ns_pid(pid).unwrap_or(pid),
                                pid,
                                comm: procs.comm(pid),
                                initial_state: ProcessState::Running,
                                gpus: Vec::new(),
                                nccl: false,
                                staging: Vec::new(),
                            },
                        ));
                    }
                }
            }
        }
        let upstream = matches!(holds, Holds::Upstream);
        // The driver's restore thread of each: its id, and that it is ours to restore.
        let mut probes = Vec::new();
        for (pid, p) in &todo {
            let tracked = g.order(&Order::Track {
                pid: *pid,
                starttime: procs.starttime(*pid).unwrap_or(0),
                comm: p.comm.clone(),
            });
            match tracked.and_then(|()| g.act(*pid, Act::Probe)) {
                Ok(seq) => probes.push((*pid, seq)),
                Err(e) => {
                    results.insert(*pid, Err(e.to_string()));
                }
            }
        }
        let seqs: Vec<u64> = probes.iter().map(|(_, s)| *s).collect();
        if let Err(e) = g.wait_all(&seqs, Instant::now() + Duration::from_secs(30), &mut || {}) {
            results.insert(root, Err(e.to_string()));
        }
        let mut threads = Vec::new();
        for ((pid, seq), (_, p)) in probes.iter().zip(&todo) {
            let who = Who {
                pid: *pid,
                comm: p.comm.clone(),
            };
            match g.take(*seq) {
                // (No state query here: it needs the thread to run, and CRIU holds it.)
                Some(Ok(Answer::Thread(restore_tid))) => {
                    // The driver opens the GPUs' device nodes inside the process.
                    let missing = plan
                        .nodes_for(p)
                        .into_iter()
                        .find(|(_, minor)| !procs.has_gpu_node(*pid, *minor));
                    match missing {
                        Some((gpu, minor)) => {
                            let e = RestoreError::NoDeviceNode { who, gpu, minor };
                            results.insert(*pid, Err(e.to_string()));
                        }
                        None => threads.push((*pid, restore_tid)),
                    }
                }
                Some(Err(e)) if upstream && e.not_cuda() => continue,
                Some(Err(e)) => {
                    results.insert(*pid, Err(RestoreError::NoRestoreThread(who, e).to_string()));
                }
                _ => {
                    results.insert(
                        *pid,
                        Err(format!("{who}: the driver did not answer within 30 s")),
                    );
                }
            }
        }
        let bytes: u64 = todo
            .iter()
            .flat_map(|(_, p)| p.gpus.iter().filter_map(|u| u.memory))
            .sum();
        let limit = action_limit(&self.settings, (bytes > 0).then_some(bytes))
            .unwrap_or(Duration::from_secs(600));
        let parallel = self
            .settings
            .flag("CRIU_GPU_PARALLEL")
            .ok()
            .flatten()
            .unwrap_or(true);
        let start = Instant::now();
        let (mut window, failed) = ThreadWindow::open(host.threads(), &threads);
        for e in failed {
            results.insert(root, Err(RestoreError::Threads(e.to_string()).to_string()));
        }
        let records: BTreeMap<i32, &ProcessRecord> = todo.iter().map(|(p, r)| (*p, r)).collect();
        let mut acts = Vec::new();
        for (pid, _) in &threads {
            // Every process comes back running, also one that someone else had paused when it
            // was dumped: whoever paused it has no hold on the restored process, and a restore
            // that reports success leaves nothing paused (CRIU's C plugin does the same).
            let act = Act::Resume {
                pairs: plan.map.pairs().to_vec(),
                unlock: true,
            };
            match g.act(*pid, act) {
                Ok(seq) => {
                    if !parallel {
                        let _ = g.wait_all(&[seq], start + limit, &mut || window.watch());
                    }
                    acts.push((*pid, seq));
                }
                Err(e) => {
                    results.insert(*pid, Err(e.to_string()));
                }
            }
        }
        let seqs: Vec<u64> = acts.iter().map(|(_, s)| *s).collect();
        if let Err(e) = g.wait_all(&seqs, start + limit, &mut || window.watch()) {
            results.insert(root, Err(e.to_string()));
        }
        for e in window.close() {
            tracing::error!("{e}");
        }
        for (pid, seq) in acts {
            let p = records[&pid];
            let who = Who {
                pid,
                comm: p.comm.clone(),
            };
            let outcome = match g.take(seq) {
                Some(Ok(_)) => Ok(()),
                Some(Err(e)) => {
                    let hint = if e.code == cuda_checkpoint_ctl::driver::code::OUT_OF_MEMORY {
                        "; free GPU memory, or restore onto other GPUs with CRIU_GPU_DEVICE_MAP"
                    } else {
                        ""
                    };
                    Err(RestoreError::Action {
                        who,
                        failure: format!("{e}{hint}"),
                    }
                    .to_string())
                }
                None => Err(RestoreError::Action {
                    who,
                    failure: format!(
                        "the GPU restore did not finish within {} s (CRIU_GPU_ACTION_TIMEOUT_S)",
                        limit.as_secs()
                    ),
                }
                .to_string()),
            };
            if outcome.is_ok() && p.initial_state != ProcessState::Running {
                tracing::info!(
                    "CUDA {} was {} by someone else when it was dumped; it is restored running",
                    Who {
                        pid,
                        comm: p.comm.clone()
                    },
                    p.initial_state
                );
            }
            results.insert(pid, outcome);
        }
        let ok = results.values().filter(|r| r.is_ok()).count();
        let bytes: u64 = todo
            .iter()
            .filter(|(pid, _)| results.get(pid).is_some_and(|r| r.is_ok()))
            .flat_map(|(_, p)| p.gpus.iter().filter_map(|u| u.memory))
            .sum();
        let secs = start.elapsed().as_secs_f64();
        tracing::info!(
            "restored CUDA state of {ok} of {} process(es) in {secs:.2} s ({:.2} GiB, {:.2} GB/s)",
            results.len(),
            gib(bytes),
            bytes as f64 / 1e9 / secs.max(1e-9)
        );
        for r in results.values() {
            if let Err(e) = r {
                tracing::error!("{e}");
            }
        }
        results
    }

    /// The guardian of a restore that has not resumed yet (tests).
    #[cfg(test)]
    pub fn guardian(&mut self) -> Option<&mut Guardian> {
        match &mut self.phase {
            Phase::Ready(ready) => Some(&mut ready.guardian),
            _ => None,
        }
    }

    pub fn exit(&mut self) {
        if let Phase::Ready(mut ready) = std::mem::replace(&mut self.phase, Phase::NoCuda) {
            let _ = ready.guardian.order(&Order::Bye);
        }
    }
}

/// Has CRIU let the pages of each process's staging (where its checkpoint put the device memory,
/// which only the driver's restore reads) arrive while the driver already restores: the restore
/// then costs about the longer of CRIU's pages and the driver, not their sum. The project's CRIU
/// only (patch 0007); CRIU puts every page in place before the tasks run either way.
fn overlap(host: &dyn Host, settings: &Settings, img: &CudaImage) -> Result<(), HookError> {
    let bytes = img.staging_bytes();
    if bytes == 0 {
        return Ok(());
    }
    if settings.flag("CRIU_GPU_OVERLAP")? == Some(false) {
        tracing::info!("CRIU_GPU_OVERLAP=0: CRIU puts every page in place before the GPU restore");
        return Ok(());
    }
    let mut asked = 0;
    for p in &img.processes {
        for s in &p.staging {
            match host.defer_pages(p.ns_pid, s.start..s.end) {
                None => {
                    tracing::info!(
                        "this CRIU puts every page in place before the GPU restore (the project's \
                         CRIU overlaps the two)"
                    );
                    return Ok(());
                }
                Some(false) => tracing::warn!(
                    "CRIU refused to let the GPU data of process {} arrive during the GPU \
                     restore; it comes first",
                    p.ns_pid
                ),
                Some(true) => asked += 1,
            }
        }
    }
    tracing::info!(
        "the GPU restore overlaps CRIU's pages: {:.2} GiB of GPU data in {asked} range(s) \
         arrive while the driver restores (CRIU_GPU_OVERLAP=0: one after the other)",
        gib(bytes)
    );
    Ok(())
}

/// The guardian's answer about the pages images it checked while CRIU restored: before the
/// restored tree runs, a damaged one fails the restore (the tree is killed; the images are
/// unchanged). The driver read them meanwhile, as it reads any memory of the process.
fn checked_later(g: &mut Guardian, later: &Later) -> Result<(), String> {
    let limit = Duration::from_secs(120) + Duration::from_secs(2 * later.bytes.div_ceil(1 << 30));
    let start = Instant::now();
    match g.wait_all(&[later.seq], start + limit, &mut || {}) {
        Ok(true) => {}
        Ok(false) => {
            return Err(format!(
                "the pages images ({:.2} GiB) were not checked against their digests within \
                 {limit:?}",
                gib(later.bytes)
            ))
        }
        Err(e) => return Err(e.to_string()),
    }
    match g.take_verified(later.seq) {
        Some(Ok(())) => {
            tracing::info!(
                "pages images checked against their digests while CRIU restored ({:.2} GiB; \
                 waited {:.2} s for the check)",
                gib(later.bytes),
                start.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some(Err(e)) => Err(e),
        None => Err("the guardian did not answer about the pages images".into()),
    }
}
