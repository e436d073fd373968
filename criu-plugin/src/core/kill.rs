//! Ending restored processes from inside CRIU, where the plugin's hooks run in the tracer.
//!
//! A restore the plugin must fail in RESUME_DEVICES_LATE (CRIU ignores that hook's errors)
//! kills the restored processes while CRIU still holds every thread of them in ptrace-stop.
//! A traced thread that dies stays a zombie until its tracer waits for it, and a thread group
//! leader cannot be waited for by its parent while any such thread is left. CRIU never waits
//! for threads: when the restored root is the init of a pid namespace (every container), CRIU's
//! failure path waits for that init without end, and so do the runtime above it (runc, Podman,
//! containerd's shim). Reaping here what only the tracer can reap lets the failure end.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// SIGKILLs process `pid` and waits, at most `limit`, until each of its threads is gone,
/// reaping those this process must reap (as their tracer, or the leader as its parent). Threads
/// it neither traces nor parents are left to theirs. Returns how many it reaped.
pub fn kill_and_reap(pid: i32, limit: Duration) -> usize {
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // The leader last: it can be waited for only once the other threads are gone.
    tids.sort_by_key(|&t| t == pid);
    if tids.is_empty() {
        tids.push(pid);
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    let deadline = Instant::now() + limit;
    let mut reaped = 0;
    loop {
        tids.retain(|&t| {
            match waitpid(
                Pid::from_raw(t),
                Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG),
            ) {
                Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => true,
                Ok(_) => {
                    reaped += 1;
                    false
                }
                // Not ours to wait for (or gone already).
                Err(_) => false,
            }
        });
        if tids.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if !tids.is_empty() {
        tracing::warn!("threads {tids:?} of killed process {pid} were still there after {limit:?}");
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::ptrace;
    use nix::unistd::{fork, ForkResult};

    /// A traced, stopped, multi-threaded child: killed, every thread reaped, nothing left for
    /// anyone to wait for (the leader included).
    #[test]
    fn a_traced_multi_threaded_process_is_killed_and_reaped() {
        // SAFETY: the child only sleeps in threads and pauses; it never returns into the test
        // harness (it is killed), and fork in a test binary is what the other tests here do too.
        let child = match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                for _ in 0..3 {
                    std::thread::spawn(|| loop {
                        std::thread::sleep(Duration::from_secs(1))
                    });
                }
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            ForkResult::Parent { child } => child,
        };
        let pid = child.as_raw();
        let count = || {
            std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| d.count())
                .unwrap_or(0)
        };
        let start = Instant::now();
        while count() < 4 && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(count(), 4);
        let tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        // Traced as CRIU holds them: seized and interrupted, every thread.
        for &t in &tids {
            ptrace::seize(Pid::from_raw(t), ptrace::Options::empty()).unwrap();
            ptrace::interrupt(Pid::from_raw(t)).unwrap();
            waitpid(Pid::from_raw(t), Some(WaitPidFlag::__WALL)).unwrap();
        }
        let reaped = kill_and_reap(pid, Duration::from_secs(5));
        assert_eq!(reaped, 4, "three threads and the leader");
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        assert_eq!(
            waitpid(child, Some(WaitPidFlag::WNOHANG)),
            Err(Errno::ECHILD)
        );
    }
}
