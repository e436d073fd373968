//! Transitions of one CUDA process, and of many at once.
//!
//! A suspension (lock, then checkpoint) that fails half way is undone, so the process keeps
//! running with its data. Many processes are handled by one thread each: the driver overlaps
//! calls on different processes, so N processes take about as long as the slowest one.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::driver::{Call, CudaError, DeviceMap, Driver, ProcessState};
use crate::error::{Error, Result};
use crate::process;

/// A process in which the driver holds CUDA state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CudaProcess {
    pub pid: i32,
    pub restore_tid: i32,
    pub state: ProcessState,
}

/// Asks the driver about `pid`: `Ok(None)` when it has no CUDA state.
pub fn probe(driver: &Driver, pid: i32) -> Result<Option<CudaProcess>> {
    if !process::exists(pid) {
        return Err(Error::NoSuchProcess(pid));
    }
    let restore_tid = match driver.restore_thread_id(pid) {
        Ok(tid) => tid,
        Err(e) => {
            tracing::debug!(pid, error = %e, "no CUDA state");
            return Ok(None);
        }
    };
    let state = driver.state(pid)?;
    Ok(Some(CudaProcess {
        pid,
        restore_tid,
        state,
    }))
}

/// The CUDA processes among `pids`, in the given order. Only processes that map a CUDA driver
/// library are asked, so scanning a whole machine costs one read of each process's maps.
pub fn discover(driver: &Driver, pids: &[i32]) -> Vec<CudaProcess> {
    pids.iter()
        .filter(|&&pid| process::maps_libcuda(pid))
        .filter_map(|&pid| probe(driver, pid).ok().flatten())
        .collect()
}

/// Wall time of each driver call made for one process, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unlock_ms: Option<f64>,
}

fn timed<T>(slot: &mut Option<f64>, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    *slot = Some(start.elapsed().as_secs_f64() * 1000.0);
    out
}

/// What to do with each process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Goal {
    /// One driver call, as `--action` does.
    Action(Call),
    /// running -> checkpointed (lock, checkpoint).
    Suspend,
    /// checkpointed -> running (restore, unlock).
    Resume,
    /// Suspend a running process, resume a checkpointed one.
    Toggle,
    /// Bring a locked or checkpointed process back to running; a running one is left alone.
    Recover,
}

/// Parameters of a transition.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Lock timeout; `None` waits as long as the driver does.
    pub lock_timeout: Option<Duration>,
    /// GPU remapping for restore.
    pub device_map: DeviceMap,
    /// Undo every suspension of a group when one of them fails.
    pub all_or_nothing: bool,
}

/// The result of one process's transition.
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub pid: i32,
    pub before: Option<ProcessState>,
    pub after: Option<ProcessState>,
    pub timings: Timings,
    #[serde(serialize_with = "error_text")]
    pub error: Option<Error>,
    /// Set when the process was suspended but put back because another process failed.
    pub rolled_back: bool,
}

