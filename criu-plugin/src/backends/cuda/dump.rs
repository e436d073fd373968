//! A dump (or pre-dump) of a tree with CUDA processes.
//!
//! The root's PAUSE_DEVICES finds every CUDA process of the tree and locks them all at once,
//! inside what is left of CRIU's seize alarm: ranks of a job wait for each other, so locking one
//! after another can deadlock them. The first CHECKPOINT_DEVICES checks that each process is
//! seized and was not stopped meanwhile, lets the driver threads run and checkpoints all of them
//! at once, with a size-aware limit. `exit` writes the image digests and, unless CRIU kills the
//! tasks after a successful dump, returns every process to its state before the dump. Every
//! driver call goes through the guardian, which does that too if CRIU dies first.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::ProcessState;
use cuda_checkpoint_ctl::inventory::Inventory;
use cuda_checkpoint_ctl::process::Libraries;

use criu_gpu_image::cuda::{self as image, CudaImage, ProcessRecord, Usage};
use criu_gpu_image::{digest, record};

use super::error::{ActionFailure, DumpError, LockFailure, Who};
use super::procs::Procs;
use super::{action_limit, gib, SpawnGuardian, INVENTORY_NAME};
use crate::core::{
    stats, FinalState, HookError, HookResult, Host, Settings, Stage, ThreadWindow, Verdict,
};
use crate::guardian::proto::{Act, Answer, Order, Returned, Watch};
use crate::guardian::{Guardian, GuardianError};

/// CRIU's default --timeout, for a CRIU whose alarm cannot be read.
const DEFAULT_SEIZE: Duration = Duration::from_secs(10);

/// A CUDA process of the dump.
#[derive(Debug, Clone)]
struct Proc {
    who: Who,
    /// The driver's helper thread.
    tid: i32,
    ns_pid: i32,
    /// Its CUDA state before the dump.
    initial: ProcessState,
    nccl: bool,
    usage: Vec<Usage>,
}

/// The tree as the root's PAUSE_DEVICES found it.
#[derive(Default)]
struct Tree {
    /// Every pid seen then: the others answer "not mine" without another look.
    scanned: BTreeSet<i32>,
    cuda: Vec<Proc>,
    /// The answer of the first CHECKPOINT_DEVICES, for the calls after it.
    checkpoint: Option<Result<(), String>>,
    inventory: Option<Inventory>,
}

enum Phase {
    /// Before the root's PAUSE_DEVICES.
    Start,
    Paused(Tree),
}

pub struct Dump {
    ctx: Ctx,
    link: Link,
    required: bool,
    phase: Phase,
    /// What each process of the tree maps, read once.
    libs: BTreeMap<i32, Libraries>,
    /// The tree as `init` found it (root first); CRIU asks for processes forked since one by
    /// one.
    tree: Vec<i32>,
}

/// What the dump knows of its command and machine.
struct Ctx {
    stage: Stage,
    settings: Settings,
    procs: Box<dyn Procs>,
}

/// The guardian, once the tree turned out to hold CUDA processes.
struct Link {
    spawn: SpawnGuardian,
    guardian: Option<Guardian>,
    /// NVML's answer, asked for as the guardian started.
    inventory: Option<u64>,
}

impl Link {
    fn get(&mut self) -> Result<&mut Guardian, HookError> {
        let g = match self.guardian.take() {
            Some(g) => g,
            None => {
                let mut g = (self.spawn)(Watch::Dump)?;
                // NVML's view, asked now: it is ready by the time the checkpoint needs it.
                self.inventory = Some(g.ask_inventory()?);
                g
            }
        };
        Ok(self.guardian.insert(g))
    }

    /// The guardian that probed the tracked processes.
    fn started(&mut self) -> Result<&mut Guardian, HookError> {
        self.guardian
            .as_mut()
            .ok_or(HookError::from(GuardianError::Gone(0)))
    }
}

