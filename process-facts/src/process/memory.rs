//! The host memory a GPU checkpoint lands in. The driver copies each process's device memory into
//! that process's own memory, every process at once, and the kernel charges it like any other:
//! to the node (`MemAvailable`) and to every memory cgroup above the process (v2 `memory.max`,
//! v1 `memory.limit_in_bytes`: a container's limit). What does not fit is taken by the OOM
//! killer in the middle of the checkpoint. [`Room`] is what is left, read once;
//! `refusal::host_memory` is the rule.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::hold::{cgroup_mounts, CgroupMount};
use super::CgroupVersion;

/// The host memory left for the processes of a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Room {
    /// `MemAvailable` of /proc/meminfo, in bytes; `None` when it cannot be read.
    pub available: Option<u64>,
    /// The memory cgroups with a limit above any of the processes.
    pub limits: Vec<Limit>,
}

/// A memory cgroup with a limit, and the processes below it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limit {
    pub cgroup: PathBuf,
    /// Its limit and what is charged to it now, in bytes.
    pub max: u64,
    pub current: u64,
    pub pids: Vec<i32>,
}

impl Limit {
    /// What is left below the limit.
    pub fn left(&self) -> u64 {
        self.max.saturating_sub(self.current)
    }
}

impl Room {
    /// The node's and the cgroups' room for the processes `pids`, as this machine shows it.
    pub fn of(pids: &[i32]) -> Room {
        let available = fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| mem_available(&m));
        let mounts = cgroup_mounts("memory");
        let mut limits: Vec<Limit> = Vec::new();
        for &pid in pids {
            let Ok(lines) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
                continue;
            };
            for (cgroup, version) in cgroups_above(&lines, &mounts) {
                if let Some(l) = limits.iter_mut().find(|l| l.cgroup == cgroup) {
                    l.pids.push(pid);
                } else if let Some((max, current)) = limit_of(&cgroup, version) {
                    limits.push(Limit {
                        cgroup,
                        max,
                        current,
                        pids: vec![pid],
                    });
                }
            }
        }
        Room { available, limits }
    }
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// The memory cgroups of a task with these `/proc/.../cgroup` lines and their ancestors, in the
/// hierarchies mounted here (v2, and v1's memory controller on a hybrid machine).
fn cgroups_above(lines: &str, mounts: &[CgroupMount]) -> Vec<(PathBuf, CgroupVersion)> {
    let mut out = Vec::new();
    for line in lines.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let version = if controllers.is_empty() {
            CgroupVersion::V2
        } else if controllers.split(',').any(|c| c == "memory") {
            CgroupVersion::V1
        } else {
            continue;
        };
        let Some(mount) = mounts.iter().find(|m| m.version == version) else {
            continue;
        };
        let Some(inside) = path
            .strip_prefix(mount.root.trim_end_matches('/'))
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        else {
            continue;
        };
        let dir = mount.point.join(inside.trim_start_matches('/'));
        out.extend(
            dir.ancestors()
                .take_while(|d| d.starts_with(&mount.point))
                .map(|d| (d.to_path_buf(), version)),
        );
    }
    out
}

/// Above this a v1 limit means none (the kernel shows "no limit" as the largest page count).
const V1_UNLIMITED: u64 = 1 << 62;

/// A cgroup's memory limit and what is charged to it, if it has a limit.
fn limit_of(dir: &Path, version: CgroupVersion) -> Option<(u64, u64)> {
    let read = |f: &str| fs::read_to_string(dir.join(f)).ok();
    let (max, current) = match version {
        CgroupVersion::V2 => (read("memory.max")?, read("memory.current")?),
        CgroupVersion::V1 => (
            read("memory.limit_in_bytes")?,
            read("memory.usage_in_bytes")?,
        ),
    };
    let max = max.trim().parse::<u64>().ok()?;
    (max < V1_UNLIMITED).then_some((max, current.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:          512000 kB\n\
                       MemAvailable:   23553360 kB\nBuffers:            1024 kB\n";
        assert_eq!(mem_available(meminfo), Some(23_553_360 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    /// A container's cgroup under a pod's, both limited, in each hierarchy; the root and an
    /// unlimited cgroup are no limit.
    #[test]
    fn the_limits_above_a_process_are_found_in_each_hierarchy() {
        let base = std::env::temp_dir().join(format!("ctl-memory-{}", std::process::id()));
        let write = |rel: &str, file: &str, text: &str| {
            let dir = base.join(rel);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(file), text).unwrap();
        };
        write("v2", "memory.current", "9000000000\n");
        write("v2/pod", "memory.max", "8589934592\n");
        write("v2/pod", "memory.current", "4294967296\n");
        write("v2/pod/ctr", "memory.max", "max\n");
        write("v2/pod/ctr", "memory.current", "4000000000\n");
        write("v1/job", "memory.limit_in_bytes", "1073741824\n");
        write("v1/job", "memory.usage_in_bytes", "1048576\n");
        write("v1", "memory.limit_in_bytes", "9223372036854771712\n");
        write("v1", "memory.usage_in_bytes", "5\n");
        let mount = |version, root: &str, point: &str| CgroupMount {
            version,
            root: root.into(),
            point: base.join(point),
        };
        let mounts = [
            mount(CgroupVersion::V1, "/", "v1"),
            mount(CgroupVersion::V2, "/", "v2"),
        ];
        let found: Vec<(PathBuf, u64, u64)> =
            cgroups_above("4:memory:/job\n1:cpu:/x\n0::/pod/ctr\n", &mounts)
                .into_iter()
                .filter_map(|(d, v)| limit_of(&d, v).map(|(m, c)| (d, m, c)))
                .collect();
        let in_ns = cgroups_above(
            "0::/pod/ctr\n",
            &[mount(CgroupVersion::V2, "/pod", "v2/pod")],
        );
        let _ = fs::remove_dir_all(&base);
        assert_eq!(
            found,
            vec![
                (base.join("v1/job"), 1 << 30, 1 << 20),
                (base.join("v2/pod"), 8 << 30, 4 << 30),
            ]
        );
        assert_eq!(
            in_ns.into_iter().map(|(d, _)| d).collect::<Vec<_>>(),
            vec![base.join("v2/pod/ctr"), base.join("v2/pod")]
        );
        let l = Limit {
            cgroup: base,
            max: 1 << 30,
            current: 2 << 30,
            pids: vec![1],
        };
        assert_eq!(l.left(), 0);
    }
}
