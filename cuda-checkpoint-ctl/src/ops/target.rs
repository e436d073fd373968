//! One process as the operations see it: its driver calls, each bounded by the operation's
//! wait (the driver itself may wait without limit: docs/driver-facts.md, F2, F4, F11), timed,
//! and with errors in operator words.
//!
//! Every call needs the process's CUDA driver thread (the "restore thread") to run. So before
//! the first call [`Target::ready`] refuses a process whose driver thread is held (stopped,
//! in a ptrace stop, frozen), and while a call is in flight the wait ends early once the
//! process has stayed held for [`HELD_GRACE`]: the check alone cannot see a process stopped
//! right after it.

use std::time::{Duration, Instant};

use crate::driver::{Call, CudaError, DeviceMap, Driver, Pending, ProcessState};
use crate::error::{Error, Result};
use crate::ops::Timings;
use process_facts::process::{self, Hold};

/// How long a process must stay held during a call before the call is given up on: a Ctrl-Z
/// followed by `fg` is not a reason to give up; a process left stopped is.
pub const HELD_GRACE: Duration = Duration::from_secs(2);
/// How often a call in flight looks whether its process is held.
const POLL: Duration = Duration::from_millis(200);
/// A hold must be seen this many times, `SAMPLE_GAP` apart, to refuse: a tracer's passing stop
/// (strace's syscall stops) is not a hold.
const SAMPLES: usize = 3;
const SAMPLE_GAP: Duration = Duration::from_millis(50);

pub struct Target<'a> {
    pub driver: &'a Driver,
    pub pid: i32,
    /// The longest any one driver call may take; `None` waits as long as the driver does.
    pub wait: Option<Duration>,
    pub comm: String,
    /// The driver's thread in the process, once [`Target::ready`] asked for it.
    restore_tid: Option<i32>,
}

fn timed<T>(slot: &mut Option<f64>, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    *slot = Some(start.elapsed().as_secs_f64() * 1000.0);
    out
}

/// What holds thread `tid` of `pid`, seen steadily over a short while (see [`SAMPLES`]).
pub fn steady_hold(pid: i32, tid: i32) -> Option<Hold> {
    let mut hold = process::hold(pid, tid)?;
    for _ in 1..SAMPLES {
        std::thread::sleep(SAMPLE_GAP);
        hold = process::hold(pid, tid)?;
    }
    Some(hold)
}

impl<'a> Target<'a> {
    pub fn new(driver: &'a Driver, pid: i32, wait: Option<Duration>) -> Target<'a> {
        Target {
            driver,
            pid,
            wait,
            comm: process::name(pid),
            restore_tid: None,
        }
    }

    /// Refuses a process whose CUDA driver thread cannot run, before any call that needs that
    /// thread. The thread's id is asked first: the driver gives it at once (F5), even for a
    /// stopped process. Where the driver gives none (no CUDA, no such process), the call
    /// itself answers, as the driver does.
    pub fn ready(&mut self) -> Result<()> {
        let tid = match self.call(Call::GetRestoreThreadId, |d, pid| d.restore_thread_id(pid)) {
            Ok(tid) => tid,
            Err(Error::Cuda(e)) => {
                tracing::debug!(pid = self.pid, error = %e, "no driver thread to look at");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        self.restore_tid = Some(tid);
        match steady_hold(self.pid, tid) {
            Some(hold) => Err(Error::Held {
                pid: self.pid,
                comm: self.comm.clone(),
                hold,
            }),
            None => Ok(()),
        }
    }

    /// What holds the driver thread now, if [`Target::ready`] found it.
    fn hold_now(&self) -> Option<Hold> {
        process::hold(self.pid, self.restore_tid?)
    }

    /// The error for a call given up on after `waited`.
    pub fn no_answer(&self, call: Call, waited: Duration, held: Option<Hold>) -> Error {
        Error::NoAnswer {
            call,
            pid: self.pid,
            comm: self.comm.clone(),
            waited,
            held,
        }
    }

    fn call<T: Send + 'static>(
        &self,
        call: Call,
        f: impl FnOnce(&Driver, i32) -> Result<T, CudaError> + Send + 'static,
    ) -> Result<T> {
        let pid = self.pid;
        match self.wait {
            None => Ok(f(self.driver, pid)?),
            Some(limit) => {
                let start = Instant::now();
                let pending = self.driver.start(move |d| f(d, pid));
                self.finish(call, pending, start, Some(start + limit))
            }
        }
    }

    /// The answer of `call`, started at `started`, if it comes before `deadline` (`None`: as
    /// long as the driver takes) and before the process has stayed held for [`HELD_GRACE`].
    /// A call given up on goes on in the driver: it cannot be cancelled.
    pub fn finish<T>(
        &self,
        call: Call,
        pending: Pending<Result<T, CudaError>>,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Result<T> {
        let Some(deadline) = deadline else {
            return match pending.wait() {
                Some(r) => Ok(r?),
                None => Err(self.no_answer(call, started.elapsed(), None)),
            };
        };
        let mut held_since: Option<Instant> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.no_answer(call, started.elapsed(), self.hold_now()));
            }
            if let Some(r) = pending.wait_for(left.min(POLL)) {
                return Ok(r?);
            }
            match self.hold_now() {
                Some(hold) => {
                    let since = *held_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= HELD_GRACE {
                        tracing::debug!(pid = self.pid, %call, "held for {HELD_GRACE:?}: giving up");
                        return Err(self.no_answer(call, started.elapsed(), Some(hold)));
                    }
                }
                None => held_since = None,
            }
        }
    }

    pub fn restore_thread_id(&self) -> Result<i32> {
        self.call(Call::GetRestoreThreadId, |d, pid| d.restore_thread_id(pid))
    }

    pub fn state(&self) -> Result<ProcessState> {
        self.call(Call::GetState, |d, pid| d.state(pid))
    }

    /// A lock that gives up is reported as such, with the timeout to raise.
    pub fn lock(&self, timeout: Option<Duration>, t: &mut Timings) -> Result<()> {
        timed(&mut t.lock_ms, || {
            self.call(Call::Lock, move |d, pid| d.lock(pid, timeout))
        })
        .map_err(|e| match e {
            Error::Cuda(source) if source.is_lock_timeout() => Error::LockGaveUp {
                pid: self.pid,
                comm: self.comm.clone(),
                timeout_ms: timeout.map_or(0, |t| t.as_millis() as u64),
                source,
            },
            other => other,
        })
    }

    pub fn checkpoint(&self, t: &mut Timings) -> Result<()> {
        timed(&mut t.checkpoint_ms, || {
            self.call(Call::Checkpoint, |d, pid| d.checkpoint(pid))
        })
    }

    pub fn restore(&self, map: &DeviceMap, t: &mut Timings) -> Result<()> {
        let map = map.clone();
        timed(&mut t.restore_ms, || {
            self.call(Call::Restore, move |d, pid| d.restore(pid, &map))
        })
    }

    pub fn unlock(&self, t: &mut Timings) -> Result<()> {
        timed(&mut t.unlock_ms, || {
            self.call(Call::Unlock, |d, pid| d.unlock(pid))
        })
    }
}