impl Dump {
    /// Called from `init`: when the tree holds CUDA processes, starts the guardian (loading the
    /// driver takes a while, CRIU goes on meanwhile) and asks CRIU to seize without the freezer
    /// (a frozen process cannot be locked). Trees without CUDA are left exactly as CRIU dumps
    /// them.
    pub fn start(
        host: &dyn Host,
        stage: Stage,
        settings: Settings,
        procs: Box<dyn Procs>,
        spawn: SpawnGuardian,
    ) -> Dump {
        let mut d = Dump {
            ctx: Ctx {
                stage,
                settings,
                procs,
            },
            link: Link {
                spawn,
                guardian: None,
                inventory: None,
            },
            required: false,
            phase: Phase::Start,
            libs: BTreeMap::new(),
            tree: Vec::new(),
        };
        // A record left by an earlier dump into the same directory is not this image's.
        if let Some(dir) = host.image_dir() {
            if std::fs::remove_file(dir.join(image::RECORD)).is_ok() {
                tracing::info!("removed {} of an earlier dump", image::RECORD);
            }
        }
        let Some(root) = host.dump_root() else {
            return d;
        };
        let start = Instant::now();
        d.tree = d.ctx.procs.tree(root);
        stats::scanned(0, start.elapsed());
        let pids = d.tree.clone();
        if d.candidates(&pids).is_empty() {
            return d;
        }
        if stage == Stage::Dump && !host.use_interrupt_only_seizing() {
            tracing::warn!(
                "this CRIU cannot seize without the freezer; CUDA processes in a frozen cgroup \
                 cannot be locked"
            );
        }
        if let Err(e) = d.link.get() {
            // Said again, with the processes, when the tree is paused.
            tracing::debug!("{e}");
        }
        d
    }

    /// The processes among `pids` that map the CUDA driver, with whether they map NCCL.
    fn candidates(&mut self, pids: &[i32]) -> Vec<(i32, bool)> {
        let start = Instant::now();
        let mut out = Vec::new();
        let mut read = 0;
        for &pid in pids {
            let libs = match self.libs.get(&pid) {
                Some(l) => *l,
                None => match self.ctx.procs.libraries(pid).inspect(|_| read += 1) {
                    Ok(l) => *self.libs.entry(pid).or_insert(l),
                    Err(_) => continue,
                },
            };
            if libs.libcuda {
                out.push((pid, libs.nccl));
            }
        }
        stats::scanned(read, start.elapsed());
        out
    }

    pub fn pause(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        let tree = match &mut self.phase {
            Phase::Start => {
                // The first call is for the root: the whole tree is paused now.
                let pids = match self.tree.first() {
                    Some(&root) if root == pid => std::mem::take(&mut self.tree),
                    _ => {
                        let start = Instant::now();
                        let pids = self.ctx.procs.tree(pid);
                        stats::scanned(0, start.elapsed());
                        pids
                    }
                };
                let candidates = self.candidates(&pids);
                self.phase = Phase::Paused(Tree {
                    scanned: pids.iter().copied().collect(),
                    ..Tree::default()
                });
                let budget = host.seize_time_left().unwrap_or(DEFAULT_SEIZE);
                return self.pause_some(host, candidates, pid, budget);
            }
            Phase::Paused(tree) => tree,
        };
        if tree.cuda.iter().any(|p| p.who.pid == pid) {
            return Ok(Verdict::Done(()));
        }
        if !tree.scanned.insert(pid) {
            return Ok(Verdict::NotMine);
        }
        // Forked after the root was paused: paused alone, with what is left of the budget.
        let budget = host.seize_time_left().unwrap_or(DEFAULT_SEIZE);
        let candidates = self.candidates(&[pid]);
        self.pause_some(host, candidates, pid, budget)
    }

