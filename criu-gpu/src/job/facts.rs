//! What a job's process tree holds that decides CRIU's options and the preflight: GPU and NCCL
//! processes and their device memory, io_uring instances, unlinked files, TCP sockets, terminals,
//! file locks, whether the tree is a session of its own, and the host memory left to it. Read
//! once from /proc, before anything is frozen.

use std::net::SocketAddr;

use process_facts::process::memory::Room;
use process_facts::process::{self, IoUring, TcpSocket, TcpState, Unlinked};

/// One process of the job.
#[derive(Debug, Clone)]
pub struct Member {
    pub pid: i32,
    pub comm: String,
    pub starttime: u64,
    /// It maps the CUDA driver (it may hold GPU state).
    pub cuda: bool,
    /// It maps NCCL.
    pub nccl: bool,
    /// Its device memory as NVML shows it (what a checkpoint copies into its host memory).
    pub device_memory: Option<u64>,
    pub io_uring: Option<IoUring>,
    pub unlinked: Vec<Unlinked>,
    pub terminal: bool,
    pub(crate) sockets: Vec<u64>,
}

/// The job's tree.
#[derive(Debug, Clone)]
pub struct JobFacts {
    pub root: i32,
    pub members: Vec<Member>,
    /// The TCP sockets the job's processes hold, with the pid holding each.
    pub tcp: Vec<(i32, TcpSocket)>,
    /// Processes of the job holding file locks.
    pub locks: Vec<i32>,
    /// The root's session or process group leader is outside the tree (a shell's job).
    pub shell_job: bool,
    /// The host memory left to the job: the node's, its memory cgroups'.
    pub room: Room,
}

impl JobFacts {
    /// Reads the tree rooted at `root`; `None` if `root` does not exist.
    pub fn read(root: i32) -> Option<JobFacts> {
        if !process::exists(root) {
            return None;
        }
        let pids = process::tree(root);
        let members: Vec<Member> = pids.iter().filter_map(|&p| member(p)).collect();
        let all_tcp = process::tcp_sockets(root);
        let tcp = members
            .iter()
            .flat_map(|m| {
                all_tcp
                    .iter()
                    .filter(|s| m.sockets.contains(&s.inode))
                    .map(|s| (m.pid, s.clone()))
            })
            .collect();
        // Whatever /proc/locks names as the holder, CRIU refuses a lock on any open file of
        // the tree (its fdinfo `lock:` lines).
        let holders = process::lock_holders();
        let locks = pids
            .iter()
            .copied()
            .filter(|p| holders.contains(p) || process::holds_file_locks(*p))
            .collect();
        let shell_job = process::session(root)
            .is_some_and(|(pgid, sid)| !pids.contains(&pgid) || !pids.contains(&sid))
            || members.iter().any(|m| m.terminal);
        Some(JobFacts {
            root,
            room: Room::of(&pids),
            members,
            tcp,
            locks,
            shell_job,
        })
    }

    pub fn established(&self) -> impl Iterator<Item = &(i32, TcpSocket)> {
        self.tcp
            .iter()
            .filter(|(_, s)| s.state == TcpState::Established)
    }

    pub fn listeners(&self) -> Vec<SocketAddr> {
        self.tcp
            .iter()
            .filter(|(_, s)| s.state == TcpState::Listen)
            .map(|(_, s)| s.local)
            .collect()
    }

    /// Established connections whose other end is not a socket of the job.
    pub fn outside_connections(&self) -> Vec<&(i32, TcpSocket)> {
        self.established()
            .filter(|(_, s)| {
                !self
                    .tcp
                    .iter()
                    .any(|(_, o)| o.local == s.remote && o.remote == s.local)
            })
            .collect()
    }

    /// Narrows `cuda` to the processes the driver knows as CUDA processes: a launcher that only
    /// asked how many GPUs there are maps libcuda without a context, and is no rank (the plugin
    /// counts the same way). Without a driver, or for a process it may not ask, the mapping
    /// stands.
    /// `libcuda`: the driver library to ask (else the system's).
    pub fn confirm_cuda(&mut self, libcuda: Option<&str>) {
        use cuda_checkpoint_ctl::{driver::Driver, ops};
        let mappers: Vec<i32> = self
            .members
            .iter()
            .filter(|m| m.cuda)
            .map(|m| m.pid)
            .collect();
        if mappers.is_empty() {
            return;
        }
        let Ok(driver) = Driver::load(libcuda) else {
            return;
        };
        let survey = ops::survey(&driver, &mappers, std::time::Duration::from_secs(2));
        let known = survey.pids();
        for m in self.members.iter_mut().filter(|m| m.cuda) {
            m.cuda = known.contains(&m.pid) || survey.denied.contains(&m.pid);
        }
    }

    /// Each CUDA process's device memory, as NVML shows it (`libnvml`: the plugin's
    /// CUDA_CKPT_LIBNVML, else the system's). Without NVML it stays unknown.
    pub fn read_device_memory(&mut self, libnvml: Option<&str>) {
        use cuda_checkpoint_ctl::inventory::Inventory;
        if !self.members.iter().any(|m| m.cuda) {
            return;
        }
        let Ok(inv) = Inventory::query(libnvml) else {
            return;
        };
        for m in self.members.iter_mut().filter(|m| m.cuda) {
            let usage = inv.usage_of(m.pid);
            m.device_memory = Some(usage.iter().filter_map(|u| u.memory).sum());
        }
    }

    /// The largest unlinked file the job holds, and which process holds it.
    pub fn largest_unlinked(&self) -> Option<(&Member, &Unlinked)> {
        self.members
            .iter()
            .flat_map(|m| m.unlinked.iter().map(move |u| (m, u)))
            .max_by_key(|(_, u)| u.size)
    }
}

fn member(pid: i32) -> Option<Member> {
    let libs = process::libraries(pid).ok()?;
    Some(Member {
        pid,
        comm: process::name(pid),
        starttime: process::starttime(pid).unwrap_or(0),
        cuda: libs.libcuda,
        nccl: libs.nccl,
        device_memory: None,
        io_uring: process::io_uring(pid).ok().flatten(),
        unlinked: process::unlinked(pid).unwrap_or_default(),
        terminal: process::has_terminal(pid),
        sockets: process::socket_inodes(pid),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_tree_with_a_connection_a_listener_and_a_ghost() {
        let dir = tempfile::tempdir().unwrap();
        let ghost = dir.path().join("ghost");
        std::fs::write(&ghost, vec![1u8; 4096]).unwrap();
        let held = std::fs::File::open(&ghost).unwrap();
        std::fs::remove_file(&ghost).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        let me = std::process::id() as i32;
        let f = JobFacts::read(me).unwrap();
        assert!(f.listeners().contains(&l.local_addr().unwrap()));
        assert!(f.established().count() >= 2);
        assert!(f
            .outside_connections()
            .iter()
            .all(|(_, s)| s.local != c.local_addr().unwrap()));
        let (_, big) = f.largest_unlinked().unwrap();
        assert!(big.size >= 4096, "{big:?}");
        drop((held, c, a));
        assert!(JobFacts::read(i32::MAX).is_none());
    }
}
