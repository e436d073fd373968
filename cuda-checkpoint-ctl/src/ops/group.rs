//! Suspending a group whose processes wait for each other on the GPU (NCCL ranks): the running
//! ones are locked in rounds until one round locks them all ([`super::rounds`]), then all are
//! checkpointed at once. A failure anywhere puts every process of the group back to running.

use std::time::{Duration, Instant};

use crate::driver::{Driver, ProcessState};
use crate::error::Error;
use crate::ops::rounds::{self, Attempt, Jitter, Locker, RoundsError};
use crate::ops::{apply, in_parallel, recover, Goal, Options, Outcome, Target, Timings};
use process_facts::process;

/// How long the rounds may take when no --timeout is given.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(30);
/// Past the driver's own timeout a lock is stuck (a driver thread that stopped running).
const STUCK: Duration = Duration::from_millis(300);

/// Locks and unlocks through the driver, one thread per process.
struct ByDriver<'a> {
    driver: &'a Driver,
    timings: Vec<Timings>,
}

impl Locker for ByDriver<'_> {
    type Failure = String;
    type Error = std::convert::Infallible;

    fn lock_all(
        &mut self,
        pids: &[i32],
        limit: Duration,
    ) -> Result<Vec<Attempt<String>>, Self::Error> {
        let driver = self.driver;
        let done = in_parallel(pids, |pid| {
            let mut t = Timings::default();
            let r = Target::new(driver, pid, Some(limit + STUCK)).lock(Some(limit), &mut t);
            (r, t)
        });
        let mut attempts = Vec::new();
        self.timings.clear();
        for (r, t) in done {
            self.timings.push(t);
            attempts.push(match r {
                Ok(()) => Attempt::Locked,
                Err(Error::LockGaveUp { .. }) => Attempt::GaveUp,
                Err(e) => Attempt::Failed(e.to_string()),
            });
        }
        Ok(attempts)
    }

    fn unlock_all(&mut self, pids: &[i32]) -> Result<Vec<(i32, String)>, Self::Error> {
        let driver = self.driver;
        let done = in_parallel(pids, |pid| {
            Target::new(driver, pid, Some(STUCK * 10)).unlock(&mut Timings::default())
        });
        Ok(pids
            .iter()
            .zip(done)
            .filter_map(|(p, r)| r.err().map(|e| (*p, e.to_string())))
            .collect())
    }
}

/// Suspends the processes of `pids` when their running ones are to be locked in rounds
/// (`opts.rounds`); `None` when they are not, and the caller suspends each on its own.
pub(super) fn suspend_in_rounds(
    driver: &Driver,
    pids: &[i32],
    goal: &Goal,
    opts: &Options,
) -> Option<Vec<Outcome>> {
    if !matches!(goal, Goal::Suspend | Goal::Toggle) {
        return None;
    }
    let states = in_parallel(pids, |pid| {
        let mut t = Target::new(driver, pid, opts.wait);
        t.ready().and_then(|()| t.state()).ok()
    });
    let running: Vec<i32> = pids
        .iter()
        .zip(&states)
        .filter(|(_, s)| **s == Some(ProcessState::Running))
        .map(|(p, _)| *p)
        .collect();
    let ranks = running
        .iter()
        .filter(|p| process::libraries(**p).is_ok_and(|l| l.nccl))
        .count();
    if !opts.rounds.wanted(running.len(), ranks) {
        return None;
    }
    let mut outcomes = suspend_running(driver, &running, opts);
    // The others (a checkpointed process to toggle, one that failed its state query) as usual.
    let others: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|p| !running.contains(p))
        .collect();
    outcomes.extend(in_parallel(&others, |pid| apply(driver, pid, goal, opts)));
    outcomes.sort_by_key(|o| pids.iter().position(|p| *p == o.pid));
    Some(outcomes)
}

