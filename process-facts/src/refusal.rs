//! What a checkpoint of a process tree refuses before anything is locked, each refusal with its
//! fix: the rules the CRIU plugin, `criu-gpu dump` and `cuda-checkpoint-ctl` apply alike, written
//! once here. Each caller renders a [`Refusal`] in its own frame ("nothing was locked", a problem
//! with its fix, an error), with its own way to skip a rule.

use serde::Serialize;

use crate::nccl::{self, Transport};
use crate::process::io_uring::{self, IoUring};
use crate::process::memory::{Limit, Room};
use crate::units::bytes;

/// What the CRIU in use does with io_uring rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RingSupport {
    /// Stock CRIU: it fails on any ring ("Unknown shit 600"), after the GPU checkpoint.
    None,
    /// The project's CRIU (patch 0008): rings idle at the dump are dumped and restored.
    Idle,
}

/// A reason not to checkpoint a tree, found before anything is locked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Refusal {
    /// io_uring rings the CRIU in use cannot dump.
    IoUring {
        pid: i32,
        comm: String,
        support: RingSupport,
        /// Open ring fds and mapped rings (stock CRIU refuses any).
        fds: usize,
        mappings: usize,
        /// Why each ring cannot be dumped (the project's CRIU: the rings that are not idle).
        rings: Vec<String>,
        /// Mapped libraries known to make rings.
        libraries: Vec<String>,
    },
    /// NCCL ranks of one node whose transports r580 checkpoints but cannot restore (F13).
    NcclTransports {
        ranks: Vec<(i32, String, Vec<Transport>)>,
    },
    /// Device memory that host memory cannot hold all at once (the checkpoint copies it there).
    HostMemory {
        processes: Vec<DeviceMemory>,
        short: Vec<Shortfall>,
    },
}

/// A process whose device memory a checkpoint copies into its host memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    pub pid: i32,
    pub comm: String,
    pub bytes: u64,
}

/// Where the device memory of a checkpoint does not fit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Shortfall {
    /// The node's `MemAvailable`.
    Node { available: u64, need: u64 },
    /// A memory cgroup's limit, for the processes below it.
    Cgroup { limit: Limit, need: u64 },
}

/// The io_uring rings of process `pid` that the CRIU in use cannot dump, if any.
pub fn io_uring(pid: i32, comm: &str, support: RingSupport) -> Option<Refusal> {
    let found = io_uring::io_uring(pid).ok()??;
    let rings = match support {
        RingSupport::None => Vec::new(),
        RingSupport::Idle => {
            let reasons: Vec<String> = match io_uring::rings(pid) {
                Ok(rings) => rings
                    .into_iter()
                    .filter_map(|r| r.verdict.err())
                    .flatten()
                    .collect(),
                Err(e) => vec![format!("its rings cannot be read: {e}")],
            };
            if reasons.is_empty() {
                return None;
            }
            reasons
        }
    };
    Some(Refusal::IoUring {
        pid,
        comm: comm.to_owned(),
        support,
        fds: found.fds,
        mappings: found.mappings,
        rings,
        libraries: found.libraries,
    })
}

/// The NCCL ranks among `ranks` (pid, comm) whose transports cannot be restored, if any.
pub fn nccl(ranks: &[(i32, String)], config: impl Fn(i32) -> nccl::Config) -> Option<Refusal> {
    let pids: Vec<i32> = ranks.iter().map(|(p, _)| *p).collect();
    let bad = nccl::check(&pids, config);
    if bad.is_empty() {
        return None;
    }
    Some(Refusal::NcclTransports {
        ranks: bad
            .into_iter()
            .map(|u| {
                let comm = ranks
                    .iter()
                    .find(|(p, _)| *p == u.pid)
                    .map_or("?", |(_, c)| c.as_str());
                (u.pid, comm.to_owned(), u.transports)
            })
            .collect(),
    })
}

/// The checkpoint of `processes` when host memory (`room`: the node's, each limited cgroup's)
/// cannot take all of their device memory at once.
pub fn host_memory(processes: &[DeviceMemory], room: &Room) -> Option<Refusal> {
    let processes: Vec<DeviceMemory> = processes.iter().filter(|p| p.bytes > 0).cloned().collect();
    let need: u64 = processes.iter().map(|p| p.bytes).sum();
    let mut short = Vec::new();
    if let Some(available) = room.available.filter(|a| *a < need) {
        short.push(Shortfall::Node { available, need });
    }
    for limit in &room.limits {
        let need: u64 = processes
            .iter()
            .filter(|p| limit.pids.contains(&p.pid))
            .map(|p| p.bytes)
            .sum();
        if need > limit.left() {
            short.push(Shortfall::Cgroup {
                limit: limit.clone(),
                need,
            });
        }
    }
    (!short.is_empty()).then_some(Refusal::HostMemory { processes, short })
}

