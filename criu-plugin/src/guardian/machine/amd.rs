//! AMD: restarting a ROCm process's GPU queues from the guardian, once CRIU is gone (the
//! guardian's [`KfdQueues`]).
//!
//! amdkfd takes a CRIU operation (PROCESS_INFO, CHECKPOINT, UNPAUSE) on a process's KFD file
//! from two callers only: the process that opened it, and the thread that ptrace-traces the
//! process's leader (`kfd_ioctl`: `ptrace_parent(process->lead_thread) == current`); either needs
//! CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN as well. During a dump that thread is CRIU's, which
//! seized the tree. When CRIU dies, the kernel detaches every process it traced, before CRIU's
//! pidfd reports its end, and the processes run on the CPU again, their GPU queues still paused.
//! The guardian holds the same open file (the plugin handed it over before the pause), so it
//! only has to become the tracer: a thread of its own seizes the leader (PTRACE_SEIZE does not
//! stop the process), issues UNPAUSE, and ends, which detaches the process again (the kernel
//! releases a tracer's tracees when it exits, as it did when CRIU died).

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use amd_kfd::device::Kfd;
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::unistd::Pid;

use super::{KfdQueues, Unpaused};

/// How long the guardian waits for another tracer to let the process go: CRIU itself while it
/// is still ending (its end of the guardian's link closes before it has released its tracees).
const TRACER_GONE: Duration = Duration::from_secs(5);

/// This machine's KFD, whose calls the guardian makes as the tracer of the process.
pub struct AsTracer(pub Box<dyn Kfd>);

impl KfdQueues for AsTracer {
    /// UNPAUSE on `file`, process `pid`'s KFD file, as the tracer of `pid`.
    fn unpause(&self, pid: i32, file: BorrowedFd<'_>) -> Result<Unpaused, String> {
        let kfd = self.0.as_ref();
        std::thread::scope(|s| {
            // The thread that seizes is the tracer the kernel checks; it ends right after.
            s.spawn(|| as_tracer(kfd, pid, file))
                .join()
                .unwrap_or_else(|_| Err("the guardian's thread failed".to_owned()))
        })
    }
}

fn as_tracer(kfd: &dyn Kfd, pid: i32, file: BorrowedFd<'_>) -> Result<Unpaused, String> {
    match seize(pid)? {
        Seized::Gone => return Ok(Unpaused::Gone),
        Seized::Yes => {}
    }
    match kfd.unpause(file) {
        Ok(()) => Ok(Unpaused::Running),
        Err(e) if e.errno == Some(libc::EINVAL) => Ok(Unpaused::WasNot),
        Err(e) => Err(e.to_string()),
    }
}

enum Seized {
    Yes,
    Gone,
}

fn seize(pid: i32) -> Result<Seized, String> {
    let start = Instant::now();
    loop {
        match ptrace::seize(Pid::from_raw(pid), ptrace::Options::empty()) {
            Ok(()) => return Ok(Seized::Yes),
            Err(Errno::ESRCH) => return Ok(Seized::Gone),
            Err(Errno::EPERM) if start.elapsed() < TRACER_GONE => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                let tracer = process_facts::process::tracer(pid).filter(|t| *t != 0);
                return Err(match tracer {
                    Some(t) => format!(
                        "it is traced by process {t}, and amdkfd takes the call only from the \
                         process or its tracer ({e})"
                    ),
                    None => format!("the guardian cannot trace it ({e})"),
                });
            }
        }
    }
}
