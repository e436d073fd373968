//! From what a job holds and what this node's CRIU can do, the CRIU options its dump and restore
//! need, each with the reason, and the problems that must be fixed before anything is frozen,
//! each with its fix.

use process_facts::nccl;
use process_facts::refusal::{self, DeviceMemory, Refusal, RingSupport};
use serde::Serialize;

use super::facts::JobFacts;
use crate::human::bytes;
pub use criu_gpu_host::netlock::NetworkLock;

/// CRIU copies unlinked files into the images whole, up to `--ghost-limit` (1 MiB by default).
const GHOST_DEFAULT: u64 = 1 << 20;
/// Above this an unlinked file is refused: a job should not carry gigabytes of deleted files.
pub const GHOST_CAP: u64 = 1 << 30;
/// CRIU's seize budget: NCCL ranks may need a moment to finish a collective before their locks.
const SEIZE_TIMEOUT_S: u32 = 30;

/// Something that must be fixed before the job can be dumped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub what: String,
    pub fix: String,
}

/// A CRIU option and why it is there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Choice {
    pub args: Vec<String>,
    pub why: String,
}

/// The dump's plan.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Plan {
    /// Options for both the dump and the restore.
    pub common: Vec<Choice>,
    /// Options of the dump alone.
    pub dump: Vec<Choice>,
    pub problems: Vec<Problem>,
    /// What the operator should know (not a problem).
    pub notes: Vec<String>,
}

impl Plan {
    pub fn make(facts: &JobFacts, lock: Option<NetworkLock>, rings: RingSupport) -> Plan {
        let mut p = Plan::default();
        p.io_uring(facts, rings);
        p.nccl(facts);
        p.host_memory(facts);
        p.ghosts(facts);
        p.tcp(facts, lock);
        if facts.shell_job {
            p.common.push(Choice {
                args: vec!["--shell-job".into()],
                why: "the job runs in a shell's session or has a terminal open".into(),
            });
        }
        if !facts.locks.is_empty() {
            p.common.push(Choice {
                args: vec!["--file-locks".into()],
                why: format!("processes {:?} hold file locks", facts.locks),
            });
        }
        p.dump.push(Choice {
            args: vec!["--timeout".into(), SEIZE_TIMEOUT_S.to_string()],
            why: "the GPU locks wait for work in flight (an NCCL collective) inside CRIU's \
                  seize time"
                .into(),
        });
        if !facts.members.iter().any(|m| m.cuda) {
            p.notes
                .push("no process of the job maps the CUDA driver: a plain CRIU dump".into());
        }
        p
    }

    /// The rule set's refusals (`process_facts::refusal`), as problems.
    fn refuse(&mut self, r: Refusal) {
        self.problems.push(Problem {
            what: r.what(),
            fix: r.fix("set CRIU_GPU_NCCL_CHECK=0 (in criu's environment)"),
        });
    }

    fn io_uring(&mut self, facts: &JobFacts, rings: RingSupport) {
        for m in facts.members.iter().filter(|m| m.io_uring.is_some()) {
            if let Some(r) = refusal::io_uring(m.pid, &m.comm, rings) {
                self.refuse(r);
            }
        }
    }

    fn nccl(&mut self, facts: &JobFacts) {
        let ranks: Vec<(i32, String)> = facts
            .members
            .iter()
            .filter(|m| m.cuda && m.nccl)
            .map(|m| (m.pid, m.comm.clone()))
            .collect();
        if let Some(r) = refusal::nccl(&ranks, |pid| nccl::Config::of(pid).unwrap_or_default()) {
            self.refuse(r);
        }
    }

    /// The device memory the checkpoint copies into host memory, against the room left there.
    fn host_memory(&mut self, facts: &JobFacts) {
        let processes: Vec<DeviceMemory> = facts
            .members
            .iter()
            .filter_map(|m| {
                Some(DeviceMemory {
                    pid: m.pid,
                    comm: m.comm.clone(),
                    bytes: m.device_memory?,
                })
            })
            .collect();
        if let Some(r) = refusal::host_memory(&processes, &facts.room) {
            self.refuse(r);
        }
    }