impl Refusal {
    /// What is wrong, naming the processes.
    pub fn what(&self) -> String {
        match self {
            Refusal::IoUring {
                pid,
                comm,
                support: RingSupport::None,
                fds,
                mappings,
                libraries,
                ..
            } => format!(
                "process {pid} ({comm}) holds io_uring instances ({fds} fd(s), {mappings} ring \
                 mapping(s){}), which this CRIU cannot dump: the dump would fail after the GPU \
                 state was checkpointed",
                libs(libraries)
            ),
            Refusal::IoUring {
                pid, comm, rings, ..
            } => format!(
                "process {pid} ({comm}) holds io_uring rings that CRIU cannot dump as they are: \
                 {}",
                rings.join("; ")
            ),
            Refusal::NcclTransports { ranks } => {
                let each: Vec<String> = ranks
                    .iter()
                    .map(|(p, c, t)| format!("process {p} ({c}) ({})", nccl::names(t)))
                    .collect();
                format!(
                    "the NCCL ranks of this node would talk to each other through transports the \
                     NVIDIA driver checkpoints but cannot restore: {}; a checkpoint would leave \
                     them unable to run again (measured with r580: the restore answers \
                     CUDA_ERROR_NOT_SUPPORTED)",
                    each.join(", ")
                )
            }
            Refusal::HostMemory { processes, short } => {
                let each: Vec<String> = processes
                    .iter()
                    .map(|p| format!("process {} ({}, {})", p.pid, p.comm, bytes(p.bytes)))
                    .collect();
                let short: Vec<String> = short.iter().map(Shortfall::what).collect();
                format!(
                    "the GPU checkpoint copies the device memory of {} into host memory, all at \
                     once, where it does not fit: {}; the kernel would end processes (out of \
                     memory) in the middle of the checkpoint",
                    each.join(", "),
                    short.join("; ")
                )
            }
        }
    }

    /// How to fix it; `skip` names the caller's way to turn the rule off, where there is one.
    pub fn fix(&self, skip: &str) -> String {
        match self {
            Refusal::IoUring {
                support: RingSupport::None,
                fds,
                mappings,
                libraries,
                ..
            } => {
                let u = IoUring {
                    fds: *fds,
                    mappings: *mappings,
                    libraries: libraries.clone(),
                };
                format!(
                    "use the project's CRIU (scripts/install.sh; patch 0008 dumps rings that are \
                     idle), or do without the rings: {}",
                    u.fix()
                )
            }
            Refusal::IoUring { .. } => "CRIU dumps a ring only while nothing is queued or in \
                                        flight on it: checkpoint when the program's event loop \
                                        is idle, or let it finish what it submitted first"
                .into(),
            Refusal::NcclTransports { .. } => format!(
                "start the job with {} (shared memory without cuMem, the fastest that comes \
                 back) or {} (sockets), in its environment or /etc/nccl.conf; if these processes \
                 do not talk to each other through NCCL, {skip}",
                nccl::SHM_WITHOUT_CUMEM,
                nccl::SOCKETS_ONLY
            ),
            Refusal::HostMemory { short, .. } => {
                let each: Vec<String> = short.iter().map(Shortfall::fix).collect();
                each.join("; ")
            }
        }
    }
}

impl Shortfall {
    fn what(&self) -> String {
        match self {
            Shortfall::Node { available, need } => format!(
                "this node has {} available (MemAvailable), {} needed",
                bytes(*available),
                bytes(*need)
            ),
            Shortfall::Cgroup { limit, need } => {
                let pids: Vec<String> = limit.pids.iter().map(i32::to_string).collect();
                format!(
                    "the memory cgroup {} allows {} more (limit {}, {} in use), and its \
                     process(es) {} need {}",
                    limit.cgroup.display(),
                    bytes(limit.left()),
                    bytes(limit.max),
                    bytes(limit.current),
                    pids.join(", "),
                    bytes(*need)
                )
            }
        }
    }

