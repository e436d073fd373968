//! The first CHECKPOINT_DEVICES: every CUDA process of the tree checkpointed at once, after
//! checking that each is seized by CRIU and was not stopped since its lock.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::ProcessState;
use cuda_checkpoint_ctl::process::maps;

use criu_gpu_image::cuda::{Span, Usage};
use criu_gpu_image::thp::{Raised, Want};

use super::{Dump, Phase, Proc};
use crate::backends::cuda::error::{ActionFailure, DumpError, Held, Who};
use crate::backends::cuda::{action_limit, gib};
use crate::core::{HookError, HookResult, Host, ThreadWindow, Verdict};
use crate::guardian::proto::{Act, Order};
use crate::guardian::Guardian;

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
            if let Some(held @ Held::Frozen { .. }) = procs.held(p.who.pid, Some(p.tid), criu) {
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
        let thp = settings
            .parsed("CRIU_GPU_THP", |v| v.parse::<Want>())?
            .unwrap_or_default();
        raise_thp(g, thp)?;
        // What plain memory each process has now: the checkpoint adds its staging to it.
        let before: BTreeMap<i32, std::io::Result<Vec<Range<u64>>>> = todo
            .iter()
            .map(|p| (p.who.pid, procs.anon_writable(p.who.pid)))
            .collect();
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
        if thp != Want::Off {
            let _ = g.order(&Order::LowerThp);
        }
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
        let count = todo.len();
        for p in &mut tree.cuda {
            // Unknown on either side: none (a restore then reads all pages first).
            if let (Some(Ok(before)), Ok(after)) =
                (before.get(&p.who.pid), procs.anon_writable(p.who.pid))
            {
                p.staging = maps::added(before, &after)
                    .into_iter()
                    .map(|r| Span {
                        start: r.start,
                        end: r.end,
                    })
                    .collect();
            }
        }
        tracing::info!(
            "checkpointed {} CUDA process(es), {:.2} GiB of device memory, in {secs:.2} s \
             ({:.2} GB/s)",
            count,
            gib(bytes),
            bytes as f64 / 1e9 / secs.max(1e-9)
        );
        self.write_record(host, Vec::new())?;
        Ok(())
    }
}

/// Has the guardian raise the node's huge page policy for the checkpoint (the driver fills fresh
/// memory of each process; faulting in 4 KiB pages is most of its time). Failing to raise it
/// only costs speed: a warning, not an error.
fn raise_thp(g: &mut Guardian, want: Want) -> Result<(), HookError> {
    if want == Want::Off {
        return Ok(());
    }
    let seq = g.raise_thp(want)?;
    g.wait_until(Instant::now() + Duration::from_secs(2), &mut || {}, &|g| {
        g.has(seq)
    })?;
    match g.take_thp(seq) {
        Some(Ok(Raised::From(p))) => tracing::info!(
            "transparent huge pages at always for the GPU checkpoint (the node's policy, {p}, is \
             put back after it)"
        ),
        Some(Ok(Raised::Untouched(p))) => {
            tracing::debug!("transparent huge pages left at {p} (CRIU_GPU_THP={want:?})")
        }
        Some(Err(e)) => tracing::warn!(
            "transparent huge pages could not be raised for the GPU checkpoint ({e}); it runs \
             slower"
        ),
        None => tracing::warn!("the guardian did not answer about transparent huge pages"),
    }
    Ok(())
}
