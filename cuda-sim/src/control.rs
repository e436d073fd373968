//! The control page: how a controller (the checkpoint tool, or CRIU with the plugin) reaches the
//! driver's helper thread inside a CUDA process, as NVIDIA's driver does "through /proc".
//!
//! The page is a memfd that the simulated driver maps shared and keeps open as an fd. A controller
//! finds that fd in `/proc/PID/fd`, opens its own description of it, maps the same memory, posts
//! a request in the slot and wakes the helper thread with a futex; the helper does the work
//! inside the process and posts the result. CRIU dumps and restores the memfd with the process
//! like any other memory.
//!
//! The rules are the real driver's (docs/driver-facts.md):
//! * one request at a time; a second controller waits its turn (F6), holding the queue lock;
//! * nothing times out before the helper takes a request (F2);
//! * a request whose controller died before the helper took it is dropped; one already taken
//!   is finished (F3). A controller holds a lock on a byte of its own for that;
//! * the state is answered only when no request is pending or running (F4); the restore
//!   thread id at once (F5);
//! * a controller whose target dies stops waiting at once (F7).

use std::fs::File;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rustix::thread::futex;

use crate::errors::code;
use crate::fault::Fault;
use crate::ofd;
pub use crate::op::Op;

pub const MEMFD_NAME: &str = "cuda-sim-ctl";
/// How the fd shows in /proc/PID/fd.
pub const MEMFD_LINK: &str = "/memfd:cuda-sim-ctl (deleted)";
pub const MAGIC: u64 = u64::from_le_bytes(*b"CUDASIM1");
pub const VERSION: u32 = 2;
/// The fd number the driver moves the memfd to, out of the application's way.
pub const MEMFD_FD_MIN: i32 = 1000;
pub const MAX_PAIRS: usize = 16;

/// The byte a controller locks while its request occupies the slot (its turn).
const QUEUE_LOCK: i64 = 1 << 20;
/// Byte `LIVE_LOCK + seq` is locked by the controller of request `seq` while it waits.
const LIVE_LOCK: i64 = QUEUE_LOCK + 1;
/// How often a waiting controller looks whether its target still exists.
pub const POLL: Duration = Duration::from_millis(20);

/// Process states, numbered as `CUprocessState`.
pub mod state {
    pub const RUNNING: u32 = 0;
    pub const LOCKED: u32 = 1;
    pub const CHECKPOINTED: u32 = 2;
    pub const FAILED: u32 = 3;
}

/// Request slot states.
mod slot {
    pub const FREE: u32 = 0;
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
    fault_kind: AtomicU32,
    fault_arg: AtomicU32,
    result: AtomicU32,
    /// The request in the slot, and the last number handed out.
    seq: AtomicU64,
    last_seq: AtomicU64,
    /// CLOCK_MONOTONIC when the helper took and finished the request in the slot.
    started_ns: AtomicU64,
    finished_ns: AtomicU64,
    npairs: AtomicU32,
    pairs: [AtomicU64; MAX_PAIRS * 4],
}

/// A request as the helper thread sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub timeout_ms: u32,
    pub fault: Fault,
    pub pairs: Vec<([u8; 16], [u8; 16])>,
}

/// A finished request, as its controller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub result: u32,
    /// The helper's CLOCK_MONOTONIC when it took and when it finished the request.
    pub started_ns: u64,
    pub finished_ns: u64,
}

