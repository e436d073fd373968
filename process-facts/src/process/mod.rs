//! Which processes to act on: a pid, a process tree, a cgroup or the whole machine; and the
//! facts about a process this crate needs from /proc. The one place that reads /proc.

mod environ;
mod files;
mod hold;
pub mod io_uring;
pub mod maps;
pub mod memory;
mod net;

pub use self::environ::{environ, in_root};
pub use self::files::{
    fds, has_terminal, holds_file_locks, lock_holders, session, socket_inodes, unlinked, Unlinked,
};
pub use self::hold::{frozen_cgroup, hold, tgid, CgroupVersion, Freezer, Hold};
pub use self::io_uring::{
    busy_workers, io_uring, parse_fdinfo, refusals, rings, IoUring, Ring, RingInfo,
};
pub use self::net::{tcp_sockets, TcpSocket, TcpState};

use std::collections::{BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

/// The root of the cgroup v2 hierarchy.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Why a selector names no processes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("process {0} does not exist")]
    NoSuchProcess(i32),
    #[error("cgroup {path}: {reason}")]
    Cgroup { path: String, reason: String },
}

/// A set of processes named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// One process.
    Pid(i32),
    /// A process and all its descendants.
    Tree(i32),
    /// Every process in a cgroup and its sub-cgroups (a container, a pod, a slice).
    Cgroup(PathBuf),
    /// Every process on the machine.
    All,
}

impl Selector {
    /// The pids, parents before children for trees; errors if a named root does not exist.
    pub fn resolve(&self) -> Result<Vec<i32>, SelectError> {
        match self {
            Selector::Pid(pid) => {
                require_exists(*pid)?;
                Ok(vec![*pid])
            }
            Selector::Tree(root) => {
                require_exists(*root)?;
                Ok(tree(*root))
            }
            Selector::Cgroup(path) => cgroup_pids(path),
            Selector::All => Ok(all_pids()),
        }
    }
}

fn require_exists(pid: i32) -> Result<(), SelectError> {
    if pid > 0 && exists(pid) {
        Ok(())
    } else {
        Err(SelectError::NoSuchProcess(pid))
    }
}

pub fn exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The children of every thread of `pid` (a child belongs to the thread that forked it).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = BTreeSet::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    for task in tasks.flatten() {
        if let Ok(list) = fs::read_to_string(task.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out.into_iter().collect()
}

/// `root` and its descendants, breadth first.
pub fn tree(root: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = VecDeque::from([root]);
    while let Some(pid) = queue.pop_front() {
        if out.contains(&pid) {
            continue;
        }
        out.push(pid);
        queue.extend(children(pid));
    }
    out
}

pub fn all_pids() -> Vec<i32> {
    let mut pids: Vec<i32> = fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    pids
}

/// Processes of a cgroup and its descendants. `path` is absolute or relative to the v2 root.
pub fn cgroup_pids(path: &Path) -> Result<Vec<i32>, SelectError> {
    let dir = if path.is_absolute() {
        path.to_path_buf()
    } else {
        Path::new(CGROUP_ROOT).join(path)
    };
    let err = |reason: String| SelectError::Cgroup {
        path: dir.display().to_string(),
        reason,
    };
    if !dir.join("cgroup.procs").exists() {
        return Err(err(
            "no cgroup.procs here: name a cgroup directory, e.g. /sys/fs/cgroup/machine.slice/libpod-ID.scope"
                .into(),
        ));
    }
    let mut pids = BTreeSet::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        let procs = fs::read_to_string(d.join("cgroup.procs")).map_err(|e| err(e.to_string()))?;
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        for entry in fs::read_dir(&d).map_err(|e| err(e.to_string()))?.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(entry.path());
            }
        }
    }
    Ok(pids.into_iter().collect())
}

/// What /proc tells about a process's use of CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inspection {
    /// It maps a CUDA driver library.
    MapsCuda,
    NoCuda,
    /// Its memory map may not be read by this user: it may or may not use CUDA.
    Denied,
    /// It exited meanwhile.
    Gone,
}

/// Whether `pid` has a CUDA driver library mapped: a cheap filter before asking the driver,
/// which stays true while the process is checkpointed (its device files are closed then).
pub fn inspect(pid: i32) -> Inspection {
    match fs::read_to_string(format!("/proc/{pid}/maps")) {
        Ok(m) if m.contains("/libcuda.so") => Inspection::MapsCuda,
        Ok(_) => Inspection::NoCuda,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Inspection::Denied,
        Err(_) if !exists(pid) => Inspection::Gone,
        Err(_) => Inspection::NoCuda,
    }
}

