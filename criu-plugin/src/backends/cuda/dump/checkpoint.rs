//! The first CHECKPOINT_DEVICES: every CUDA process of the tree checkpointed at once, after
//! checking that each is seized by CRIU and was not stopped since its lock.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::ProcessState;
use process_facts::process::maps;

use criu_gpu_host::thp::{Raised, Want};
use criu_gpu_image::cuda::{Span, Usage};

use super::{Ctx, Dump, Phase, Proc, Tree};
use crate::backends::cuda::error::{ActionFailure, DumpError, Held, Who};
use crate::backends::cuda::gib;
use crate::backends::cuda::settings::action_limit;
use crate::core::stats;
use crate::core::{HookError, HookResult, Host, ThreadWindow, Verdict};
use crate::guardian::proto::{Act, Answer, Order};
use crate::guardian::{Guardian, Ticket};

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
        let Phase::Paused(tree) = &mut self.phase else {
            return Ok(());
        };
        self.ctx.still_seized(host, &tree.cuda)?;
        let within = Instant::now() + Duration::from_secs(10);
        if !self.link.inventory_into(tree, within)? && self.link.inventory.is_some() {
            tracing::info!("NVML did not answer in 10 s; GPU usage not recorded");
        }
        usage(tree);
        let g = self.link.started()?;
        let ctx = &self.ctx;
        let todo: Vec<&Proc> = tree
            .cuda
            .iter()
            .filter(|p| p.initial != ProcessState::Checkpointed)
            .collect();
        let bytes: u64 = todo
            .iter()
            .flat_map(|p| p.usage.iter().filter_map(|u| u.memory))
            .sum();
        let run = ctx.how(tree.inventory.is_some().then_some(bytes))?;
        raise_thp(g, run.thp)?;
        // What plain memory each process has now: the checkpoint adds its staging to it.
        let before: BTreeMap<i32, std::io::Result<Vec<Range<u64>>>> = todo
            .iter()
            .map(|p| (p.who.pid, ctx.procs.anon_writable(p.who.pid)))
            .collect();
        let start = Instant::now();
        ctx.checkpoint_each(host, g, &todo, &run)?;
        // A process killed during its checkpoint: whatever the driver answered, it is gone.
        ctx.none_ended(&tree.cuda)?;
        let secs = start.elapsed().as_secs_f64();
        let count = todo.len();
        stats::phase("checkpoint", start.elapsed(), count, bytes);
        ctx.find_staging(&mut tree.cuda, &before);
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

/// How the checkpoints run (from the settings).
struct Run {
    limit: Duration,
    parallel: bool,
    thp: Want,
}

impl Ctx {
    /// Each process is still CRIU's, and was not stopped or frozen since its lock (a stopped
    /// CUDA process would be restored into a wait that never ends).
    fn still_seized(&self, host: &dyn Host, cuda: &[Proc]) -> Result<(), HookError> {
        let criu = host.criu_pid();
        let procs = &*self.procs;
        self.none_ended(cuda)?;
        for p in cuda {
            let who = p.who.clone();
            if procs.tracer(p.who.pid) != criu {
                return Err(HookError::gpu(DumpError::NotSeized(who)));
            }
            if let Some(signal) = host.threads().seized_stop_signal(p.who.pid) {
                return Err(HookError::gpu(DumpError::StoppedDuringDump { who, signal }));
            }
            if let Some(held @ Held::Frozen { .. }) = procs.held(p.who.pid, Some(p.tid), criu) {
                return Err(HookError::gpu(DumpError::Held { who, held }));
            }
        }
        Ok(())
    }

    /// No process ended since its lock (killed, or out of memory): CRIU would dump it as a
    /// zombie, and the job come back without it.
    fn none_ended(&self, cuda: &[Proc]) -> Result<(), HookError> {
        match cuda.iter().find(|p| self.procs.dying(p.who.pid)) {
            Some(p) => Err(HookError::gpu(DumpError::EndedDuringDump(p.who.clone()))),
            None => Ok(()),
        }
    }

    /// The limit for checkpointing `bytes` of device memory, all at once or not, and the huge
    /// page policy meanwhile.
    fn how(&self, bytes: Option<u64>) -> Result<Run, HookError> {
        let settings = self.settings()?;
        Ok(Run {
            limit: action_limit(settings.action_timeout, bytes),
            parallel: settings.parallel,
            thp: settings.thp,
        })
    }

    /// Lets the driver threads of `todo` run and checkpoints each, all at once unless
    /// CRIU_GPU_PARALLEL=0; the huge page policy is put back after.
    fn checkpoint_each(
        &self,
        host: &dyn Host,
        g: &mut Guardian,
        todo: &[&Proc],
        run: &Run,
    ) -> Result<(), HookError> {
        let threads: Vec<(i32, i32)> = todo.iter().map(|p| (p.who.pid, p.tid)).collect();
        let until = Instant::now() + run.limit;
        let (mut window, failed) = ThreadWindow::open(host.threads(), &threads);
        if !failed.is_empty() {
            let why: Vec<String> = failed.iter().map(|e| e.to_string()).collect();
            return Err(HookError::gpu(DumpError::Threads(why.join("; "))));
        }
        let mut seqs = Vec::new();
        for p in todo {
            let seq = g.act(p.who.pid, Act::Checkpoint)?;
            if !run.parallel {
                g.wait_all(&[seq], until, &mut || window.watch())?;
            }
            seqs.push(seq);
        }
        g.wait_all(&seqs, until, &mut || window.watch())?;
        if run.thp != Want::Off {
            let _ = g.order(&Order::LowerThp);
        }
        let stopped = window.stop_signal();
        for e in window.close() {
            tracing::error!("{e}");
        }
        if let Some((pid, signal)) = stopped {
            let who = Who {
                pid,
                comm: self.procs.comm(pid),
            };
            return Err(HookError::gpu(DumpError::StoppedDuringDump { who, signal }));
        }
        let failures = failures(g, todo, &seqs, run.limit);
        if !failures.is_empty() {
            return Err(HookError::gpu(DumpError::Checkpoints { failures }));
        }
        Ok(())
    }

    /// Where each checkpoint put the device memory: the plain memory it added (none where
    /// either side is unknown: a restore then reads all pages first).
    fn find_staging(
        &self,
        cuda: &mut [Proc],
        before: &BTreeMap<i32, std::io::Result<Vec<Range<u64>>>>,
    ) {
        for p in cuda {
            if let (Some(Ok(before)), Ok(after)) =
                (before.get(&p.who.pid), self.procs.anon_writable(p.who.pid))
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
    }
}

/// Each process's GPU memory, as NVML answered (asked when the guardian started).
fn usage(tree: &mut Tree) {
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
}

/// The checkpoints of `todo` (asked as `seqs`) that failed, and why.
fn failures(
    g: &mut Guardian,
    todo: &[&Proc],
    seqs: &[Ticket<Answer>],
    limit: Duration,
) -> Vec<(Who, ActionFailure)> {
    let mut failures = Vec::new();
    for (p, seq) in todo.iter().zip(seqs) {
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
    failures
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
    match g.take(seq) {
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
