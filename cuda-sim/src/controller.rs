//! The checkpoint API as a controller calls it (`cuda-checkpoint-ctl`, the CRIU plugin): finds
//! the target's control page through /proc and talks to its helper thread. Needs no `cuInit`,
//! like the real driver. Waits as long as the real driver does (docs/driver-facts.md, F2): only
//! the target's death, seen through a pidfd, ends a wait early (F7).

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::fd::OwnedFd;
use std::path::Path;

use crate::control::{Op, Request, MEMFD_LINK};
use crate::errors::code;
use crate::fault;
use crate::shm::ControlPage;
use crate::trace;

pub type CuResult<T> = Result<T, u32>;

/// The innermost namespace id of a task.
fn ns_id(task_path: &str) -> Option<i32> {
    let s = fs::read_to_string(format!("{task_path}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The process a task id belongs to (the driver accepts any thread of the process, as
/// NVIDIA/cuda-checkpoint#41 shows; CRIU's C plugin asks for the state of the restore thread).
fn tgid(pid: i32) -> Option<i32> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// A target process, watched for its death while a controller waits on it.
struct Target {
    tgid: i32,
    /// None where pidfds are not supported; /proc is looked at instead.
    pidfd: Option<OwnedFd>,
}

impl Target {
    fn open(pid: i32) -> CuResult<Target> {
        if pid <= 0 {
            return Err(code::INVALID_VALUE);
        }
        let tgid = tgid(pid).ok_or(code::OPERATING_SYSTEM)?;
        let raw = rustix::process::Pid::from_raw(tgid).ok_or(code::INVALID_VALUE)?;
        let pidfd = match rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) {
            Ok(fd) => Some(fd),
            Err(rustix::io::Errno::SRCH) => return Err(code::OPERATING_SYSTEM),
            Err(_) => None,
        };
        Ok(Target { tgid, pidfd })
    }

    fn gone(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                let now = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                rustix::event::poll(&mut fds, Some(&now)).unwrap_or(0) > 0
            }
            None => !Path::new(&format!("/proc/{}", self.tgid)).exists(),
        }
    }

    /// Opens the target's control memfd as a description of our own and maps it. Errors as the
    /// real driver gives them: a process without CUDA is CUDA_ERROR_NOT_INITIALIZED.
    fn attach(&self) -> CuResult<(File, ControlPage)> {
        let dir = format!("/proc/{}/fd", self.tgid);
        let entries = fs::read_dir(&dir).map_err(|e| match e.kind() {
            ErrorKind::PermissionDenied => code::NOT_PERMITTED,
            ErrorKind::NotFound => code::OPERATING_SYSTEM,
            _ => code::NOT_INITIALIZED,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            if fs::read_link(&path).ok().as_deref() != Some(Path::new(MEMFD_LINK)) {
                continue;
            }
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| match e.kind() {
                    ErrorKind::PermissionDenied => code::NOT_PERMITTED,
                    _ => code::NOT_INITIALIZED,
                })?;
            let page = ControlPage::map(&file, false).map_err(|_| code::OPERATING_SYSTEM)?;
            let owner = ns_id(&format!("/proc/{}", self.tgid));
            if page.block().is_valid()
                && owner == Some(page.block().owner.load(std::sync::atomic::Ordering::SeqCst))
            {
                return Ok((file, page));
            }
        }
        Err(code::NOT_INITIALIZED)
    }
}

/// The checkpoint state, once no action is pending or running on the process (F4).
pub fn state(pid: i32) -> CuResult<u32> {
    let target = Target::open(pid)?;
    let (file, page) = target.attach()?;
    // The helper thread answers, after the requests before it (F4), and only when it can run
    // (F11: a stopped process, or its helper thread held by a debugger, gets no answer).
    let req = Request {
        op: Op::State,
        timeout_ms: 0,
        fault: crate::fault::Fault::None,
        pairs: Vec::new(),
    };
    page.block().call(&file, &req, &|| target.gone())?;
    Ok(page.block().state())
}

/// The helper thread's id, as seen from the caller's pid namespace; answered at once (F5).
pub fn restore_thread_id(pid: i32) -> CuResult<i32> {
    let target = Target::open(pid)?;
    let (_file, page) = target.attach()?;
    let local = page
        .block()
        .restore_tid
        .load(std::sync::atomic::Ordering::SeqCst);
    let tasks =
        fs::read_dir(format!("/proc/{}/task", target.tgid)).map_err(|_| code::OPERATING_SYSTEM)?;
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if ns_id(&format!("/proc/{}/task/{tid}", target.tgid)) == Some(local) {
            return Ok(tid);
        }
    }
    Err(code::NOT_FOUND)
}

/// Runs `op` in process `pid` and waits for its result.
pub fn act(pid: i32, op: Op, timeout_ms: u32, pairs: Vec<([u8; 16], [u8; 16])>) -> CuResult<()> {
    let target = Target::open(pid)?;
    let (file, page) = target.attach()?;
    let fault = fault::injected(op, pid, target.tgid).map_err(|e| {
        eprintln!("cuda-sim: {e}");
        code::INVALID_VALUE
    })?;
    let req = Request {
        op,
        timeout_ms,
        fault,
        pairs,
    };
    let done = page.block().call(&file, &req, &|| target.gone())?;
    trace::record(pid, op, &done);
    match done.result {
        0 => Ok(()),
        c => Err(c),
    }
}

/// Whether a request waits in process `pid`'s slot for its helper thread: what a test of the
/// simulation waits to see before it stops or kills a caller. No driver call: the real driver
/// shows nothing of the kind.
pub fn pending(pid: i32) -> CuResult<bool> {
    let target = Target::open(pid)?;
    let (_file, page) = target.attach()?;
    Ok(page.block().is_pending())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F9: a process without CUDA answers CUDA_ERROR_NOT_INITIALIZED, a missing one
    /// CUDA_ERROR_OPERATING_SYSTEM.
    #[test]
    fn f9_processes_without_cuda_and_missing_processes() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert_eq!(state(pid), Err(code::NOT_INITIALIZED));
        assert_eq!(restore_thread_id(pid), Err(code::NOT_INITIALIZED));
        assert_eq!(act(pid, Op::Lock, 0, vec![]), Err(code::NOT_INITIALIZED));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(state(pid), Err(code::OPERATING_SYSTEM));
        assert_eq!(act(pid, Op::Lock, 0, vec![]), Err(code::OPERATING_SYSTEM));
    }
}