    fn fix(&self) -> String {
        match self {
            Shortfall::Node { available, need } => format!(
                "free {} of host memory on this node (MemAvailable must reach {}; swap does not \
                 count), or checkpoint the job on a node with more",
                bytes(need - available),
                bytes(*need)
            ),
            Shortfall::Cgroup { limit, need } => format!(
                "raise the memory limit of {} to at least {} (a container's memory limit, e.g. \
                 resources.limits.memory)",
                limit.cgroup.display(),
                bytes(limit.current + need)
            ),
        }
    }
}

fn libs(l: &[String]) -> String {
    if l.is_empty() {
        String::new()
    } else {
        format!("; it maps {}", l.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_is_refused_by_stock_criu_naming_the_library_and_both_ways_out() {
        let r = Refusal::IoUring {
            pid: 12,
            comm: "python3".into(),
            support: RingSupport::None,
            fds: 1,
            mappings: 2,
            rings: vec![],
            libraries: vec!["libtorch_cpu.so".into()],
        };
        assert!(r
            .what()
            .contains("process 12 (python3) holds io_uring instances (1 fd(s), 2 ring mapping(s); it maps libtorch_cpu.so)"));
        let fix = r.fix("");
        assert!(
            fix.contains("patch 0008") && fix.contains("USE_LIBUV=0"),
            "{fix}"
        );
    }

    #[test]
    fn the_projects_criu_refuses_only_rings_that_are_not_idle() {
        let r = Refusal::IoUring {
            pid: 12,
            comm: "app".into(),
            support: RingSupport::Idle,
            fds: 1,
            mappings: 1,
            rings: vec!["fd 7: io_uring with 1 request(s) in flight (opcodes 22)".into()],
            libraries: vec![],
        };
        assert!(r
            .what()
            .contains("fd 7: io_uring with 1 request(s) in flight"));
        assert!(r.fix("").contains("idle"));
        // A process without rings is never refused.
        let me = std::process::id() as i32;
        assert_eq!(io_uring(me, "me", RingSupport::None), None);
    }

    /// Both the node and a container's cgroup too small: each named with its numbers and fix;
    /// enough room, or nothing known, refuses nothing.
    #[test]
    fn device_memory_that_host_memory_cannot_hold_is_refused_with_the_numbers() {
        let gib = 1u64 << 30;
        let procs = [
            DeviceMemory {
                pid: 10,
                comm: "train".into(),
                bytes: 20 * gib,
            },
            DeviceMemory {
                pid: 11,
                comm: "idle".into(),
                bytes: 0,
            },
        ];
        let pod = Limit {
            cgroup: "/sys/fs/cgroup/pod".into(),
            max: 16 * gib,
            current: 12 * gib,
            pids: vec![10],
        };
        let room = Room {
            available: Some(8 * gib),
            limits: vec![pod.clone()],
        };
        let r = host_memory(&procs, &room).unwrap();
        let (what, fix) = (r.what(), r.fix(""));
        assert!(
            what.contains("device memory of process 10 (train, 20.00 GiB) into host memory")
                && !what.contains("idle")
                && what.contains("this node has 8.00 GiB available (MemAvailable), 20.00 GiB")
                && what.contains(
                    "/sys/fs/cgroup/pod allows 4.00 GiB more (limit 16.00 GiB, 12.00 GiB in use), \
                     and its process(es) 10 need 20.00 GiB"
                ),
            "{what}"
        );
        assert!(
            fix.contains("free 12.00 GiB of host memory")
                && fix.contains("limit of /sys/fs/cgroup/pod to at least 32.00 GiB"),
            "{fix}"
        );
        let enough = Room {
            available: Some(21 * gib),
            limits: vec![Limit {
                max: 40 * gib,
                ..pod
            }],
        };
        assert_eq!(host_memory(&procs, &enough), None);
        assert_eq!(host_memory(&procs, &Room::default()), None);
        let exactly = Room {
            available: Some(20 * gib),
            limits: vec![],
        };
        assert_eq!(host_memory(&procs, &exactly), None);
    }

    #[test]
    fn nccl_ranks_are_named_with_their_transports_and_the_callers_skip() {
        let ranks = [(10, "a".to_owned()), (11, "b".to_owned())];
        let r = nccl(&ranks, |_| nccl::Config::default()).unwrap();
        assert!(
            r.what().contains("process 10 (a) (P2P, SHM and cuMem)")
                && r.what().contains("process 11 (b)"),
            "{}",
            r.what()
        );
        let fix = r.fix("pass --no-nccl-check");
        assert!(fix.contains(nccl::SOCKETS_ONLY) && fix.contains("--no-nccl-check"));
        assert_eq!(nccl(&ranks[..1], |_| nccl::Config::default()), None);
    }
}
