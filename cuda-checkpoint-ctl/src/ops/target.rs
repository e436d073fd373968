//! One process as the operations see it: its driver calls, each bounded by the operation's
//! wait (the driver itself may wait without limit: docs/driver-facts.md, F2 and F4), timed,
//! and with errors in operator words.

use std::time::{Duration, Instant};

use crate::driver::{Call, CudaError, DeviceMap, Driver, ProcessState};
use crate::error::{Error, Result};
use crate::ops::Timings;
use crate::process;

pub struct Target<'a> {
    pub driver: &'a Driver,
    pub pid: i32,
    /// The longest any one driver call may take; `None` waits as long as the driver does.
    pub wait: Option<Duration>,
    pub comm: String,
}

fn timed<T>(slot: &mut Option<f64>, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    *slot = Some(start.elapsed().as_secs_f64() * 1000.0);
    out
}

impl<'a> Target<'a> {
    pub fn new(driver: &'a Driver, pid: i32, wait: Option<Duration>) -> Target<'a> {
        Target {
            driver,
            pid,
            wait,
            comm: process::name(pid),
        }
    }

    /// The error for a call that did not return within `waited`.
    pub fn no_answer(&self, call: Call, waited: Duration) -> Error {
        Error::NoAnswer {
            call,
            pid: self.pid,
            comm: self.comm.clone(),
            waited,
            stopped: process::is_stopped(self.pid),
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
            Some(limit) => match self.driver.within(limit, move |d| f(d, pid)) {
                Some(r) => Ok(r?),
                None => Err(self.no_answer(call, limit)),
            },
        }
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
