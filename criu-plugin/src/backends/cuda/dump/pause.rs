//! The root's PAUSE_DEVICES: which processes of the tree hold CUDA state, whether each can be
//! locked (its driver thread free to run, not paused by someone else in a way the plugin cannot
//! undo), and the locks of all of them at once, inside what is left of CRIU's seize alarm.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::ProcessState;
use process_facts::refusal::{self, DeviceMemory};

use super::{Ctx, Dump, Phase, Proc, Tree};
use crate::backends::cuda::error::{ActionFailure, DumpError, Who};
use crate::backends::cuda::INVENTORY_NAME;
use crate::core::{stats, HookError, HookResult, Host, Lazy, Stage, Verdict};
use crate::guardian::proto::{Act, Answer, Order};
use crate::guardian::{Guardian, Ticket};

/// How long the driver may take to name the restore threads (it answers at once).
const PROBE_WAIT: Duration = Duration::from_secs(2);
/// The longest the locks wait for NVML's answer (asked as the guardian started), to check host
/// memory; at most a quarter of the seize budget.
const NVML_WAIT: Duration = Duration::from_secs(5);

/// A process that holds CUDA state: the driver named its restore thread.
struct Holder {
    who: Who,
    /// The driver's helper thread.
    tid: i32,
    nccl: bool,
}

impl Dump {
    /// Checks which of `candidates` hold CUDA state and that they can be locked, and locks the
    /// running ones at once. The verdict is for `asked`.
    pub(super) fn pause_some(
        &mut self,
        host: &dyn Host,
        candidates: Vec<(i32, bool)>,
        asked: i32,
        budget: Duration,
    ) -> HookResult {
        let started = Instant::now();
        let margin = (budget / 5).min(Duration::from_millis(1500));
        let deadline = started + budget.saturating_sub(margin);
        if candidates.is_empty() {
            return Ok(Verdict::NotMine);
        }
        let ctx = &self.ctx;
        let g = self.link.get()?;
        let holders = ctx.holders(g, &candidates, deadline)?;
        ctx.refuse(host, &holders)?;
        let found = ctx.initial_states(g, host.criu_pid(), holders, deadline)?;
        let nvml_until = deadline.min(Instant::now() + (budget / 4).min(NVML_WAIT));
        self.refuse_short_memory(&found, nvml_until)?;
        let (ctx, g) = (&self.ctx, self.link.started()?);
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

    /// Refuses the dump, before any lock, when host memory cannot take the device memory of
    /// `found` and of the processes paused before them, as NVML counts it (asked as the guardian
    /// started; waited for until `until`).
    fn refuse_short_memory(&mut self, found: &[Proc], until: Instant) -> Result<(), HookError> {
        let Phase::Paused(tree) = &mut self.phase else {
            return Ok(());
        };
        let start = Instant::now();
        if !self.link.inventory_into(tree, until)? {
            if self.link.inventory.is_some() {
                tracing::info!(
                    "NVML has not answered yet: host memory was not checked before the locks"
                );
            }
            return Ok(());
        }
        let waited = start.elapsed();
        if waited > Duration::from_millis(1) {
            tracing::info!(
                "waited {:.0} ms for NVML's count of the processes' GPU memory, to check host \
                 memory before the locks",
                waited.as_secs_f64() * 1e3
            );
        }
        self.ctx.host_memory(tree, found)
    }
}

impl Ctx {
    /// Which of `candidates` hold CUDA state: the driver's restore thread answers at once. A
    /// driver that cannot be loaded refuses them all.
    fn holders(
        &self,
        g: &mut Guardian,
        candidates: &[(i32, bool)],
        deadline: Instant,
    ) -> Result<Vec<Holder>, HookError> {
        let procs = &*self.procs;
        let all: Vec<Who> = candidates
            .iter()
            .map(|(pid, _)| Who {
                pid: *pid,
                comm: procs.comm(*pid),
            })
            .collect();
        if let Err(reason) = g.driver()? {
            return Err(HookError::gpu(DumpError::NoDriver {
                processes: all,
                reason: reason.to_owned(),
            }));
        }
        let probe_until = deadline.min(Instant::now() + PROBE_WAIT);
        let mut probes = Vec::new();
        for (pid, _) in candidates {
            g.order(&Order::Track {
                pid: *pid,
                starttime: procs.starttime(*pid).unwrap_or(0),
                comm: procs.comm(*pid),
            })?;
            probes.push(g.act(*pid, Act::Probe)?);
        }
        g.wait_all(&probes, probe_until, &mut || {})?;
        let mut holders = Vec::new();
        for (((_, nccl), who), seq) in candidates.iter().zip(all).zip(probes) {
            match g.take(seq) {
                Some(Ok(Answer::Thread(tid))) => holders.push(Holder {
                    who,
                    tid,
                    nccl: *nccl,
                }),
                Some(Err(e)) if e.not_cuda() => {}
                Some(Err(e)) => return Err(failed(who, e)),
                _ => return Err(HookError::gpu(DumpError::Busy(who))),
            }
        }
        Ok(holders)
    }

