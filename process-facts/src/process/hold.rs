//! Whether a thread of a process can run, and if not, what holds it and how to let it go: a
//! stop signal, a tracer's ptrace stop, a cgroup freezer (v1 `freezer.state`, v2
//! `cgroup.freeze`, found through this process's mounts, hybrid machines included).

use std::fs;
use std::path::{Path, PathBuf};

use super::{name, status, thread_state};

/// The cgroup a process is in, when that cgroup (or an ancestor) is frozen: its threads cannot
/// run until it is thawed. The cgroup named is the one whose freezer holds it.
pub fn frozen_cgroup(pid: i32) -> Option<PathBuf> {
    freezer_of(&format!("/proc/{pid}")).map(|f| f.cgroup)
}

/// Why a thread cannot run now (so a driver call that needs it waits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Stopped by a signal (SIGSTOP, Ctrl-Z): the whole process is.
    Stopped,
    /// Held in a ptrace stop by a tracer (a debugger; CRIU while it dumps).
    Traced {
        tid: i32,
        tracer: i32,
        tracer_comm: String,
    },
    /// In a frozen cgroup.
    Frozen(Freezer),
}

/// A cgroup freezer that holds a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freezer {
    /// The cgroup whose own freezer is set: thawing it lets the process run (unless an
    /// ancestor is frozen too, which is then named next).
    pub cgroup: PathBuf,
    pub version: CgroupVersion,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The v1 freezer controller (`freezer.state`).
    V1,
    /// cgroup v2's core freezer (`cgroup.freeze`).
    V2,
}

impl Freezer {
    /// The file to write, and what, to thaw it.
    pub fn thaw(&self) -> (PathBuf, &'static str) {
        match self.version {
            CgroupVersion::V1 => (self.cgroup.join("freezer.state"), "THAWED"),
            CgroupVersion::V2 => (self.cgroup.join("cgroup.freeze"), "0"),
        }
    }
}

/// The thread group (process) a task id belongs to.
pub fn tgid(tid: i32) -> Option<i32> {
    Some(status(tid)?.tgid)
}

/// What holds thread `tid` of process `pid` (any of its task ids), if anything: a frozen cgroup,
/// a stop signal, a tracer's ptrace stop. A thread that is traced but runs is not held.
pub fn hold(pid: i32, tid: i32) -> Option<Hold> {
    let pid = tgid(pid)?;
    if let Some(freezer) = freezer_of(&format!("/proc/{pid}/task/{tid}")) {
        return Some(Hold::Frozen(freezer));
    }
    match thread_state(pid, tid)? {
        ('T', _) | ('t', 0) => Some(Hold::Stopped),
        ('t', tracer) => Some(Hold::Traced {
            tid,
            tracer,
            tracer_comm: name(tracer),
        }),
        _ => None,
    }
}

/// A cgroup hierarchy with a controller (the freezer, memory), as this process sees it mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CgroupMount {
    pub(super) version: CgroupVersion,
    /// The path inside the hierarchy that is mounted (`/` unless a namespace or bind mount).
    pub(super) root: String,
    pub(super) point: PathBuf,
}

/// The v2 hierarchy, and the v1 hierarchy of `controller` where one is mounted (hybrid machines).
pub(super) fn cgroup_mounts(controller: &str) -> Vec<CgroupMount> {
    let Ok(mounts) = procfs::process::Process::myself().and_then(|p| p.mountinfo()) else {
        return Vec::new();
    };
    mounts
        .into_iter()
        .filter_map(|m| {
            let version = match m.fs_type.as_str() {
                "cgroup2" => CgroupVersion::V2,
                "cgroup" if m.super_options.contains_key(controller) => CgroupVersion::V1,
                _ => return None,
            };
            Some(CgroupMount {
                version,
                root: m.root,
                point: m.mount_point,
            })
        })
        .collect()
}

/// The freezer holding the task whose /proc directory is `task` (`/proc/PID` or
/// `/proc/PID/task/TID`: threads of a v2 threaded cgroup may differ).
fn freezer_of(task: &str) -> Option<Freezer> {
    let cgroups = fs::read_to_string(format!("{task}/cgroup")).ok()?;
    freezer_in(&cgroups, &cgroup_mounts("freezer"))
}

fn read_in(dir: &Path, file: &str) -> String {
    fs::read_to_string(dir.join(file)).unwrap_or_default()
}

