//! Transitions of one CUDA process, and of many at once.
//!
//! A suspension (lock, then checkpoint) that fails half way is undone, so the process keeps
//! running with its data. Many processes are handled by one thread each: the driver overlaps
//! calls on different processes, so N processes take about as long as the slowest one. Group
//! operations bound every driver call ([`Options::wait`]): the driver may wait without limit.
//! A process whose CUDA driver thread cannot run (stopped, traced, frozen) is refused before
//! any call that would wait for it ([`Target::ready`]).

mod group;
mod recover;
pub mod rounds;
mod target;

use std::time::Duration;

use serde::Serialize;

use crate::driver::{Call, CudaError, DeviceMap, Driver, ProcessState};
use crate::error::{Error, Result};
use process_facts::process::{self, Inspection};

pub use self::target::Target;

/// A process in which the driver holds CUDA state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CudaProcess {
    pub pid: i32,
    pub comm: String,
    pub restore_tid: i32,
    /// `None` when the driver did not answer in time (an action is in progress on it), or was
    /// not asked because the process is held.
    pub state: Option<ProcessState>,
    /// Why its driver thread cannot run, and the fix; the state is not asked then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

/// The CUDA processes among a set of pids, and those this user may not inspect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Survey {
    pub processes: Vec<CudaProcess>,
    /// Processes whose memory map (or driver state) this user may not read.
    pub denied: Vec<i32>,
}

impl Survey {
    pub fn pids(&self) -> Vec<i32> {
        self.processes.iter().map(|p| p.pid).collect()
    }

    /// The permission problem, if processes could not be inspected and running as root
    /// would help. Root is refused only processes that are not dumpable or live in another
    /// user namespace; those are logged and left alone.
    pub fn denied_error(&self) -> Option<Error> {
        if self.denied.is_empty() {
            return None;
        }
        if process::is_root() {
            return None;
        }
        Some(Error::NotInspected {
            pids: self.denied.clone(),
        })
    }
}

/// Finds the CUDA processes among `pids` (in the given order). Only processes that map a CUDA
/// driver library are asked, so scanning a whole machine costs one read of each process's
/// maps. Their states are read in parallel, each waiting `wait` at most.
pub fn survey(driver: &Driver, pids: &[i32], wait: Duration) -> Survey {
    let mut out = Survey::default();
    let mut candidates = Vec::new();
    for &pid in pids {
        match process::inspect(pid) {
            Inspection::MapsCuda => candidates.push(pid),
            Inspection::Denied => out.denied.push(pid),
            Inspection::NoCuda | Inspection::Gone => {}
        }
    }
    let found = in_parallel(&candidates, |pid| probe(driver, pid, wait));
    for (pid, found) in candidates.into_iter().zip(found) {
        match found {
            Probe::Cuda(p) => out.processes.push(p),
            Probe::Denied => out.denied.push(pid),
            Probe::NoCuda => {}
        }
    }
    out.denied.sort_unstable();
    if !out.denied.is_empty() && process::is_root() {
        tracing::info!(
            pids = ?out.denied,
            "processes that even root may not inspect (not dumpable, or of another user \
             namespace) are left alone"
        );
    }
    out
}

enum Probe {
    Cuda(CudaProcess),
    NoCuda,
    Denied,
}

fn probe(driver: &Driver, pid: i32, wait: Duration) -> Probe {
    let denied = |e: &CudaError| e.code == crate::driver::code::NOT_PERMITTED;
    // The restore thread id answers at once, even during an action (F5).
    let restore_tid = match driver.within(wait, move |d| d.restore_thread_id(pid)) {
        Some(Ok(tid)) => tid,
        Some(Err(e)) if denied(&e) => return Probe::Denied,
        Some(Err(e)) => {
            tracing::debug!(pid, error = %e, "no CUDA state");
            return Probe::NoCuda;
        }
        None => 0,
    };
    let comm = process::name(pid);
    // A held process would keep its state query waiting: say why instead.
    if let Some(hold) = (restore_tid > 0)
        .then(|| target::steady_hold(pid, restore_tid))
        .flatten()
    {
        let held = Error::Held {
            pid,
            comm: comm.clone(),
            hold,
        };
        return Probe::Cuda(CudaProcess {
            pid,
            comm,
            restore_tid,
            state: None,
            held: Some(held.to_string()),
        });
    }
    let state = match driver.within(wait, move |d| d.state(pid)) {
        Some(Ok(s)) => Some(s),
        Some(Err(e)) if denied(&e) => return Probe::Denied,
        Some(Err(e)) => {
            tracing::debug!(pid, error = %e, "no CUDA state");
            return Probe::NoCuda;
        }
        None => None,
    };
    Probe::Cuda(CudaProcess {
        pid,
        comm,
        restore_tid,
        state,
        held: None,
    })
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
    /// Bring a locked or checkpointed process back to running, after waiting for an action in
    /// progress; a running one is left alone.
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
    /// The longest one driver call may take; `None` waits as long as the driver does (as
    /// `cuda-checkpoint` does).
    pub wait: Option<Duration>,
    /// Whether a suspended group is locked in rounds (NCCL ranks wait for each other).
    pub rounds: rounds::Rounds,
}

/// The result of one process's transition.
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub pid: i32,
    pub comm: String,
    pub before: Option<ProcessState>,
    pub after: Option<ProcessState>,
    pub timings: Timings,
    #[serde(serialize_with = "error_text")]
    pub error: Option<Error>,
    /// Set when the process was suspended but put back because another process failed.
    pub rolled_back: bool,
    /// The action given up on after the wait: it may still take effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abandoned: Option<Call>,
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

