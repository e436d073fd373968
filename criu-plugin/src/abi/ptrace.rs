//! Lets one thread of a task that CRIU holds in ptrace-stop run for a while, then stops it
//! again: the GPU driver's helper ("restore") thread must run for checkpoint and restore to
//! finish, while every other thread of the process stays stopped.
//!
//! Ptrace requests must come from the tracer thread, which is CRIU's main thread, where all
//! hooks run; only the driver calls themselves go to worker threads.

use std::ffi::c_void;

use nix::sys::ptrace::{self, Options};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::core::{Released, ThreadControl};

const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
/// Not in nix's list: seccomp filters do not apply to the tracee while set (CRIU sets it).
const PTRACE_O_SUSPEND_SECCOMP: libc::c_int = 1 << 21;
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;

fn sigmask(tid: i32, request: libc::c_uint, mask: &mut u64) -> Result<(), String> {
    // SAFETY: GETSIGMASK/SETSIGMASK read or write one 8-byte kernel sigset at `mask`, whose size
    // is passed as `addr`, as ptrace(2) documents.
    let r = unsafe {
        libc::ptrace(
            request,
            tid,
            std::mem::size_of::<u64>() as *mut c_void,
            mask as *mut u64 as *mut c_void,
        )
    };
    if r < 0 {
        Err(format!(
            "ptrace sigmask of thread {tid}: {}",
            std::io::Error::last_os_error()
        ))
    } else {
        Ok(())
    }
}

fn traced_by_me(tid: i32) -> bool {
    cuda_checkpoint_ctl::process::tracer(tid) == Some(std::process::id() as i32)
}

/// The real thing, for use inside CRIU.
pub struct Ptrace;

impl ThreadControl for Ptrace {
    fn release(&self, tid: i32) -> Result<Released, String> {
        if !traced_by_me(tid) {
            // Not seized (yet, or any more): the thread runs on its own.
            return Ok(Released {
                tid,
                saved_mask: None,
            });
        }
        let mut saved = 0u64;
        sigmask(tid, PTRACE_GETSIGMASK, &mut saved)?;
        // No signal may be delivered to the process while CRIU holds it: block them all in the
        // thread (SIGTRAP stays open for ptrace's own use).
        let mut blocked = !(1u64 << (libc::SIGTRAP - 1));
        sigmask(tid, PTRACE_SETSIGMASK, &mut blocked)?;
        let t = Pid::from_raw(tid);
        // Without PTRACE_O_SUSPEND_SECCOMP the thread runs under its own seccomp filters, as
        // it would unseized.
        ptrace::setoptions(t, Options::empty())
            .and_then(|()| ptrace::cont(t, None::<Signal>))
            .map_err(|e| format!("ptrace resume of thread {tid}: {e}"))?;
        Ok(Released {
            tid,
            saved_mask: Some(saved),
        })
    }

    fn recapture(&self, r: Released) -> Result<(), String> {
        let Some(mut saved) = r.saved_mask else {
            return Ok(());
        };
        let t = Pid::from_raw(r.tid);
        ptrace::interrupt(t).map_err(|e| format!("ptrace interrupt of thread {}: {e}", r.tid))?;
        match waitpid(t, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::PtraceEvent(..)) | Ok(WaitStatus::Stopped(..)) => {}
            other => return Err(format!("thread {} did not stop again: {other:?}", r.tid)),
        }
        let criu_options =
            Options::from_bits_retain(PTRACE_O_SUSPEND_SECCOMP) | Options::PTRACE_O_TRACESYSGOOD;
        ptrace::setoptions(t, criu_options)
            .map_err(|e| format!("ptrace options of thread {}: {e}", r.tid))?;
        sigmask(r.tid, PTRACE_SETSIGMASK, &mut saved)
    }
}
