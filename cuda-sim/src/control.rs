//! The control page: how a controller (the checkpoint tool, or CRIU with the plugin) reaches the
//! driver's helper thread inside a CUDA process, as NVIDIA's driver does "through /proc".
//!
//! The page is a memfd that the simulated driver maps shared and keeps open as an fd. A controller
//! finds that fd in `/proc/PID/fd`, maps the same memory, posts a request in the slot and wakes
//! the helper thread with a futex; the helper does the work inside the process and posts the
//! result. State and restore thread id are plain fields, so they can be read while the process
//! is stopped; actions need the helper thread to run, so a stopped process makes them wait.
//! CRIU dumps and restores the memfd with the process like any other memory.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::thread::futex;

use crate::errors::code;

pub const MEMFD_NAME: &str = "cuda-sim-ctl";
/// How the fd shows in /proc/PID/fd.
pub const MEMFD_LINK: &str = "/memfd:cuda-sim-ctl (deleted)";
pub const MAGIC: u64 = u64::from_le_bytes(*b"CUDASIM1");
pub const VERSION: u32 = 1;
/// The fd number the driver moves the memfd to, out of the application's way.
pub const MEMFD_FD_MIN: i32 = 1000;
pub const MAX_PAIRS: usize = 16;

/// Process states, numbered as `CUprocessState`.
pub mod state {
    pub const RUNNING: u32 = 0;
    pub const LOCKED: u32 = 1;
    pub const CHECKPOINTED: u32 = 2;
    pub const FAILED: u32 = 3;
}

/// Requested actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    Lock = 1,
    Checkpoint = 2,
    Restore = 3,
    Unlock = 4,
}

impl Op {
    pub fn from_raw(v: u32) -> Option<Op> {
        Some(match v {
            1 => Op::Lock,
            2 => Op::Checkpoint,
            3 => Op::Restore,
            4 => Op::Unlock,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Lock => "lock",
            Op::Checkpoint => "checkpoint",
            Op::Restore => "restore",
            Op::Unlock => "unlock",
        }
    }
}

/// Request slot states.
mod slot {
    pub const FREE: u32 = 0;
    /// A controller owns the slot and is writing a request.
    pub const WRITING: u32 = 1;
    /// The request waits for the helper thread.
    pub const PENDING: u32 = 2;
    /// The helper thread is working on it.
    pub const TAKEN: u32 = 3;
    /// The result is posted.
    pub const DONE: u32 = 4;
}

/// The shared page. Every field is atomic: two processes use it at once.
#[repr(C)]
pub struct ControlBlock {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub state: AtomicU32,
    /// The helper thread's id in the process's own pid namespace.
    pub restore_tid: AtomicI32,
    /// getpid() of the owner in its own pid namespace; a forked copy does not match.
    pub owner: AtomicI32,
    slot: AtomicU32,
    op: AtomicU32,
    timeout_ms: AtomicU32,
    fault: AtomicU32,
    result: AtomicU32,
    /// pid (in the controller's namespace) of the controller that owns the slot.
    controller: AtomicI32,
    npairs: AtomicU32,
    pairs: [AtomicU64; MAX_PAIRS * 4],
}

/// A request as the helper thread sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub timeout_ms: u32,
    /// A `CUresult` the simulation must fail with instead of doing the work (tests).
    pub fault: u32,
    pub pairs: Vec<([u8; 16], [u8; 16])>,
}

fn wait(word: &AtomicU32, seen: u32, until: Option<Instant>) {
    let timeout = until.map(|t| {
        let left = t.saturating_duration_since(Instant::now());
        rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos() as i64,
        }
    });
    // Spurious wake-ups, EINTR, EAGAIN and timeouts all just mean "look again".
    let _ = futex::wait(word, futex::Flags::empty(), seen, timeout.as_ref());
}