    /// Checks which of `candidates` hold CUDA state and that they can be locked, and locks the
    /// running ones at once. The verdict is for `asked`.
    fn pause_some(
        &mut self,
        host: &dyn Host,
        candidates: Vec<(i32, bool)>,
        asked: i32,
        budget: Duration,
    ) -> HookResult {
        let started = Instant::now();
        let margin = (budget / 5).min(Duration::from_millis(1500));
        let deadline = started + budget.saturating_sub(margin);
        let ctx = &self.ctx;
        let procs = &*ctx.procs;
        if candidates.is_empty() {
            return Ok(Verdict::NotMine);
        }
        let all: Vec<Who> = candidates
            .iter()
            .map(|(pid, _)| Who {
                pid: *pid,
                comm: procs.comm(*pid),
            })
            .collect();
        let g = self.link.get()?;
        if let Err(reason) = g.driver()? {
            return Err(HookError::gpu(DumpError::NoDriver {
                processes: all,
                reason: reason.to_owned(),
            }));
        }
        // Which of them hold CUDA state: the driver's restore thread answers at once.
        let probe_until = deadline.min(Instant::now() + Duration::from_secs(2));
        let mut probes = BTreeMap::new();
        for (pid, _) in &candidates {
            g.order(&Order::Track {
                pid: *pid,
                starttime: procs.starttime(*pid).unwrap_or(0),
                comm: procs.comm(*pid),
            })?;
            probes.insert(*pid, g.act(*pid, Act::Probe)?);
        }
        let seqs: Vec<u64> = probes.values().copied().collect();
        g.wait_all(&seqs, probe_until, &mut || {})?;
        let criu = host.criu_pid();
        // (process, restore thread, NCCL)
        let mut cuda: Vec<(Who, i32, bool)> = Vec::new();
        for ((pid, nccl), w) in candidates.iter().zip(all) {
            match g.take(probes[pid]) {
                Some(Ok(Answer::Thread(tid))) => cuda.push((w, tid, *nccl)),
                Some(Err(e)) if e.not_cuda() => {}
                Some(Err(e)) => {
                    return Err(HookError::gpu(DumpError::Checkpoints {
                        failures: vec![(w, ActionFailure::Driver(e))],
                    }))
                }
                _ => return Err(HookError::gpu(DumpError::Busy(w))),
            }
        }
        for (w, tid, _) in &cuda {
            if ctx.stage == Stage::PreDump {
                return Err(HookError::gpu(DumpError::PreDump(w.clone())));
            }
            if crate::abi::criu::lazy_pages() {
                return Err(HookError::gpu(DumpError::LazyPages(w.clone())));
            }
            // The state query, the lock and the checkpoint all need this thread to run: the
            // driver waits for it without limit (measured).
            if let Some(held) = procs.held(w.pid, Some(*tid), criu) {
                return Err(HookError::gpu(DumpError::Held {
                    who: w.clone(),
                    held,
                }));
            }
        }
        let mut states = BTreeMap::new();
        for (w, _, _) in &cuda {
            states.insert(w.pid, g.act(w.pid, Act::State)?);
        }
        let seqs: Vec<u64> = states.values().copied().collect();
        g.wait_all(&seqs, deadline, &mut || {})?;
        let mut found = Vec::new();
        for (w, tid, nccl) in cuda {
            let state = match g.take(states[&w.pid]) {
                Some(Ok(Answer::State(s))) => s,
                Some(Err(e)) => {
                    return Err(HookError::gpu(DumpError::Checkpoints {
                        failures: vec![(w, ActionFailure::Driver(e))],
                    }))
                }
                // GetState waits while another action is pending on the process.
                _ => {
                    return Err(HookError::gpu(match procs.held(w.pid, Some(tid), criu) {
                        Some(held) => DumpError::Held { who: w, held },
                        None => DumpError::Busy(w),
                    }))
                }
            };
            match state {
                ProcessState::Running => {}
                ProcessState::Locked | ProcessState::Checkpointed => tracing::warn!(
                    "CUDA {w} is already {state}: someone else paused it (a CRIU that died, a \
                     concurrent dump, cuda-checkpoint); it is dumped as it is and left {state} \
                     here (a restore of this image runs it). If nobody else is checkpointing it, \
                     run `cuda-checkpoint-ctl --recover --pid {}` once this dump is done",
                    w.pid
                ),
                other => {
                    return Err(HookError::gpu(DumpError::Unusable {
                        who: w,
                        state: other,
                    }))
                }
            }
            found.push(Proc {
                ns_pid: procs.ns_pid(w.pid).unwrap_or(w.pid),
                who: w,
                tid,
                initial: state,
                nccl,
                usage: Vec::new(),
            });
        }
        if !found.is_empty() && !self.required {
            self.required = host.require_on_restore(INVENTORY_NAME);
        }
        let result = ctx.lock(g, &found, deadline, started + budget);
        stats::gpu_work(started.elapsed());
        if let Phase::Paused(tree) = &mut self.phase {
            tree.cuda.extend(found.iter().cloned());
        }
        result?;
        Ok(if found.iter().any(|p| p.who.pid == asked) {
            Verdict::Done(())
        } else {
            Verdict::NotMine
        })
    }
}