    /// What is refused before any lock: NCCL transports that cannot be restored, pre-dump,
    /// lazy pages, a process whose driver thread cannot run.
    fn refuse(&self, host: &dyn Host, holders: &[Holder]) -> Result<(), HookError> {
        let procs = &*self.procs;
        if self.settings()?.nccl_check {
            let ranks: Vec<(i32, String)> = holders
                .iter()
                .filter(|h| h.nccl)
                .map(|h| (h.who.pid, h.who.comm.clone()))
                .collect();
            if let Some(refusal) = procs.nccl(&ranks) {
                return Err(HookError::gpu(DumpError::Refused(refusal)));
            }
        }
        let criu = host.criu_pid();
        for h in holders {
            if self.stage == Stage::PreDump {
                return Err(HookError::gpu(DumpError::PreDump(h.who.clone())));
            }
            if host.lazy() == Lazy::PostCopy {
                return Err(HookError::gpu(DumpError::LazyPages(h.who.clone())));
            }
            // The state query, the lock and the checkpoint all need this thread to run: the
            // driver waits for it without limit (measured).
            if let Some(held) = procs.held(h.who.pid, Some(h.tid), criu) {
                let who = h.who.clone();
                return Err(HookError::gpu(DumpError::Held { who, held }));
            }
        }
        Ok(())
    }

    /// The rule set's `host_memory` over the CUDA processes of the tree: host memory must take
    /// the device memory of all of them at once. Processes already checkpointed by someone else
    /// hold theirs in host memory already.
    fn host_memory(&self, tree: &Tree, found: &[Proc]) -> Result<(), HookError> {
        let Some(inv) = &tree.inventory else {
            return Ok(());
        };
        let processes: Vec<DeviceMemory> = tree
            .cuda
            .iter()
            .chain(found)
            .filter(|p| p.initial != ProcessState::Checkpointed)
            .map(|p| DeviceMemory {
                pid: p.who.pid,
                comm: p.who.comm.clone(),
                bytes: inv
                    .usage_of(p.who.pid)
                    .iter()
                    .filter_map(|u| u.memory)
                    .sum(),
            })
            .collect();
        let pids: Vec<i32> = processes.iter().map(|p| p.pid).collect();
        match refusal::host_memory(&processes, &self.procs.room(&pids)) {
            Some(r) => Err(HookError::gpu(DumpError::Refused(r))),
            None => Ok(()),
        }
    }

    /// Each holder's CUDA state before the dump, asked of the driver for all at once: the
    /// processes of the dump.
    fn initial_states(
        &self,
        g: &mut Guardian,
        criu: i32,
        holders: Vec<Holder>,
        deadline: Instant,
    ) -> Result<Vec<Proc>, HookError> {
        let mut states = BTreeMap::new();
        for h in &holders {
            states.insert(h.who.pid, g.act(h.who.pid, Act::State)?);
        }
        let seqs: Vec<_> = states.values().copied().collect();
        g.wait_all(&seqs, deadline, &mut || {})?;
        let mut found = Vec::new();
        for h in holders {
            let state = self.initial_state(g, states[&h.who.pid], &h, criu)?;
            found.push(Proc {
                ns_pid: self.procs.ns_pid(h.who.pid).unwrap_or(h.who.pid),
                who: h.who,
                tid: h.tid,
                initial: state,
                nccl: h.nccl,
                usage: Vec::new(),
                staging: Vec::new(),
            });
        }
        Ok(found)
    }

    /// The driver's answer `seq` about `h`'s state: running, or paused by someone else (dumped as
    /// it is, with a warning); anything else is refused.
    fn initial_state(
        &self,
        g: &mut Guardian,
        seq: Ticket<Answer>,
        h: &Holder,
        criu: i32,
    ) -> Result<ProcessState, HookError> {
        let w = &h.who;
        let state = match g.take(seq) {
            Some(Ok(Answer::State(s))) => s,
            Some(Err(e)) => return Err(failed(w.clone(), e)),
            // GetState waits while another action is pending on the process.
            _ => {
                return Err(HookError::gpu(
                    match self.procs.held(w.pid, Some(h.tid), criu) {
                        Some(held) => DumpError::Held {
                            who: w.clone(),
                            held,
                        },
                        None => DumpError::Busy(w.clone()),
                    },
                ))
            }
        };
        match state {
            ProcessState::Running => {}
            ProcessState::Locked | ProcessState::Checkpointed => tracing::warn!(
                "CUDA {w} is already {state}: someone else paused it (a CRIU that died, a \
                 concurrent dump, cuda-checkpoint); it is dumped as it is and left {state} here \
                 (a restore of this image runs it). If nobody else is checkpointing it, run \
                 `cuda-checkpoint-ctl --recover --pid {}` once this dump is done",
                w.pid
            ),
            other => {
                return Err(HookError::gpu(DumpError::Unusable {
                    who: w.clone(),
                    state: other,
                }))
            }
        }
        Ok(state)
    }
}

/// A driver call about `who` failed.
fn failed(who: Who, e: crate::guardian::proto::DriverFailure) -> HookError {
    HookError::gpu(DumpError::Checkpoints {
        failures: vec![(who, ActionFailure::Driver(e))],
    })
}
