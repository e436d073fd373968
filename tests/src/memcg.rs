//! A memory cgroup of our own with a limit, as a container runtime makes one: v1's memory
//! controller where this machine mounts it (a hybrid machine, below the test's own cgroup), else
//! cgroup v2 (at its root, where the memory controller is delegated). Removed on drop.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::wait_until;

static SEQ: AtomicU32 = AtomicU32::new(0);

pub struct MemoryCgroup {
    pub dir: PathBuf,
    /// Where its processes go back to on drop.
    parent: PathBuf,
    v1: bool,
}

/// The mount point of the hierarchy of `fs_type` (with `option`, for v1), from our mountinfo.
fn mount_of(fs_type: &str, option: Option<&str>) -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut right = right.split(' ');
        let (t, _source, options) = (right.next()?, right.next()?, right.next()?);
        let ours = t == fs_type && option.is_none_or(|o| options.split(',').any(|x| x == o));
        let point = left.split(' ').nth(4)?;
        ours.then(|| PathBuf::from(point))
    })
}

/// Our own cgroup in v1's memory hierarchy (relative to its root).
fn own_v1_memory_cgroup() -> String {
    fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, controllers, path) = (p.next()?, p.next()?, p.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.trim_start_matches('/').to_owned())
        })
        .unwrap_or_default()
}

impl MemoryCgroup {
    /// A new memory cgroup, without a limit yet.
    pub fn new() -> MemoryCgroup {
        let name = format!(
            "gpu-ckpt-mem-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let (parent, v1) = if let Some(v1) = mount_of("cgroup", Some("memory")) {
            (v1.join(own_v1_memory_cgroup()), true)
        } else {
            let v2 = mount_of("cgroup2", None).expect("no cgroup hierarchy is mounted");
            let delegated = fs::read_to_string(v2.join("cgroup.subtree_control"))
                .unwrap_or_default()
                .split_whitespace()
                .any(|c| c == "memory");
            assert!(
                delegated,
                "cgroup v2 at {} does not delegate the memory controller \
                 (echo +memory > cgroup.subtree_control)",
                v2.display()
            );
            (v2, false)
        };
        let dir = parent.join(name);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        MemoryCgroup { dir, parent, v1 }
    }

    pub fn add(&self, pid: i32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// What is charged to it now.
    pub fn current(&self) -> u64 {
        let file = if self.v1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        };
        read_u64(&self.dir.join(file))
    }

    /// Sets its limit (`None`: no limit).
    pub fn limit(&self, bytes: Option<u64>) {
        let (file, value) = match (self.v1, bytes) {
            (true, Some(b)) => ("memory.limit_in_bytes", b.to_string()),
            (true, None) => ("memory.limit_in_bytes", "-1".to_owned()),
            (false, Some(b)) => ("memory.max", b.to_string()),
            (false, None) => ("memory.max", "max".to_owned()),
        };
        fs::write(self.dir.join(file), value)
            .unwrap_or_else(|e| panic!("{}/{file}: {e}", self.dir.display()));
    }
}

impl Default for MemoryCgroup {
    fn default() -> Self {
        MemoryCgroup::new()
    }
}

fn read_u64(p: &Path) -> u64 {
    let text = fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.trim().parse().unwrap()
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let procs = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = fs::write(self.parent.join("cgroup.procs"), pid);
        }
        let dir: &Path = &self.dir;
        let _ = wait_until(Duration::from_secs(5), || fs::remove_dir(dir).is_ok());
    }
}