/// Frozen or freezing, by itself or by an ancestor.
fn effectively_frozen(dir: &Path, version: CgroupVersion) -> bool {
    match version {
        CgroupVersion::V1 => matches!(read_in(dir, "freezer.state").trim(), "FROZEN" | "FREEZING"),
        CgroupVersion::V2 => {
            read_in(dir, "cgroup.events")
                .lines()
                .any(|l| l.trim() == "frozen 1")
                || freezes_itself(dir, version)
        }
    }
}

/// Its own freezer is set (not only an ancestor's).
fn freezes_itself(dir: &Path, version: CgroupVersion) -> bool {
    match version {
        CgroupVersion::V1 => read_in(dir, "freezer.self_freezing").trim() == "1",
        CgroupVersion::V2 => read_in(dir, "cgroup.freeze").trim() == "1",
    }
}

/// Which freezer, if any, holds a task with these `/proc/.../cgroup` lines.
fn freezer_in(cgroups: &str, mounts: &[CgroupMount]) -> Option<Freezer> {
    cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let version = if controllers.is_empty() {
            CgroupVersion::V2
        } else if controllers.split(',').any(|c| c == "freezer") {
            CgroupVersion::V1
        } else {
            return None;
        };
        let mount = mounts.iter().find(|m| m.version == version)?;
        let inside = path
            .strip_prefix(mount.root.trim_end_matches('/'))
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))?;
        let dir = mount.point.join(inside.trim_start_matches('/'));
        if !effectively_frozen(&dir, version) {
            return None;
        }
        // The nearest cgroup, itself or an ancestor, whose own freezer is set.
        let cgroup = dir
            .ancestors()
            .take_while(|d| d.starts_with(&mount.point))
            .find(|d| freezes_itself(d, version))
            .unwrap_or(&dir)
            .to_path_buf();
        Some(Freezer { cgroup, version })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hybrid machine (v1 freezer and v2 both mounted, as here), and a v2 hierarchy mounted
    /// from inside a cgroup namespace: the freezer named is the cgroup to thaw.
    #[test]
    fn the_freezer_that_holds_a_task_is_found_in_each_hierarchy() {
        let base = std::env::temp_dir().join(format!("ctl-freezer-{}", std::process::id()));
        let write = |rel: &str, file: &str, text: &str| {
            let dir = base.join(rel);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(file), text).unwrap();
        };
        write("v1/app", "freezer.state", "FROZEN\n");
        write("v1/app", "freezer.self_freezing", "1\n");
        write("v1/app/job", "freezer.state", "FROZEN\n");
        write("v1/app/job", "freezer.self_freezing", "0\n");
        write("v1/idle", "freezer.state", "THAWED\n");
        write("v2/pod", "cgroup.freeze", "1\n");
        write("v2/pod", "cgroup.events", "populated 1\nfrozen 1\n");
        write("v2/pod/ctr", "cgroup.freeze", "0\n");
        write("v2/pod/ctr", "cgroup.events", "populated 1\nfrozen 1\n");
        let mount = |version, root: &str, point: &str| CgroupMount {
            version,
            root: root.into(),
            point: base.join(point),
        };
        let hybrid = [
            mount(CgroupVersion::V1, "/", "v1"),
            mount(CgroupVersion::V2, "/", "v2"),
        ];
        let v1 = freezer_in("7:freezer:/app/job\n0::/\n", &hybrid);
        let v2 = freezer_in("7:freezer:/idle\n0::/pod/ctr\n", &hybrid);
        let thawed = freezer_in("7:freezer:/idle\n0::/\n", &hybrid);
        let in_ns = freezer_in(
            "0::/pod/ctr\n",
            &[mount(CgroupVersion::V2, "/pod", "v2/pod")],
        );
        let _ = fs::remove_dir_all(&base);
        let v1 = v1.expect("frozen by its parent");
        assert_eq!(v1.cgroup, base.join("v1/app"));
        assert_eq!(v1.thaw(), (base.join("v1/app/freezer.state"), "THAWED"));
        let v2 = v2.expect("frozen by its parent");
        assert_eq!(v2.cgroup, base.join("v2/pod"));
        assert_eq!(v2.thaw(), (base.join("v2/pod/cgroup.freeze"), "0"));
        assert_eq!(thawed, None);
        assert_eq!(in_ns.map(|f| f.cgroup), Some(base.join("v2/pod")));
    }
}
