//! The API lock: the driver's gate at the entry of every CUDA call. A checkpoint lock closes
//! it, waits for the calls in progress, and keeps new calls waiting at the entry.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// The API lock.
#[derive(Default)]
pub(super) struct Gate {
    m: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Locked by the checkpoint API: calls wait at their entry.
    locked: bool,
    /// A lock is being taken: new calls wait, calls in progress finish.
    closing: bool,
    /// Calls in progress.
    active: usize,
}

pub(super) struct GateGuard<'a>(&'a Gate);

impl Gate {
    pub(super) fn enter(&self) -> GateGuard<'_> {
        let mut g = self.m.lock().unwrap();
        while g.locked || g.closing {
            g = self.cv.wait(g).unwrap();
        }
        g.active += 1;
        GateGuard(self)
    }

    /// Stops new calls and waits for the running ones, until `deadline`.
    pub(super) fn close(&self, deadline: Option<Instant>) -> bool {
        let mut g = self.m.lock().unwrap();
        g.closing = true;
        while g.active > 0 {
            match deadline {
                None => g = self.cv.wait(g).unwrap(),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        g.closing = false;
                        self.cv.notify_all();
                        return false;
                    }
                    g = self.cv.wait_timeout(g, left).unwrap().0;
                }
            }
        }
        true
    }

    pub(super) fn set(&self, locked: bool) {
        let mut g = self.m.lock().unwrap();
        g.locked = locked;
        g.closing = false;
        self.cv.notify_all();
    }
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        let mut g = self.0.m.lock().unwrap();
        g.active -= 1;
        self.0.cv.notify_all();
    }
}
