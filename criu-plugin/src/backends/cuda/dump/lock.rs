//! The locks of a dump: every running CUDA process of the tree, inside what is left of CRIU's
//! seize alarm. NCCL ranks wait for each other on the GPU, so they are locked in rounds until one
//! round locks them all at once (`cuda_checkpoint_ctl::ops::rounds`); any other set is locked at
//! once, each lock waiting as long as the time allows (CRIU_GPU_LOCK_TIMEOUT_MS to bound it).

use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::ProcessState;
use cuda_checkpoint_ctl::ops::rounds::{
    self, Attempt, Either, Jitter, Locker, Report, RoundsError,
};

use super::cluster::Cluster;
use super::{Ctx, Proc};
use crate::backends::cuda::error::{DumpError, LockFailure, Who};
use crate::core::stats;
use crate::core::HookError;
use crate::guardian::proto::Act;
use crate::guardian::Guardian;

/// Past the driver's own timeout a lock call is stuck (a driver thread that stopped running).
const STUCK: Duration = Duration::from_millis(300);
/// How long unlocking the processes of a failed round may take (the driver answers in ms).
const UNLOCK_WAIT: Duration = Duration::from_secs(5);

/// Driver calls through the guardian, bounded by CRIU's alarm.
struct ByGuardian<'a> {
    g: &'a mut Guardian,
    hard: Instant,
}

impl Locker for ByGuardian<'_> {
    type Failure = LockFailure;
    type Error = HookError;

    fn lock_all(
        &mut self,
        pids: &[i32],
        limit: Duration,
    ) -> Result<Vec<Attempt<LockFailure>>, HookError> {
        let timeout_ms = limit.as_millis().clamp(1, u32::MAX as u128) as u32;
        let seqs = pids
            .iter()
            .map(|p| self.g.act(*p, Act::Lock { timeout_ms }))
            .collect::<Result<Vec<_>, _>>()?;
        let start = Instant::now();
        self.g
            .wait_all(&seqs, (start + limit + STUCK).min(self.hard), &mut || {})?;
        Ok(seqs
            .iter()
            .map(|seq| match self.g.take(*seq) {
                Some(Ok(_)) => Attempt::Locked,
                Some(Err(e)) if e.lock_gave_up() => Attempt::GaveUp,
                Some(Err(e)) => Attempt::Failed(LockFailure::Driver(e)),
                None => Attempt::Failed(LockFailure::Stuck {
                    waited: start.elapsed(),
                }),
            })
            .collect())
    }

    fn unlock_all(&mut self, pids: &[i32]) -> Result<Vec<(i32, LockFailure)>, HookError> {
        let seqs = pids
            .iter()
            .map(|p| self.g.act(*p, Act::Unlock))
            .collect::<Result<Vec<_>, _>>()?;
        let until = (Instant::now() + UNLOCK_WAIT).min(self.hard);
        self.g.wait_all(&seqs, until, &mut || {})?;
        Ok(pids
            .iter()
            .zip(&seqs)
            .filter_map(|(pid, seq)| match self.g.take(*seq) {
                Some(Ok(_)) => None,
                Some(Err(e)) => Some((*pid, LockFailure::NotUnlocked(e.to_string()))),
                None => Some((
                    *pid,
                    LockFailure::NotUnlocked("no answer within 5 s".into()),
                )),
            })
            .collect())
    }
}

