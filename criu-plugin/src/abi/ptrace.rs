//! Lets one thread of a task that CRIU holds in ptrace-stop run for a while, then stops it
//! again: the GPU driver's helper ("restore") thread must run for checkpoint and restore to
//! finish, while every other thread of the process stays stopped.
//!
//! Ptrace requests must come from the tracer thread, which is CRIU's main thread, where all
//! hooks run.

use std::ffi::c_void;

use nix::sys::ptrace::{self, Options};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::core::{Released, ThreadControl, ThreadError};

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
            "ptrace sigmask: {}",
            std::io::Error::last_os_error()
        ))
    } else {
        Ok(())
    }
}

fn traced_by_me(tid: i32) -> bool {
    process_facts::process::tracer(tid) == Some(std::process::id() as i32)
}

fn is_job_control_stop(sig: Signal) -> bool {
    matches!(
        sig,
        Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
    )
}

/// The real thing, for use inside CRIU.
pub struct Ptrace;

impl ThreadControl for Ptrace {
    fn release(&self, pid: i32, tid: i32) -> Result<Released, ThreadError> {
        if !traced_by_me(tid) {
            // Not seized (yet, or any more): the thread runs on its own.
            return Ok(Released {
                pid,
                tid,
                saved_mask: None,
            });
        }
        let fail = |reason: String| ThreadError::Release { pid, tid, reason };
        let mut saved = 0u64;
        sigmask(tid, PTRACE_GETSIGMASK, &mut saved).map_err(fail)?;
        // No signal may be delivered to the process while CRIU holds it: block them all in the
        // thread (SIGTRAP stays open for ptrace's own use; SIGKILL and SIGSTOP cannot be
        // blocked, see `take_signal`).
        let mut blocked = !(1u64 << (libc::SIGTRAP - 1));
        sigmask(tid, PTRACE_SETSIGMASK, &mut blocked).map_err(fail)?;
        let t = Pid::from_raw(tid);
        // Without PTRACE_O_SUSPEND_SECCOMP the thread runs under its own seccomp filters, as
        // it would unseized.
        ptrace::setoptions(t, Options::empty())
            .and_then(|()| ptrace::cont(t, None::<Signal>))
            .map_err(|e| fail(format!("resume: {e}")))?;
        Ok(Released {
            pid,
            tid,
            saved_mask: Some(saved),
        })
    }

    fn recapture(&self, r: &Released) -> Result<(), ThreadError> {
        let Some(mut saved) = r.saved_mask else {
            return Ok(());
        };
        let fail = |reason: String| ThreadError::Recapture {
            pid: r.pid,
            tid: r.tid,
            reason,
        };
        let t = Pid::from_raw(r.tid);
        ptrace::interrupt(t).map_err(|e| fail(format!("interrupt: {e}")))?;
        let mut held = None;
        loop {
            match waitpid(t, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::PtraceEvent(..)) => break,
                // A stop signal arrived before the interrupt: kept back until the thread is
                // stopped, then queued again for when CRIU lets the process go.
                Ok(WaitStatus::Stopped(_, sig)) if sig != Signal::SIGTRAP => {
                    held = Some(sig);
                    ptrace::cont(t, None::<Signal>).map_err(|e| fail(format!("{e}")))?;
                }
                Ok(WaitStatus::Stopped(..)) => break,
                other => return Err(fail(format!("did not stop again: {other:?}"))),
            }
        }
        let criu_options =
            Options::from_bits_retain(PTRACE_O_SUSPEND_SECCOMP) | Options::PTRACE_O_TRACESYSGOOD;
        ptrace::setoptions(t, criu_options).map_err(|e| fail(format!("options: {e}")))?;
        sigmask(r.tid, PTRACE_SETSIGMASK, &mut saved).map_err(fail)?;
        if let Some(sig) = held {
            let _ = nix::sys::signal::kill(Pid::from_raw(r.pid), sig);
        }
        Ok(())
    }

    fn take_signal(&self, r: &Released) -> Option<i32> {
        r.saved_mask?;
        let t = Pid::from_raw(r.tid);
        match waitpid(t, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            // A SIGSTOP (the only signal that can reach it) stopped the thread: without this
            // the driver's action would wait for ever behind it.
            Ok(WaitStatus::Stopped(_, sig)) => {
                let _ = ptrace::cont(t, None::<Signal>);
                Some(sig as i32)
            }
            Ok(WaitStatus::PtraceEvent(..)) => {
                let _ = ptrace::cont(t, None::<Signal>);
                None
            }
            _ => None,
        }
    }

    fn raise(&self, pid: i32, sig: i32) {
        if let Ok(sig) = Signal::try_from(sig) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
        }
    }

    fn seized_stop_signal(&self, pid: i32) -> Option<i32> {
        let t = Pid::from_raw(pid);
        // The main thread's stop, as CRIU's seize left it: a group stop reports the signal
        // that stopped the task, an interrupt-stop SIGTRAP.
        let si = ptrace::getsiginfo(t).ok()?;
        let sig = Signal::try_from(si.si_signo).ok()?;
        is_job_control_stop(sig).then_some(sig as i32)
    }
}