/// CLOCK_MONOTONIC in nanoseconds, the clock of trace lines.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn wait(word: &AtomicU32, seen: u32, limit: Option<Duration>) {
    let timeout = limit.map(|d| rustix::time::Timespec {
        tv_sec: d.as_secs() as i64,
        tv_nsec: d.subsec_nanos() as i64,
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

    /// A request is posted and its helper thread has not taken it yet.
    pub fn is_pending(&self) -> bool {
        self.slot.load(Ordering::SeqCst) == slot::PENDING
    }

    // ---- controller side ----

    /// Posts `req` and waits for the helper's result, however long it takes (the driver sets
    /// no limit); only the target's death (`gone`) ends the wait early, with
    /// CUDA_ERROR_OPERATING_SYSTEM (F7). `file` is the caller's own open description of the
    /// control memfd: its locks tell the helper that the caller lives.
    pub fn call(&self, file: &File, req: &Request, gone: &dyn Fn() -> bool) -> Result<Done, u32> {
        let os = |_| code::OPERATING_SYSTEM;
        while !ofd::try_lock(file, QUEUE_LOCK).map_err(os)? {
            if gone() {
                return Err(code::OPERATING_SYSTEM);
            }
            std::thread::sleep(POLL);
        }
        self.clear_leftovers(gone)?;
        let seq = self.last_seq.fetch_add(1, Ordering::SeqCst) + 1;
        if !ofd::try_lock(file, LIVE_LOCK + seq as i64).map_err(os)? {
            return Err(code::OPERATING_SYSTEM);
        }
        self.post(seq, req);
        loop {
            let s = self.slot.load(Ordering::SeqCst);
            if s == slot::DONE {
                let done = Done {
                    result: self.result.load(Ordering::SeqCst),
                    started_ns: self.started_ns.load(Ordering::SeqCst),
                    finished_ns: self.finished_ns.load(Ordering::SeqCst),
                };
                self.slot.store(slot::FREE, Ordering::SeqCst);
                wake(&self.slot);
                let _ = ofd::unlock(file, LIVE_LOCK + seq as i64);
                let _ = ofd::unlock(file, QUEUE_LOCK);
                return Ok(done);
            }
            wait(&self.slot, s, Some(POLL));
            if self.slot.load(Ordering::SeqCst) != slot::DONE && gone() {
                return Err(code::OPERATING_SYSTEM);
            }
        }
    }

    /// With the queue lock held, what is in the slot belongs to a controller that died: a
    /// request not yet taken is dropped (F3), a taken one is let finish, a result discarded.
    fn clear_leftovers(&self, gone: &dyn Fn() -> bool) -> Result<(), u32> {
        loop {
            let s = self.slot.load(Ordering::SeqCst);
            match s {
                slot::FREE => return Ok(()),
                slot::TAKEN => {
                    wait(&self.slot, s, Some(POLL));
                    if gone() {
                        return Err(code::OPERATING_SYSTEM);
                    }
                }
                _ => {
                    if self
                        .slot
                        .compare_exchange(s, slot::FREE, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        wake(&self.slot);
                    }
                }
            }
        }
    }

    fn post(&self, seq: u64, req: &Request) {
        let (kind, arg) = req.fault.encode();
        self.seq.store(seq, Ordering::SeqCst);
        self.op.store(req.op as u32, Ordering::SeqCst);
        self.timeout_ms.store(req.timeout_ms, Ordering::SeqCst);
        self.fault_kind.store(kind, Ordering::SeqCst);
        self.fault_arg.store(arg, Ordering::SeqCst);
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
    }

    // ---- helper thread side ----

    /// Blocks until a request is pending and claims it. `file` is the helper's own description
    /// of the memfd; a request whose caller no longer holds its lock is dropped (F3).
    pub fn next_request(&self, file: &impl std::os::fd::AsFd) -> Request {
        loop {
            let s = self.slot.load(Ordering::SeqCst);
            if s != slot::PENDING
                || self
                    .slot
                    .compare_exchange(
                        slot::PENDING,
                        slot::TAKEN,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    )
                    .is_err()
            {
                wait(&self.slot, s, None);
                continue;
            }
            self.started_ns.store(monotonic_ns(), Ordering::SeqCst);
            let seq = self.seq.load(Ordering::SeqCst);
            // An error reading the lock counts as alive: never drop a live caller's request.
            let caller_alive = ofd::held_by_another(file, LIVE_LOCK + seq as i64).unwrap_or(true);
            if !caller_alive {
                self.slot.store(slot::FREE, Ordering::SeqCst);
                wake(&self.slot);
                continue;
            }
            match Op::from_raw(self.op.load(Ordering::SeqCst)) {
                Some(op) => return self.read_request(op),
                None => self.complete(code::INVALID_VALUE),
            }
        }
    }

    fn read_request(&self, op: Op) -> Request {
        let n = (self.npairs.load(Ordering::SeqCst) as usize).min(MAX_PAIRS);
        let word = |i: usize| self.pairs[i].load(Ordering::SeqCst).to_le_bytes();
        let half = |i: usize| {
            let mut out = [0u8; 16];
            out[..8].copy_from_slice(&word(i));
            out[8..].copy_from_slice(&word(i + 1));
            out
        };
        Request {
            op,
            timeout_ms: self.timeout_ms.load(Ordering::SeqCst),
            fault: Fault::decode(
                self.fault_kind.load(Ordering::SeqCst),
                self.fault_arg.load(Ordering::SeqCst),
            ),
            pairs: (0..n).map(|i| (half(i * 4), half(i * 4 + 2))).collect(),
        }
    }

    /// Posts the result of the claimed request.
    pub fn complete(&self, result: u32) {
        self.finished_ns.store(monotonic_ns(), Ordering::SeqCst);
        self.result.store(result, Ordering::SeqCst);
        self.slot.store(slot::DONE, Ordering::SeqCst);
        wake(&self.slot);
    }
}

#[cfg(test)]
mod tests;