impl Ctx {
    /// Locks the running processes of `found` at once, within `deadline` (the driver's own
    /// timeout) and `hard` (CRIU's alarm).
    fn lock(
        &self,
        g: &mut Guardian,
        found: &[Proc],
        deadline: Instant,
        hard: Instant,
    ) -> Result<(), HookError> {
        let running: Vec<&Proc> = found
            .iter()
            .filter(|p| p.initial == ProcessState::Running)
            .collect();
        if running.is_empty() {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left < Duration::from_millis(100) {
            return Err(HookError::gpu(DumpError::NoTime { left }));
        }
        let timeout = match self.settings.millis("CRIU_GPU_LOCK_TIMEOUT_MS")? {
            Some(want) if want > left => {
                tracing::warn!(
                    "CRIU_GPU_LOCK_TIMEOUT_MS={} is more than criu's seize time leaves ({} ms): \
                     locks wait {} ms; raise criu --timeout to let them wait longer",
                    want.as_millis(),
                    left.as_millis(),
                    left.as_millis()
                );
                left
            }
            Some(want) => want,
            None => left,
        };
        let parallel = self.settings.flag("CRIU_GPU_PARALLEL")?.unwrap_or(true);
        let start = Instant::now();
        // Past the driver's own timeout the call is stuck (a driver thread that stopped).
        let wait_until = (start + timeout + Duration::from_millis(300)).min(hard);
        let ms = timeout.as_millis().clamp(1, u32::MAX as u128) as u32;
        let mut seqs = Vec::new();
        for p in &running {
            let seq = g.act(p.who.pid, Act::Lock { timeout_ms: ms })?;
            if !parallel {
                g.wait_all(&[seq], wait_until, &mut || {})?;
            }
            seqs.push(seq);
        }
        g.wait_all(&seqs, wait_until, &mut || {})?;
        let mut failures = Vec::new();
        for (p, seq) in running.iter().zip(&seqs) {
            let failure = match g.take(*seq) {
                Some(Ok(_)) => continue,
                Some(Err(e)) if e.lock_gave_up() => LockFailure::GaveUp {
                    waited: timeout,
                    nccl: p.nccl,
                },
                Some(Err(e)) => LockFailure::Driver(e),
                None => LockFailure::Stuck {
                    waited: start.elapsed(),
                },
            };
            failures.push((p.who.clone(), failure));
        }
        if !failures.is_empty() {
            return Err(HookError::gpu(DumpError::Locks { failures }));
        }
        tracing::info!(
            "locked {} CUDA process(es) {} in {:.1} ms",
            running.len(),
            if parallel {
                "at once"
            } else {
                "one after another (CRIU_GPU_PARALLEL=0)"
            },
            start.elapsed().as_secs_f64() * 1e3
        );
        let left = hard.saturating_duration_since(Instant::now());
        if left < Duration::from_secs(2) {
            tracing::warn!(
                "the GPU locks took most of criu's seize time ({} ms left to seize the tree); if \
                 criu reports \"Timeout reached\", the GPU locks took it: raise criu --timeout",
                left.as_millis()
            );
        }
        Ok(())
    }
}

impl Dump {
    pub fn checkpoint(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        let Phase::Paused(tree) = &mut self.phase else {
            return Ok(Verdict::NotMine);
        };
        if !tree.cuda.iter().any(|p| p.who.pid == pid) {
            return Ok(Verdict::NotMine);
        }
        if let Some(done) = &tree.checkpoint {
            return done.clone().map(Verdict::Done).map_err(HookError::Backend);
        }
        let result = self.checkpoint_all(host);
        if let Phase::Paused(tree) = &mut self.phase {
            tree.checkpoint = Some(result.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        }
        result.map(Verdict::Done)
    }

    fn checkpoint_all(&mut self, host: &dyn Host) -> Result<(), HookError> {
        let criu = host.criu_pid();
        let Phase::Paused(tree) = &mut self.phase else {
            return Ok(());
        };
        let inventory_seq = self.link.inventory.take();
        let g = self.link.started()?;
        let procs = &*self.ctx.procs;
        for p in &tree.cuda {
            if procs.tracer(p.who.pid) != criu {
                return Err(HookError::gpu(DumpError::NotSeized(p.who.clone())));
            }
            if let Some(signal) = host.threads().seized_stop_signal(p.who.pid) {
                return Err(HookError::gpu(DumpError::StoppedDuringDump {
                    who: p.who.clone(),
                    signal,
                }));
            }
            if let Some(held @ super::error::Held::Frozen { .. }) =
                procs.held(p.who.pid, Some(p.tid), criu)
            {
                return Err(HookError::gpu(DumpError::Held {
                    who: p.who.clone(),
                    held,
                }));
            }
        }
        // NVML's answer (asked when the guardian started): GPU memory per process, all GPUs.
        if let Some(seq) = inventory_seq {
            let within = Instant::now() + Duration::from_secs(10);
            g.wait_all(&[seq], within, &mut || {})?;
            match g.take_inventory(seq) {
                Some(Ok(inv)) => tree.inventory = Some(inv),
                Some(Err(e)) => tracing::info!("NVML unavailable, GPU usage not recorded: {e}"),
                None => tracing::info!("NVML did not answer in 10 s; GPU usage not recorded"),
            }
        }
        if let Some(inv) = &tree.inventory {
            for p in &mut tree.cuda {
                p.usage = inv
                    .usage_of(p.who.pid)
                    .into_iter()
                    .map(|u| Usage {
                        uuid: u.gpu,
                        memory: u.memory,
                    })
                    .collect();
            }
        }
        let todo: Vec<&Proc> = tree
            .cuda
            .iter()
            .filter(|p| p.initial != ProcessState::Checkpointed)
            .collect();
        let bytes: u64 = todo
            .iter()
            .flat_map(|p| p.usage.iter().filter_map(|u| u.memory))
            .sum();
        let settings = &self.ctx.settings;
        let limit = action_limit(settings, tree.inventory.is_some().then_some(bytes))?;
        let parallel = settings.flag("CRIU_GPU_PARALLEL")?.unwrap_or(true);
        let start = Instant::now();
        let threads: Vec<(i32, i32)> = todo.iter().map(|p| (p.who.pid, p.tid)).collect();
        let (mut window, failed) = ThreadWindow::open(host.threads(), &threads);
        if !failed.is_empty() {
            let why: Vec<String> = failed.iter().map(|e| e.to_string()).collect();
            return Err(HookError::gpu(DumpError::Threads(why.join("; "))));
        }
        let until = start + limit;
        let mut seqs = Vec::new();
        for p in &todo {
            let seq = g.act(p.who.pid, Act::Checkpoint)?;
            if !parallel {
                g.wait_all(&[seq], until, &mut || window.watch())?;
            }
            seqs.push(seq);
        }
        g.wait_all(&seqs, until, &mut || window.watch())?;
        let stopped = window.stop_signal();
        for e in window.close() {
            tracing::error!("{e}");
        }
        if let Some((pid, signal)) = stopped {
            let who = Who {
                pid,
                comm: procs.comm(pid),
            };
            return Err(HookError::gpu(DumpError::StoppedDuringDump { who, signal }));
        }
        let mut failures = Vec::new();
        for (p, seq) in todo.iter().zip(&seqs) {
            let failure = match g.take(*seq) {
                Some(Ok(_)) => continue,
                Some(Err(e)) if e.code == cuda_checkpoint_ctl::driver::code::OPERATING_SYSTEM => {
                    ActionFailure::Died
                }
                Some(Err(e)) => ActionFailure::Driver(e),
                None => ActionFailure::Stuck { limit },
            };
            failures.push((p.who.clone(), failure));
        }
        if !failures.is_empty() {
            return Err(HookError::gpu(DumpError::Checkpoints { failures }));
        }
        let secs = start.elapsed().as_secs_f64();
        tracing::info!(
            "checkpointed {} CUDA process(es), {:.2} GiB of device memory, in {secs:.2} s \
             ({:.2} GB/s)",
            todo.len(),
            gib(bytes),
            bytes as f64 / 1e9 / secs.max(1e-9)
        );
        self.write_record(host, Vec::new())?;
        Ok(())
    }

    fn record(&self) -> Option<CudaImage> {
        let Phase::Paused(tree) = &self.phase else {
            return None;
        };
        let driver = self.link.guardian.as_ref()?.loaded().ok()?.clone();
        Some(CudaImage {
            driver,
            driver_version: tree.inventory.as_ref().map(|i| i.driver_version.clone()),
            gpus: tree
                .inventory
                .as_ref()
                .map(|i| i.gpus.clone())
                .unwrap_or_default(),
            processes: tree
                .cuda
                .iter()
                .map(|p| ProcessRecord {
                    ns_pid: p.ns_pid,
                    pid: p.who.pid,
                    comm: p.who.comm.clone(),
                    initial_state: p.initial,
                    gpus: p.usage.clone(),
                    nccl: p.nccl,
                })
                .collect(),
            digests: Vec::new(),
            tree: tree
                .scanned
                .iter()
                .filter_map(|p| self.ctx.procs.ns_pid(*p))
                .collect(),
        })
    }

    fn write_record(
        &self,
        host: &dyn Host,
        digests: Vec<digest::FileDigest>,
    ) -> Result<(), HookError> {
        let (Some(mut img), Some(dir)) = (self.record(), host.image_dir()) else {
            return Ok(());
        };
        img.digests = digests;
        record::write(&dir, image::RECORD, image::FORMAT, image::VERSION, &img)?;
        Ok(())
    }

    pub fn exit(&mut self, host: &dyn Host, success: bool) {
        let touched = matches!(&self.phase, Phase::Paused(t) if !t.cuda.is_empty());
        if touched {
            if success {
                self.record_digests(host);
            }
            let tasks_die = success && host.final_state() == Some(FinalState::Dead);
            if tasks_die {
                tracing::info!(
                    "dump done; the CUDA processes end with the tree, their state is in the images"
                );
                if let Some(g) = &mut self.link.guardian {
                    let _ = g.order(&Order::Commit);
                }
            } else {
                tracing::info!(
                    "{}: returning the CUDA processes to their state before the dump",
                    if success {
                        "the tasks keep running"
                    } else {
                        "the dump failed"
                    }
                );
                self.roll_back(host);
            }
        }
        if let Some(mut g) = self.link.guardian.take() {
            let _ = g.order(&Order::Bye);
        }
    }

    /// Rewrites the record with digests of the image files, now that CRIU wrote them all.
    fn record_digests(&self, host: &dyn Host) {
        if self.ctx.settings.flag("CRIU_GPU_DIGESTS").ok().flatten() == Some(false) {
            return;
        }
        let Some(dir) = host.image_dir() else { return };
        let start = Instant::now();
        let digests = digest::image_files(&dir)
            .map_err(|e| e.to_string())
            .and_then(|names| digest::digest(&dir, &names).map_err(|e| e.to_string()));
        match digests {
            Ok(d) => {
                let bytes: u64 = d.iter().map(|f| f.size).sum();
                let n = d.len();
                match self.write_record(host, d) {
                    Ok(()) => tracing::info!(
                        "recorded digests of {n} image files ({:.2} GiB) in {:.2} s",
                        gib(bytes),
                        start.elapsed().as_secs_f64()
                    ),
                    Err(e) => tracing::warn!("image digests not recorded: {e}"),
                }
            }
            Err(e) => tracing::warn!(
                "image digests not recorded ({e}): a restore cannot check the images"
            ),
        }
    }

    fn roll_back(&mut self, host: &dyn Host) {
        let Phase::Paused(tree) = &self.phase else {
            return;
        };
        let Some(g) = self.link.guardian.as_mut() else {
            return;
        };
        let bytes: u64 = tree
            .cuda
            .iter()
            .flat_map(|p| p.usage.iter().filter_map(|u| u.memory))
            .sum();
        let limit = action_limit(&self.ctx.settings, (bytes > 0).then_some(bytes))
            .unwrap_or(Duration::from_secs(600));
        let threads: Vec<(i32, i32)> = tree.cuda.iter().map(|p| (p.who.pid, p.tid)).collect();
        let start = Instant::now();
        let (mut window, failed) = ThreadWindow::open(host.threads(), &threads);
        for e in failed {
            tracing::error!("{e}");
        }
        let settled = g.order(&Order::RollBack).and_then(|()| {
            g.wait_until(start + limit, &mut || window.watch(), &|g| g.has_settled())
        });
        drop(window);
        match (settled, g.take_settled()) {
            (Ok(true), Some(outcomes)) => {
                for o in &outcomes {
                    match &o.result {
                        Ok(Returned::To(_) | Returned::Untouched) => {
                            tracing::info!(pid = o.pid, "{}", o.line())
                        }
                        Ok(Returned::Gone) => tracing::warn!("{}", o.line()),
                        Err(_) => tracing::error!("{}", o.line()),
                    }
                }
                tracing::info!("rollback took {:.2} s", start.elapsed().as_secs_f64());
            }
            (Err(e), _) => tracing::error!("{e}"),
            _ => tracing::error!(
                "the CUDA processes were not all back within {} s; the guardian (pid {}) goes on \
                 returning them once CRIU lets them go, and logs to syslog and {} in the image \
                 directory",
                limit.as_secs(),
                g.pid(),
                crate::guardian::machine::LOG_FILE
            ),
        }
    }
}