/// Whether this process runs as root (effective uid 0), which may inspect any process but
/// those that are not dumpable or belong to another user namespace.
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// [`inspect`] as a yes/no: unreadable processes count as not using CUDA.
pub fn maps_libcuda(pid: i32) -> bool {
    inspect(pid) == Inspection::MapsCuda
}

/// The pid of `pid` inside its own (innermost) pid namespace.
pub fn ns_pid(pid: i32) -> Option<i32> {
    status(pid)?.nspid?.last().copied()
}

/// The tracer of a thread (0 if none).
pub fn tracer(tid: i32) -> Option<i32> {
    Some(status(tid)?.tracerpid)
}

/// The command name (`comm`).
pub fn comm(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}

/// The command name for messages: `?` when the process is gone.
pub fn name(pid: i32) -> String {
    comm(pid).unwrap_or_else(|| "?".into())
}

fn status(pid: i32) -> Option<procfs::process::Status> {
    procfs::process::Process::new(pid).ok()?.status().ok()
}

// ---- Facts about a process that checkpointing needs: whether it can run, and who holds it ----

/// The start time of a process (clock ticks since boot): with the pid, it names the process
/// (a pid can be reused, the pair cannot).
pub fn starttime(pid: i32) -> Option<u64> {
    Some(
        procfs::process::Process::new(pid)
            .ok()?
            .stat()
            .ok()?
            .starttime,
    )
}

/// The parent process.
pub fn parent(pid: i32) -> Option<i32> {
    Some(status(pid)?.ppid)
}

/// An exited process not yet reaped.
pub fn is_zombie(pid: i32) -> bool {
    procfs::process::Process::new(pid)
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.state == 'Z' || s.state == 'X')
}

/// Whether the process is dead or on its way out: a zombie, or past the start of its exit
/// (PF_EXITING, set as soon as a SIGKILL is acted on; freeing gigabytes of memory then takes
/// seconds, during which the process still looks alive).
pub fn is_dying(pid: i32) -> bool {
    const PF_EXITING: u32 = 0x4;
    procfs::process::Process::new(pid)
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.state == 'Z' || s.state == 'X' || s.flags & PF_EXITING != 0)
}

/// A thread's scheduling state letter (`R`, `S`, `T` stopped, `t` traced, ...) and its tracer
/// (0: none).
pub fn thread_state(pid: i32, tid: i32) -> Option<(char, i32)> {
    let status = procfs::process::Process::new(pid)
        .ok()?
        .task_from_tid(tid)
        .ok()?
        .status()
        .ok()?;
    Some((status.state.chars().next()?, status.tracerpid))
}

/// What a process has mapped, as far as checkpointing cares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Libraries {
    /// A CUDA driver library: the process may hold CUDA state.
    pub libcuda: bool,
    /// NCCL: collectives with other processes may be in flight.
    pub nccl: bool,
}

/// Reads `/proc/PID/maps` once for the libraries that matter. An unreadable map is an error:
/// without it the process cannot be told apart from one without CUDA.
pub fn libraries(pid: i32) -> std::io::Result<Libraries> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(Libraries {
        libcuda: maps.contains("/libcuda.so"),
        nccl: maps.contains("/libnccl.so") || maps.contains("/libnccl-"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn tree_finds_children_and_grandchildren() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut found = Vec::new();
        for _ in 0..100 {
            found = tree(pid);
            if found.len() == 3 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found.len(), 3, "{found:?}");
        assert_eq!(found[0], pid);
    }

    #[test]
    fn own_process_facts() {
        let me = std::process::id() as i32;
        assert!(exists(me));
        assert!(Selector::Pid(me).resolve().is_ok());
        assert!(matches!(
            Selector::Pid(i32::MAX).resolve(),
            Err(SelectError::NoSuchProcess(_))
        ));
        assert!(ns_pid(me).is_some());
        assert_eq!(tracer(me), Some(0));
        assert!(!maps_libcuda(me));
        assert_eq!(inspect(me), Inspection::NoCuda);
        assert_eq!(inspect(i32::MAX), Inspection::Gone);
        assert_eq!(hold(me, me), None);
    }

    #[test]
    fn a_stopped_process_is_seen_stopped() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let sent = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let seen = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            hold(pid, pid) == Some(Hold::Stopped)
        });
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(seen);
    }

    #[test]
    fn cgroup_must_be_a_cgroup() {
        let err = cgroup_pids(Path::new("/tmp")).unwrap_err();
        assert!(err.to_string().contains("cgroup.procs"), "{err}");
    }
}
