//! The root's PAUSE_DEVICES: which processes of the tree hold CUDA state, whether each can be
//! locked (its driver thread free to run, not paused by someone else in a way the plugin cannot
//! undo), and the locks of all of them at once, inside what is left of CRIU's seize alarm.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::ProcessState;

use super::{Dump, Phase, Proc};
use crate::backends::cuda::error::{ActionFailure, DumpError, Who};
use crate::backends::cuda::INVENTORY_NAME;
use crate::core::{stats, HookError, HookResult, Host, Stage, Verdict};
use crate::guardian::proto::{Act, Answer, Order};

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
        if ctx.settings.flag("CRIU_GPU_NCCL_CHECK")? != Some(false) {
            let ranks: Vec<(i32, String)> = cuda
                .iter()
                .filter(|c| c.2)
                .map(|c| (c.0.pid, c.0.comm.clone()))
                .collect();
            if let Some(refusal) = procs.nccl(&ranks) {
                return Err(HookError::gpu(DumpError::Refused(refusal)));
            }
        }
        for (w, tid, _) in &cuda {
            if ctx.stage == Stage::PreDump {
                return Err(HookError::gpu(DumpError::PreDump(w.clone())));
            }
            if host.lazy_pages() {
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
                staging: Vec::new(),
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