/// Lock and checkpoint; if that fails, bring the process back to running.
pub fn suspend(
    driver: &Driver,
    pid: i32,
    lock_timeout: Option<Duration>,
    t: &mut Timings,
) -> Result<()> {
    suspend_target(&Target::new(driver, pid, None), lock_timeout, t)
}

fn suspend_target(target: &Target, lock_timeout: Option<Duration>, t: &mut Timings) -> Result<()> {
    let result = target
        .lock(lock_timeout, t)
        .and_then(|()| target.checkpoint(t));
    match result {
        Ok(()) => Ok(()),
        // The action goes on in the driver; undoing now would only queue behind it.
        Err(e @ Error::NoAnswer { .. }) => Err(e),
        Err(e) => {
            let mut undo = Timings::default();
            if let Err(u) = recover::recover(target, &DeviceMap::default(), &mut undo, &mut None) {
                tracing::error!(pid = target.pid, error = %u, "could not undo a failed suspension");
            }
            t.unlock_ms = undo.unlock_ms.or(t.unlock_ms);
            Err(e)
        }
    }
}

/// Restore and unlock.
pub fn resume(driver: &Driver, pid: i32, map: &DeviceMap, t: &mut Timings) -> Result<()> {
    let target = Target::new(driver, pid, None);
    target.restore(map, t)?;
    target.unlock(t)
}

/// How long the state after an operation is waited for (it is only reported).
const AFTER_WAIT: Duration = Duration::from_secs(2);

/// The checkpoint state of one process, unless it is held; each call bounded by `wait`.
pub fn state(driver: &Driver, pid: i32, wait: Duration) -> Result<ProcessState> {
    let mut target = Target::new(driver, pid, Some(wait));
    target.ready()?;
    target.state()
}

/// The driver's thread in one process, bounded by `wait` (the driver answers at once, F5, even
/// for a held process: CRIU's C plugin asks while it holds the process).
pub fn restore_thread_id(driver: &Driver, pid: i32, wait: Duration) -> Result<i32> {
    Target::new(driver, pid, Some(wait)).restore_thread_id()
}

/// Applies `goal` to one process.
pub fn apply(driver: &Driver, pid: i32, goal: &Goal, opts: &Options) -> Outcome {
    let mut target = Target::new(driver, pid, opts.wait);
    let mut t = Timings::default();
    let mut before = None;
    let result = target.ready().and_then(|()| match goal {
        Goal::Recover => recover::recover(&target, &opts.device_map, &mut t, &mut before),
        goal => target.state().and_then(|state| {
            before = Some(state);
            transition(&target, state, goal, opts, &mut t)
        }),
    });
    let after = match &result {
        // The driver is still busy with this process, or would wait for it: asking again
        // would wait as long.
        Err(Error::NoAnswer { .. } | Error::Held { .. }) => None,
        // Only for the report: a process stopped meanwhile gives no answer (F11), so not long.
        _ => driver
            .within(AFTER_WAIT, move |d| d.state(pid))
            .and_then(|r| r.ok()),
    };
    let abandoned = match &result {
        Err(Error::NoAnswer { call, .. }) if call.acts() => Some(*call),
        _ => None,
    };
    Outcome {
        pid,
        comm: target.comm,
        before,
        after,
        timings: t,
        error: result.err(),
        rolled_back: false,
        abandoned,
    }
}

fn transition(
    target: &Target,
    state: ProcessState,
    goal: &Goal,
    opts: &Options,
    t: &mut Timings,
) -> Result<()> {
    match (goal, state) {
        (Goal::Action(call), _) => action(target, *call, opts, t),
        (Goal::Toggle, ProcessState::Failed) => Err(Error::GpuStateLost {
            pid: target.pid,
            comm: target.comm.clone(),
        }),
        (Goal::Suspend, _) | (Goal::Toggle, ProcessState::Running) => {
            suspend_target(target, opts.lock_timeout, t)
        }
        (Goal::Resume, _) | (Goal::Toggle, ProcessState::Checkpointed) => {
            target.restore(&opts.device_map, t)?;
            target.unlock(t)
        }
        (Goal::Recover, _) => recover::recover(target, &opts.device_map, t, &mut None),
        (Goal::Toggle, state) => Err(Error::WrongState {
            pid: target.pid,
            state,
            why: "toggle needs running or checkpointed; use --action or --recover",
        }),
    }
}

fn action(target: &Target, call: Call, opts: &Options, t: &mut Timings) -> Result<()> {
    match call {
        Call::Lock => target.lock(opts.lock_timeout, t),
        Call::Checkpoint => target.checkpoint(t),
        Call::Restore => target.restore(&opts.device_map, t),
        Call::Unlock => target.unlock(t),
        Call::GetState | Call::GetRestoreThreadId => target.state().map(|_| ()),
    }
}

/// Applies `goal` to every process concurrently. With `all_or_nothing`, if any suspension
/// fails the processes that were suspended are resumed again, so the group stays consistent.
pub fn apply_all(driver: &Driver, pids: &[i32], goal: &Goal, opts: &Options) -> Vec<Outcome> {
    if let Some(outcomes) = group::suspend_in_rounds(driver, pids, goal, opts) {
        return outcomes;
    }
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
            let Some(o) = outcomes.iter_mut().find(|o| o.pid == u.pid) else {
                continue; // undone are a subset of outcomes
            };
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
            // A worker's panic goes on in the caller, as if `f` had run here.
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}
