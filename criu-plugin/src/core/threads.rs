//! The ptrace thread window: while CRIU holds every task in ptrace-stop, a GPU driver's helper
//! thread inside each process must run for a checkpoint or restore to finish. A
//! [`ThreadWindow`] lets exactly those threads run and stops them again when it is dropped, on
//! every path out (errors and panics included), so CRIU never finds a thread it seized running.
//!
//! Ptrace requests must come from the tracer thread, CRIU's main thread, where every hook runs;
//! windows are opened and dropped there.

/// A thread let go by [`ThreadControl::release`], to be stopped again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    pub pid: i32,
    pub tid: i32,
    /// The thread's signal mask before, when it was ptrace-stopped by us; `None` when it was not
    /// stopped by us (not seized yet, or any more) and so needs no recapture.
    pub saved_mask: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ThreadError {
    #[error("cannot let thread {tid} of process {pid} run ({reason})")]
    Release { pid: i32, tid: i32, reason: String },
    #[error("cannot stop thread {tid} of process {pid} again ({reason})")]
    Recapture { pid: i32, tid: i32, reason: String },
}

/// Running one thread of a seized task.
pub trait ThreadControl {
    fn release(&self, pid: i32, tid: i32) -> Result<Released, ThreadError>;
    fn recapture(&self, r: &Released) -> Result<(), ThreadError>;
    /// A signal that stopped a released thread since the last look (only SIGSTOP can: every
    /// other signal is blocked in it). The thread is continued without it; the caller raises it
    /// again once the window closes, so the process stops when CRIU lets it go, as it would have.
    fn take_signal(&self, r: &Released) -> Option<i32>;
    /// Sends `sig` to process `pid`.
    fn raise(&self, pid: i32, sig: i32);
    /// The job-control signal (SIGSTOP, SIGTSTP, ...) that had stopped `pid` when CRIU seized
    /// it; `None` when it was running.
    fn seized_stop_signal(&self, pid: i32) -> Option<i32>;
}

/// Threads running inside seized tasks, stopped again on drop.
pub struct ThreadWindow<'a> {
    ctl: &'a dyn ThreadControl,
    open: Vec<Released>,
    /// Stop signals taken from released threads: (pid, signal), raised again on close.
    held: Vec<(i32, i32)>,
}

impl<'a> ThreadWindow<'a> {
    /// Lets each `(pid, tid)` run. Threads that cannot be released are reported, the others run.
    pub fn open(
        ctl: &'a dyn ThreadControl,
        threads: &[(i32, i32)],
    ) -> (ThreadWindow<'a>, Vec<ThreadError>) {
        let mut w = ThreadWindow {
            ctl,
            open: Vec::new(),
            held: Vec::new(),
        };
        let mut failed = Vec::new();
        for &(pid, tid) in threads {
            match ctl.release(pid, tid) {
                Ok(r) => w.open.push(r),
                Err(e) => failed.push(e),
            }
        }
        (w, failed)
    }

    /// Looks for released threads a SIGSTOP stopped, and lets them go on (call while waiting).
    pub fn watch(&mut self) {
        for r in &self.open {
            if let Some(sig) = self.ctl.take_signal(r) {
                tracing::info!(
                    pid = r.pid,
                    "signal {sig} arrived while the GPU driver's thread ran; it is delivered once \
                     CRIU lets the process go"
                );
                self.held.push((r.pid, sig));
            }
        }
    }

    /// A stop signal that reached a released thread (a Ctrl-Z during the window), if any.
    pub fn stop_signal(&self) -> Option<(i32, i32)> {
        self.held.first().copied()
    }

    /// Stops every thread again; errors are returned (and logged by the caller).
    pub fn close(mut self) -> Vec<ThreadError> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Vec<ThreadError> {
        self.watch();
        let errors = self
            .open
            .drain(..)
            .filter_map(|r| self.ctl.recapture(&r).err())
            .collect();
        for (pid, sig) in self.held.drain(..) {
            self.ctl.raise(pid, sig);
        }
        errors
    }
}

impl Drop for ThreadWindow<'_> {
    fn drop(&mut self) {
        for e in self.stop_all() {
            tracing::error!("{e}; CRIU may find the thread running");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testing::FakeThreads;

    #[test]
    fn a_window_stops_its_threads_on_every_way_out() {
        let t = FakeThreads::default();
        {
            let (_w, failed) = ThreadWindow::open(&t, &[(1, 11), (2, 12)]);
            assert!(failed.is_empty());
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (_w, _) = ThreadWindow::open(&t, &[(3, 13)]);
            panic!("a worker failed");
        }));
        assert!(r.is_err());
        let log = t.log.lock().unwrap().clone();
        assert_eq!(
            log,
            [
                "release 11",
                "release 12",
                "recapture 11",
                "recapture 12",
                "release 13",
                "recapture 13"
            ]
        );
    }
}