impl Ctx {
    /// Locks the running processes of `found`, within `deadline` (the driver's own timeouts) and
    /// `hard` (CRIU's alarm).
    pub(super) fn lock(
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
        // CRIU_GPU_LOCK_TIMEOUT_MS: how long locking may take, in one lock or in rounds.
        let wait = self.lock_wait(left)?;
        let parallel = self.settings()?.parallel;
        let rounds = self.settings()?.rounds;
        let ranks = running.iter().filter(|p| p.nccl).count();
        let cluster = self.settings()?.cluster.clone();
        let mut locker = ByGuardian { g, hard };
        let start = Instant::now();
        if let Some(socket) = cluster {
            lock_with_nodes(&mut locker, &running, &socket, start + wait)?;
        } else if parallel && rounds.wanted(running.len(), ranks) {
            let report = rounds::lock_in_rounds(
                &mut locker,
                &pids(&running),
                start + wait,
                &mut Jitter::new(),
            )
            .map_err(|e| rounds_failed(&running, e))?;
            tracing::info!(
                "locked {} CUDA processes at once after {} round(s) in {:.1} s (the last \
                 waiting up to {} ms)",
                running.len(),
                report.rounds,
                report.elapsed.as_secs_f64(),
                report.longest.as_millis()
            );
        } else {
            lock_once(&mut locker, &running, wait, parallel)?;
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
        }
        stats::phase("lock", start.elapsed(), running.len(), 0);
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

    /// How long locking may take: CRIU_GPU_LOCK_TIMEOUT_MS, within the `left` of CRIU's seize
    /// time, or all of it.
    fn lock_wait(&self, left: Duration) -> Result<Duration, HookError> {
        Ok(match self.settings()?.lock_timeout {
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
            want => want.unwrap_or(left),
        })
    }
}

/// A job across machines: ranks on other nodes wait for these, so rounds whatever the count,
/// each decided with the other nodes by this node's criu-gpu.
fn lock_with_nodes(
    locker: &mut ByGuardian,
    running: &[&Proc],
    socket: &std::path::Path,
    deadline: Instant,
) -> Result<(), HookError> {
    let mut schedule =
        Cluster::connect(socket, deadline).map_err(|e| HookError::gpu(DumpError::Cluster(e)))?;
    let report = rounds::lock_in_rounds_with(locker, &pids(running), &mut schedule).map_err(
        |e| match e {
            Either::Rounds(e) => rounds_failed(running, e),
            Either::Schedule(e) => HookError::gpu(DumpError::Cluster(e)),
        },
    )?;
    tracing::info!(
        "locked {} CUDA processes at once, with the job's other nodes, after {} round(s) in \
         {:.1} s (the last waiting up to {} ms)",
        running.len(),
        report.rounds,
        report.elapsed.as_secs_f64(),
        report.longest.as_millis()
    );
    Ok(())
}

fn pids(procs: &[&Proc]) -> Vec<i32> {
    procs.iter().map(|p| p.who.pid).collect()
}

/// One lock of each process, all at once (or one after another), each waiting `wait`.
fn lock_once(
    locker: &mut ByGuardian,
    running: &[&Proc],
    wait: Duration,
    parallel: bool,
) -> Result<(), HookError> {
    let mut attempts = Vec::new();
    if parallel {
        attempts = locker.lock_all(&pids(running), wait)?;
    } else {
        for p in running {
            attempts.extend(locker.lock_all(&[p.who.pid], wait)?);
        }
    }
    let failures: Vec<(Who, LockFailure)> = running
        .iter()
        .zip(attempts)
        .filter_map(|(p, a)| {
            let failure = match a {
                Attempt::Locked => return None,
                Attempt::GaveUp => LockFailure::GaveUp {
                    waited: wait,
                    nccl: p.nccl,
                },
                Attempt::Failed(f) => f,
            };
            Some((p.who.clone(), failure))
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(HookError::gpu(DumpError::Locks {
            failures,
            rounds: None,
        }))
    }
}

/// Why the rounds did not lock the group, in the operator's words.
fn rounds_failed(running: &[&Proc], e: RoundsError<LockFailure, HookError>) -> HookError {
    let who = |pid: i32| running.iter().find(|p| p.who.pid == pid).copied();
    let failures = |report: &Report, last: Vec<(i32, Attempt<LockFailure>)>| {
        last.into_iter()
            .filter_map(|(pid, a)| {
                let p = who(pid)?;
                let failure = match a {
                    Attempt::Locked => return None,
                    Attempt::GaveUp => LockFailure::GaveUp {
                        waited: report.longest,
                        nccl: p.nccl,
                    },
                    Attempt::Failed(f) => f,
                };
                Some((p.who.clone(), failure))
            })
            .collect()
    };
    let (failures, report) = match e {
        RoundsError::Locker(e) => return e,
        RoundsError::NoTime { why } => return HookError::gpu(DumpError::Cluster(why)),
        RoundsError::GaveUp { report, last, why } => {
            let failures: Vec<(Who, LockFailure)> = failures(&report, last);
            if failures.is_empty() {
                // Every process here locked: another node's did not.
                return HookError::gpu(DumpError::Cluster(why));
            }
            (failures, report)
        }
        RoundsError::Failed { report, last } => (failures(&report, last), report),
        RoundsError::Unlock { report, failures } => (
            failures
                .into_iter()
                .filter_map(|(pid, f)| Some((who(pid)?.who.clone(), f)))
                .collect(),
            report,
        ),
    };
    HookError::gpu(DumpError::Locks {
        failures,
        rounds: Some((running.len(), report)),
    })
}