    fn ghosts(&mut self, facts: &JobFacts) {
        let Some((m, big)) = facts.largest_unlinked() else {
            return;
        };
        if big.size > GHOST_CAP {
            self.problems.push(Problem {
                what: format!(
                    "process {} ({}) holds the unlinked file {} of {}; CRIU would copy it into \
                     the images whole",
                    m.pid,
                    m.comm,
                    big.path,
                    bytes(big.size)
                ),
                fix: format!(
                    "close it, or keep it linked, before the checkpoint (at most {} of unlinked \
                     files are carried)",
                    bytes(GHOST_CAP)
                ),
            });
        } else if big.size > GHOST_DEFAULT {
            // Round up to whole MiB, with room for the file to grow a little meanwhile.
            let limit = (big.size + big.size / 4).div_ceil(1 << 20).max(2);
            self.common.push(Choice {
                args: vec!["--ghost-limit".into(), format!("{limit}M")],
                why: format!(
                    "{} holds the unlinked file {} of {}; CRIU copies unlinked files into the \
                     images",
                    m.comm,
                    big.path,
                    bytes(big.size)
                ),
            });
        }
    }

    fn tcp(&mut self, facts: &JobFacts, lock: Option<NetworkLock>) {
        let n = facts.established().count();
        if n == 0 {
            return;
        }
        self.common.push(Choice {
            args: vec!["--tcp-established".into()],
            why: format!("the job holds {n} established TCP connection(s)"),
        });
        match lock {
            Some(l) => self.dump.push(Choice {
                args: vec!["--network-lock".into(), l.word().into()],
                why: format!(
                    "packets of those connections are held while they are dumped ({} is what \
                     this node has)",
                    l.word()
                ),
            }),
            None => self.problems.push(Problem {
                what: "the job holds TCP connections, and this node can lock neither with \
                       nftables (this CRIU was built without it) nor with iptables \
                       (iptables-restore is missing)"
                    .into(),
                fix: criu_gpu_host::netlock::NodeLocks::NO_LOCK_FIX.into(),
            }),
        }
        let outside = facts.outside_connections();
        if !outside.is_empty() {
            let peers: Vec<String> = outside.iter().map(|(_, s)| s.remote.to_string()).collect();
            self.notes.push(format!(
                "{} connection(s) lead outside the job (to {}): they are restored only on a \
                 host with the same address, and only while the other end is still there",
                outside.len(),
                peers.join(", ")
            ));
        }
    }

    /// The CRIU arguments of the dump (after `dump -t PID -D DIR`).
    pub fn dump_args(&self) -> Vec<String> {
        self.common
            .iter()
            .chain(&self.dump)
            .flat_map(|c| c.args.iter().cloned())
            .collect()
    }

    /// The CRIU arguments the restore needs (after `restore -D DIR`).
    pub fn restore_args(&self) -> Vec<String> {
        self.common
            .iter()
            .flat_map(|c| c.args.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::facts::Member;
    use process_facts::process::memory::Room;
    use process_facts::process::Unlinked;

    fn job(unlinked: u64, shell: bool) -> JobFacts {
        JobFacts {
            root: 1,
            members: vec![Member {
                pid: 1,
                comm: "app".into(),
                starttime: 1,
                cuda: true,
                nccl: false,
                device_memory: Some(3 << 30),
                io_uring: None,
                unlinked: vec![Unlinked {
                    path: "/dev/shm/nccl-x".into(),
                    size: unlinked,
                }],
                terminal: false,
                sockets: Vec::new(),
            }],
            tcp: Vec::new(),
            locks: vec![1],
            shell_job: shell,
            room: Room::default(),
        }
    }

    #[test]
    fn unlinked_files_set_the_ghost_limit_up_to_the_cap() {
        let p = Plan::make(&job(34_213_888, false), None, RingSupport::None);
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert!(
            p.dump_args().join(" ").contains("--ghost-limit 41M"),
            "{:?}",
            p.dump_args()
        );
        assert!(p.restore_args().contains(&"--file-locks".to_string()));
        let p = Plan::make(&job(2 << 30, true), None, RingSupport::None);
        assert_eq!(p.problems.len(), 1);
        assert!(p.problems[0].what.contains("/dev/shm/nccl-x of 2.00 GiB"));
        let p = Plan::make(&job(4096, true), None, RingSupport::None);
        assert!(!p.dump_args().join(" ").contains("ghost"));
        assert!(p.restore_args().contains(&"--shell-job".to_string()));
    }

    /// 3 GiB of device memory and 2 GiB available: a problem with the numbers.
    #[test]
    fn device_memory_that_host_memory_cannot_hold_is_a_problem() {
        let mut j = job(4096, false);
        j.room.available = Some(2 << 30);
        let p = Plan::make(&j, None, RingSupport::None);
        assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
        assert!(
            p.problems[0]
                .what
                .contains("2.00 GiB available (MemAvailable), 3.00 GiB needed"),
            "{:?}",
            p.problems
        );
    }
}
