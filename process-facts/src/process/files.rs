//! What a process holds that CRIU needs told about: open and mapped files that were unlinked
//! (dumped whole as "ghost files", up to `--ghost-limit`), a terminal (`--shell-job`), file locks
//! (`--file-locks`), sockets (their inodes, matched with [`super::net`]), and its session.

use std::fs;
use std::os::unix::fs::MetadataExt;

/// A file the process holds open or mapped whose name was unlinked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unlinked {
    /// The path it had.
    pub path: String,
    pub size: u64,
}

/// Names that look unlinked but are not files CRIU dumps as ghosts: shared anonymous memory,
/// memfds, SysV shared memory, anonymous inodes.
fn is_ghost_candidate(path: &str) -> bool {
    path.starts_with('/')
        && !path.starts_with("/dev/zero")
        && !path.starts_with("/memfd:")
        && !path.starts_with("/SYSV")
}

/// The process's open fds and what each points to.
pub fn fds(pid: i32) -> std::io::Result<Vec<(i32, String)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(format!("/proc/{pid}/fd"))?.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Ok(t) = fs::read_link(e.path()) {
            out.push((fd, t.to_string_lossy().into_owned()));
        }
    }
    out.sort();
    Ok(out)
}

/// Unlinked files the process holds open or maps (each once, by path).
pub fn unlinked(pid: i32) -> std::io::Result<Vec<Unlinked>> {
    let mut out: Vec<Unlinked> = Vec::new();
    let mut add = |path: &str, size: u64| {
        if is_ghost_candidate(path) && !out.iter().any(|u| u.path == path) {
            out.push(Unlinked {
                path: path.to_owned(),
                size,
            });
        }
    };
    for (fd, target) in fds(pid)? {
        if let Some(path) = target.strip_suffix(" (deleted)") {
            let size = fs::metadata(format!("/proc/{pid}/fd/{fd}")).map_or(0, |m| m.size());
            add(path, size);
        }
    }
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    for line in maps.lines() {
        let Some(path) = line.strip_suffix(" (deleted)") else {
            continue;
        };
        let range = line.split_whitespace().next().unwrap_or("");
        let Some(path) = path.split_whitespace().nth(5) else {
            continue;
        };
        let size = fs::metadata(format!("/proc/{pid}/map_files/{range}")).map_or(0, |m| m.size());
        add(path, size);
    }
    Ok(out)
}

/// Whether the process has a terminal open (a shell's job: CRIU needs `--shell-job`).
pub fn has_terminal(pid: i32) -> bool {
    fds(pid).is_ok_and(|f| {
        f.iter()
            .any(|(_, t)| t.starts_with("/dev/pts/") || t.starts_with("/dev/tty"))
    })
}

/// The process group and session of a process.
pub fn session(pid: i32) -> Option<(i32, i32)> {
    let s = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    Some((s.pgrp, s.session))
}

/// The inodes of the sockets the process holds.
pub fn socket_inodes(pid: i32) -> Vec<u64> {
    fds(pid)
        .unwrap_or_default()
        .iter()
        .filter_map(|(_, t)| t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .collect()
}

/// Whether the process holds a file lock through one of its open files: an flock, a POSIX
/// (fcntl) or open-file-description lock, or a lease, each a `lock:` line of its fd's
/// /proc/PID/fdinfo/N. CRIU reads the same lines and refuses a dump without --file-locks for any
/// of them. /proc/locks alone misses the locks it names another pid for: an OFD lock (pid -1), or
/// an flock taken on a file description the process inherited (the pid of whoever took it: the
/// `flock` command of a script, long gone).
pub fn holds_file_locks(pid: i32) -> bool {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return false;
    };
    dir.flatten().any(|e| {
        fs::read_to_string(e.path()).is_ok_and(|info| info.lines().any(|l| l.starts_with("lock:")))
    })
}

/// The pids holding POSIX or flock locks (`/proc/locks`).
pub fn lock_holders() -> Vec<i32> {
    let text = fs::read_to_string("/proc/locks").unwrap_or_default();
    holders_in(&text)
}

fn holders_in(text: &str) -> Vec<i32> {
    // "1: POSIX  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; blocked waiters start "1: -> ".
    let mut pids: Vec<i32> = text
        .lines()
        .filter(|l| !l.contains("->"))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_on_an_open_file_is_seen_in_its_fdinfo() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!holds_file_locks(std::process::id() as i32));
        // util-linux's flock(1) holds the lock on the file it opened while its command runs.
        let mut holder = std::process::Command::new("flock")
            .arg(dir.path().join("lock"))
            .args(["sleep", "30"])
            .spawn()
            .unwrap();
        let pid = holder.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !holds_file_locks(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let held = holds_file_locks(pid);
        let _ = holder.kill();
        let _ = holder.wait();
        assert!(held, "flock's lock is in its fdinfo");
    }

    #[test]
    fn lock_holders_are_read_from_proc_locks() {
        let text = "1: POSIX  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                    1: -> POSIX  ADVISORY  WRITE 99 fd:01:5678 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 77 00:16:10 0 EOF\n";
        assert_eq!(holders_in(text), vec![77, 1234]);
    }

    #[test]
    fn an_unlinked_file_is_found_with_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ghost");
        std::fs::write(&p, vec![0u8; 5000]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        let found = unlinked(std::process::id() as i32).unwrap();
        let me = found
            .iter()
            .find(|u| u.path == p.display().to_string())
            .unwrap_or_else(|| panic!("{found:?}"));
        assert_eq!(me.size, 5000);
        drop(f);
        assert!(!is_ghost_candidate("/dev/zero"));
        assert!(!is_ghost_candidate("/memfd:x"));
    }
}