fn error_text<S: serde::Serializer>(e: &Option<Error>, s: S) -> Result<S::Ok, S::Error> {
    match e {
        Some(e) => s.serialize_some(&e.to_string()),
        None => s.serialize_none(),
    }
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

/// Lock and checkpoint; if the checkpoint fails, unlock again so the process keeps running.
pub fn suspend(
    driver: &Driver,
    pid: i32,
    lock_timeout: Option<Duration>,
    t: &mut Timings,
) -> Result<(), CudaError> {
    timed(&mut t.lock_ms, || driver.lock(pid, lock_timeout))?;
    if let Err(e) = timed(&mut t.checkpoint_ms, || driver.checkpoint(pid)) {
        if let Err(undo) = timed(&mut t.unlock_ms, || driver.unlock(pid)) {
            tracing::error!(pid, error = %undo, "could not unlock after a failed checkpoint");
        }
        return Err(e);
    }
    Ok(())
}

/// Restore and unlock.
pub fn resume(
    driver: &Driver,
    pid: i32,
    map: &DeviceMap,
    t: &mut Timings,
) -> Result<(), CudaError> {
    timed(&mut t.restore_ms, || driver.restore(pid, map))?;
    timed(&mut t.unlock_ms, || driver.unlock(pid))
}

/// Applies `goal` to one process.
pub fn apply(driver: &Driver, pid: i32, goal: &Goal, opts: &Options) -> Outcome {
    let mut t = Timings::default();
    let before = driver.state(pid);
    let result = match &before {
        Ok(state) => transition(driver, pid, *state, goal, opts, &mut t),
        Err(e) => Err(e.clone().into()),
    };
    Outcome {
        pid,
        before: before.ok(),
        after: driver.state(pid).ok(),
        timings: t,
        error: result.err(),
        rolled_back: false,
    }
}

fn transition(
    driver: &Driver,
    pid: i32,
    state: ProcessState,
    goal: &Goal,
    opts: &Options,
    t: &mut Timings,
) -> Result<()> {
    match (goal, state) {
        (Goal::Action(call), _) => action(driver, pid, *call, opts, t)?,
        (Goal::Suspend, _) | (Goal::Toggle, ProcessState::Running) => {
            suspend(driver, pid, opts.lock_timeout, t)?
        }
        (Goal::Resume, _) | (Goal::Toggle | Goal::Recover, ProcessState::Checkpointed) => {
            resume(driver, pid, &opts.device_map, t)?
        }
        (Goal::Recover, ProcessState::Locked) => timed(&mut t.unlock_ms, || driver.unlock(pid))?,
        (Goal::Recover, _) => {}
        (Goal::Toggle, state) => {
            return Err(Error::WrongState {
                pid,
                state,
                why: "toggle needs running or checkpointed; use --action or --recover",
            })
        }
    }
    Ok(())
}

fn action(
    driver: &Driver,
    pid: i32,
    call: Call,
    opts: &Options,
    t: &mut Timings,
) -> Result<(), CudaError> {
    match call {
        Call::Lock => timed(&mut t.lock_ms, || driver.lock(pid, opts.lock_timeout)),
        Call::Checkpoint => timed(&mut t.checkpoint_ms, || driver.checkpoint(pid)),
        Call::Restore => timed(&mut t.restore_ms, || driver.restore(pid, &opts.device_map)),
        Call::Unlock => timed(&mut t.unlock_ms, || driver.unlock(pid)),
        Call::GetState | Call::GetRestoreThreadId => driver.state(pid).map(|_| ()),
    }
}

/// Applies `goal` to every process concurrently. With `all_or_nothing`, if any suspension
/// fails the processes that were suspended are resumed again, so the group stays consistent.
pub fn apply_all(driver: &Driver, pids: &[i32], goal: &Goal, opts: &Options) -> Vec<Outcome> {
    let mut outcomes = in_parallel(pids, |pid| apply(driver, pid, goal, opts));
    let suspending = |o: &Outcome| {
        matches!(goal, Goal::Suspend)
            || (matches!(goal, Goal::Toggle) && o.before == Some(ProcessState::Running))
    };
    let any_failed = outcomes.iter().any(|o| !o.ok() && suspending(o));
    if opts.all_or_nothing && any_failed {
        let undo: Vec<i32> = outcomes
            .iter()
            .filter(|o| o.ok() && suspending(o))
            .map(|o| o.pid)
            .collect();
        let undone = in_parallel(&undo, |pid| apply(driver, pid, &Goal::Recover, opts));
        for u in undone {
            let o = outcomes
                .iter_mut()
                .find(|o| o.pid == u.pid)
                .expect("own pid");
            o.rolled_back = u.ok();
            o.after = u.after;
            if let Some(e) = u.error {
                tracing::error!(pid = u.pid, error = %e, "rollback failed");
                o.error = Some(e);
            }
        }
    }
    outcomes
}

/// Runs `f` for every pid on its own thread and returns the results in pid order.
pub fn in_parallel<T: Send>(pids: &[i32], f: impl Fn(i32) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = pids.iter().map(|&pid| s.spawn(move || f(pid))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect()
    })
}