/// Locks `running` in rounds and checkpoints them; any failure puts all of them back.
fn suspend_running(driver: &Driver, running: &[i32], opts: &Options) -> Vec<Outcome> {
    let mut locker = ByDriver {
        driver,
        timings: Vec::new(),
    };
    let deadline = Instant::now() + opts.lock_timeout.unwrap_or(DEFAULT_BUDGET);
    let locked = rounds::lock_in_rounds(&mut locker, running, deadline, &mut Jitter::new());
    let lock_times = std::mem::take(&mut locker.timings);
    let mut outcomes: Vec<Outcome> = running
        .iter()
        .enumerate()
        .map(|(i, &pid)| Outcome {
            pid,
            comm: process::name(pid),
            before: Some(ProcessState::Running),
            after: None,
            timings: lock_times.get(i).cloned().unwrap_or_default(),
            error: None,
            rolled_back: false,
            abandoned: None,
        })
        .collect();
    let failed = match locked {
        Ok(report) => {
            tracing::info!(
                "locked {} CUDA processes at once after {} round(s) in {:.1} s",
                running.len(),
                report.rounds,
                report.elapsed.as_secs_f64()
            );
            let done = in_parallel(running, |pid| {
                let mut t = Timings::default();
                let r = Target::new(driver, pid, opts.wait).checkpoint(&mut t);
                (r, t)
            });
            let mut failed = false;
            for (o, (r, t)) in outcomes.iter_mut().zip(done) {
                o.timings.checkpoint_ms = t.checkpoint_ms;
                if let Err(e) = r {
                    o.error = Some(e);
                    failed = true;
                }
            }
            failed
        }
        Err(e) => {
            blame(&mut outcomes, e);
            true
        }
    };
    if failed && opts.all_or_nothing {
        put_back(driver, &mut outcomes, opts);
    }
    for o in &mut outcomes {
        o.after = driver
            .within(Duration::from_secs(2), {
                let pid = o.pid;
                move |d| d.state(pid)
            })
            .and_then(|r| r.ok());
    }
    outcomes
}

/// Gives each process of a failed round its error.
fn blame(outcomes: &mut [Outcome], e: RoundsError<String, std::convert::Infallible>) {
    let group = outcomes.len();
    let rounds_error = |o: &Outcome, report: &rounds::Report| Error::RoundsGaveUp {
        pid: o.pid,
        comm: o.comm.clone(),
        rounds: report.rounds,
        elapsed: report.elapsed,
        longest: report.longest,
        group,
    };
    match e {
        RoundsError::GaveUp { report, last, .. } | RoundsError::Failed { report, last } => {
            let errors: Vec<(i32, Error)> = last
                .into_iter()
                .filter_map(|(pid, a)| {
                    let o = outcomes.iter().find(|o| o.pid == pid)?;
                    match a {
                        Attempt::Locked => None,
                        Attempt::GaveUp => Some((pid, rounds_error(o, &report))),
                        Attempt::Failed(why) => Some((pid, Error::Io(std::io::Error::other(why)))),
                    }
                })
                .collect();
            for (pid, err) in errors {
                if let Some(o) = outcomes.iter_mut().find(|o| o.pid == pid) {
                    o.error = Some(err);
                }
            }
        }
        RoundsError::Unlock { failures, .. } => {
            for (pid, why) in failures {
                if let Some(o) = outcomes.iter_mut().find(|o| o.pid == pid) {
                    o.error = Some(Error::Io(std::io::Error::other(format!(
                        "locked in a round that did not lock every process, and not unlocked \
                         again: {why}"
                    ))));
                }
            }
        }
        RoundsError::NoTime { why } => {
            for o in outcomes.iter_mut() {
                o.error = Some(Error::Io(std::io::Error::other(format!(
                    "{why}: raise --timeout"
                ))));
            }
        }
        RoundsError::Locker(never) => match never {},
    }
}

/// Brings every process of a failed group suspension back to running.
fn put_back(driver: &Driver, outcomes: &mut [Outcome], opts: &Options) {
    let pids: Vec<i32> = outcomes.iter().map(|o| o.pid).collect();
    let undone = in_parallel(&pids, |pid| {
        let t = Target::new(driver, pid, opts.wait);
        recover::recover(&t, &opts.device_map, &mut Timings::default(), &mut None)
    });
    for (o, r) in outcomes.iter_mut().zip(undone) {
        match r {
            Ok(()) => o.rolled_back = o.error.is_none(),
            Err(e) => {
                tracing::error!(pid = o.pid, error = %e, "could not put the process back");
                o.error.get_or_insert(e);
            }
        }
    }
}