fn wake(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

impl ControlBlock {
    /// Sets up a fresh page for the process that owns it.
    pub fn init(&self, owner: i32, restore_tid: i32) {
        self.version.store(VERSION, Ordering::SeqCst);
        self.state.store(state::RUNNING, Ordering::SeqCst);
        self.restore_tid.store(restore_tid, Ordering::SeqCst);
        self.owner.store(owner, Ordering::SeqCst);
        self.slot.store(slot::FREE, Ordering::SeqCst);
        self.magic.store(MAGIC, Ordering::SeqCst);
    }

    pub fn is_valid(&self) -> bool {
        self.magic.load(Ordering::SeqCst) == MAGIC && self.version.load(Ordering::SeqCst) == VERSION
    }

    pub fn state(&self) -> u32 {
        self.state.load(Ordering::SeqCst)
    }

    pub fn set_state(&self, s: u32) {
        self.state.store(s, Ordering::SeqCst);
    }

    // ---- controller side ----

    /// Posts `req` and waits for the helper thread's result.
    ///
    /// `pickup` bounds the wait for the helper to *start*: if it cannot run (the process is
    /// stopped), the request is withdrawn and `CUDA_ERROR_TIMEOUT` returned, so it is never done
    /// later behind the caller's back. Once started, the action runs to completion.
    pub fn call(&self, me: i32, req: &Request, pickup: Duration) -> u32 {
        let deadline = Instant::now() + pickup;
        // Take the slot; a controller that died while holding it does not block us forever.
        loop {
            let s = self.slot.load(Ordering::SeqCst);
            if s == slot::FREE
                && self
                    .slot
                    .compare_exchange(
                        slot::FREE,
                        slot::WRITING,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    )
                    .is_ok()
            {
                break;
            }
            let holder = self.controller.load(Ordering::SeqCst);
            if (s == slot::WRITING || s == slot::DONE)
                && holder > 0
                && holder != me
                && !std::path::Path::new(&format!("/proc/{holder}")).exists()
                && self
                    .slot
                    .compare_exchange(s, slot::WRITING, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                break;
            }
            if Instant::now() >= deadline {
                return code::TIMEOUT;
            }
            wait(
                &self.slot,
                s,
                Some(deadline.min(Instant::now() + Duration::from_millis(50))),
            );
        }
        self.controller.store(me, Ordering::SeqCst);
        self.op.store(req.op as u32, Ordering::SeqCst);
        self.timeout_ms.store(req.timeout_ms, Ordering::SeqCst);
        self.fault.store(req.fault, Ordering::SeqCst);
        let n = req.pairs.len().min(MAX_PAIRS);
        self.npairs.store(n as u32, Ordering::SeqCst);
        for (i, (old, new)) in req.pairs.iter().take(n).enumerate() {
            for (j, half) in [old, new].into_iter().enumerate() {
                for (k, word) in half.chunks_exact(8).enumerate() {
                    self.pairs[i * 4 + j * 2 + k].store(
                        u64::from_le_bytes(word.try_into().unwrap()),
                        Ordering::SeqCst,
                    );
                }
            }
        }
        self.slot.store(slot::PENDING, Ordering::SeqCst);
        wake(&self.slot);
        loop {
            let s = self.slot.load(Ordering::SeqCst);
            match s {
                slot::DONE => {
                    let r = self.result.load(Ordering::SeqCst);
                    self.slot.store(slot::FREE, Ordering::SeqCst);
                    wake(&self.slot);
                    return r;
                }
                slot::PENDING if Instant::now() >= deadline => {
                    if self
                        .slot
                        .compare_exchange(
                            slot::PENDING,
                            slot::FREE,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        )
                        .is_ok()
                    {
                        wake(&self.slot);
                        return code::TIMEOUT;
                    }
                }
                slot::PENDING => wait(&self.slot, s, Some(deadline)),
                _ => wait(&self.slot, s, None),
            }
        }
    }

    // ---- helper thread side ----

    /// Blocks until a request is pending and claims it.
    pub fn next_request(&self) -> Request {
        loop {
            let s = self.slot.load(Ordering::SeqCst);
            if s == slot::PENDING
                && self
                    .slot
                    .compare_exchange(
                        slot::PENDING,
                        slot::TAKEN,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    )
                    .is_ok()
            {
                let n = (self.npairs.load(Ordering::SeqCst) as usize).min(MAX_PAIRS);
                let word = |i: usize| self.pairs[i].load(Ordering::SeqCst).to_le_bytes();
                let half = |i: usize| {
                    let mut out = [0u8; 16];
                    out[..8].copy_from_slice(&word(i));
                    out[8..].copy_from_slice(&word(i + 1));
                    out
                };
                let pairs = (0..n).map(|i| (half(i * 4), half(i * 4 + 2))).collect();
                match Op::from_raw(self.op.load(Ordering::SeqCst)) {
                    Some(op) => {
                        return Request {
                            op,
                            timeout_ms: self.timeout_ms.load(Ordering::SeqCst),
                            fault: self.fault.load(Ordering::SeqCst),
                            pairs,
                        }
                    }
                    None => self.complete(code::INVALID_VALUE),
                }
                continue;
            }
            wait(&self.slot, s, None);
        }
    }

    /// Posts the result of the claimed request.
    pub fn complete(&self, result: u32) {
        self.result.store(result, Ordering::SeqCst);
        self.slot.store(slot::DONE, Ordering::SeqCst);
        wake(&self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::{control_memfd, ControlPage};

    fn page() -> (std::os::fd::OwnedFd, ControlPage) {
        let fd = control_memfd("t").unwrap();
        let p = ControlPage::map(&fd, false).unwrap();
        p.block().init(1, 2);
        (fd, p)
    }

    #[test]
    fn requests_reach_the_helper_and_results_come_back() {
        let (fd, p) = page();
        let helper = ControlPage::map(&fd, false).unwrap();
        let t = std::thread::spawn(move || {
            let req = helper.block().next_request();
            helper
                .block()
                .complete(req.op as u32 * 10 + req.pairs.len() as u32);
            req
        });
        let req = Request {
            op: Op::Restore,
            timeout_ms: 5,
            fault: 0,
            pairs: vec![([1; 16], [2; 16])],
        };
        assert_eq!(p.block().call(99, &req, Duration::from_secs(5)), 31);
        assert_eq!(t.join().unwrap(), req);
    }

    #[test]
    fn a_helper_that_cannot_run_times_out_and_the_request_is_withdrawn() {
        let (_fd, p) = page();
        let req = Request {
            op: Op::Lock,
            timeout_ms: 0,
            fault: 0,
            pairs: vec![],
        };
        let start = Instant::now();
        assert_eq!(
            p.block().call(99, &req, Duration::from_millis(100)),
            code::TIMEOUT
        );
        assert!(start.elapsed() >= Duration::from_millis(100));
        // The slot is free again: the next caller is not blocked by the withdrawn request.
        assert_eq!(p.block().slot.load(Ordering::SeqCst), slot::FREE);
    }
}
