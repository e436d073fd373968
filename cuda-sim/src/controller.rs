//! The checkpoint API as a controller calls it (`cuda-checkpoint-ctl`, the CRIU plugin): finds
//! the target's control page through /proc and talks to its helper thread. Needs no `cuInit`,
//! like the real driver.

use std::fs;
use std::io::ErrorKind;
use std::time::Duration;

use crate::control::{Op, Request, MEMFD_LINK};
use crate::errors::{code, injected_fault};
use crate::shm::ControlPage;

pub type CuResult<T> = Result<T, u32>;

/// How long an action waits for the helper thread to start it. The real driver (r580) waits
/// without limit, even for a lock with a timeout (measured: a lock of a SIGSTOPped process with
/// timeoutMs=2000 was still waiting minutes later); the simulation gives up after this long with
/// CUDA_ERROR_TIMEOUT, so a test of a stopped process cannot hang.
pub const PICKUP_ENV: &str = "CUDA_SIM_PICKUP_TIMEOUT_MS";
const DEFAULT_PICKUP: Duration = Duration::from_secs(30);

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

/// Maps the control page of process `pid`. Errors as the real driver gives them: no such
/// process is CUDA_ERROR_OPERATING_SYSTEM, a process without CUDA CUDA_ERROR_NOT_INITIALIZED.
fn attach(pid: i32) -> CuResult<ControlPage> {
    if pid <= 0 {
        return Err(code::INVALID_VALUE);
    }
    let pid = tgid(pid).unwrap_or(pid);
    let dir = format!("/proc/{pid}/fd");
    let entries = fs::read_dir(&dir).map_err(|e| match e.kind() {
        ErrorKind::PermissionDenied => code::NOT_PERMITTED,
        ErrorKind::NotFound => code::OPERATING_SYSTEM,
        _ => code::NOT_INITIALIZED,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        if fs::read_link(&path).ok().as_deref() != Some(std::path::Path::new(MEMFD_LINK)) {
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
        let owner = ns_id(&format!("/proc/{pid}"));
        if page.block().is_valid()
            && owner == Some(page.block().owner.load(std::sync::atomic::Ordering::SeqCst))
        {
            return Ok(page);
        }
    }
    Err(code::NOT_INITIALIZED)
}

pub fn state(pid: i32) -> CuResult<u32> {
    Ok(attach(pid)?.block().state())
}

/// The helper thread's id, as seen from the caller's pid namespace.
pub fn restore_thread_id(pid: i32) -> CuResult<i32> {
    let pid = tgid(pid).unwrap_or(pid);
    let local = attach(pid)?
        .block()
        .restore_tid
        .load(std::sync::atomic::Ordering::SeqCst);
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| code::OPERATING_SYSTEM)?;
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if ns_id(&format!("/proc/{pid}/task/{tid}")) == Some(local) {
            return Ok(tid);
        }
    }
    Err(code::NOT_FOUND)
}

/// Runs `op` in process `pid` and waits for its result.
pub fn act(pid: i32, op: Op, timeout_ms: u32, pairs: Vec<([u8; 16], [u8; 16])>) -> CuResult<()> {
    let page = attach(pid)?;
    let pickup = std::env::var(PICKUP_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(DEFAULT_PICKUP, Duration::from_millis);
    let me = std::process::id() as i32;
    let req = Request {
        op,
        timeout_ms,
        fault: injected_fault(op),
        pairs,
    };
    match page.block().call(me, &req, pickup) {
        0 => Ok(()),
        c => Err(c),
    }
}
