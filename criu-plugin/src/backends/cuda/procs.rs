//! What the CUDA backend reads of processes (through `process_facts::process`, the one
//! place that reads /proc), behind a trait so its decisions can be tested without processes.

use std::ops::Range;

use process_facts::process::memory::Room;
use process_facts::process::{self, Libraries};
use process_facts::refusal::{self, Refusal, RingSupport};

use super::error::Held;

pub trait Procs: Send {
    /// A process and its descendants, parents first.
    fn tree(&self, root: i32) -> Vec<i32>;
    fn libraries(&self, pid: i32) -> std::io::Result<Libraries>;
    fn comm(&self, pid: i32) -> String;
    fn ns_pid(&self, pid: i32) -> Option<i32>;
    fn starttime(&self, pid: i32) -> Option<u64>;
    /// Why the process's thread `tid` (or the process, for `None`) cannot run, if it cannot. A
    /// tracer that is `criu` does not count (CRIU seizes the tasks on purpose).
    fn held(&self, pid: i32, tid: Option<i32>, criu: i32) -> Option<Held>;
    /// The process's tracer (0: none).
    fn tracer(&self, pid: i32) -> i32;
    /// Ended or ending (a zombie, or past the start of its exit): a traced process killed during
    /// the dump keeps CRIU as its tracer until CRIU reaps it.
    fn dying(&self, pid: i32) -> bool;
    /// Whether `/dev/nvidiaN` exists in the process's root file system (a container's).
    fn has_gpu_node(&self, pid: i32, minor: u32) -> bool;
    /// Kills a restored process (and reaps what CRIU, its tracer, must reap).
    fn kill(&self, pid: i32);
    /// The refusal of `ranks` (CUDA processes of one node with NCCL loaded) whose NCCL settings
    /// leave a transport on that the driver cannot restore (`process_facts::refusal`).
    fn nccl(&self, ranks: &[(i32, String)]) -> Option<Refusal>;
    /// The refusal of the process's io_uring rings that the CRIU in use cannot dump.
    fn io_uring(&self, pid: i32, support: RingSupport) -> Option<Refusal>;
    /// Its unnamed private writable mappings (`process::maps`).
    fn anon_writable(&self, pid: i32) -> std::io::Result<Vec<Range<u64>>>;
    /// The host memory left to the processes: the node's, their memory cgroups'.
    fn room(&self, pids: &[i32]) -> Room;
}

/// This machine.
pub struct Real;

impl Procs for Real {
    fn tree(&self, root: i32) -> Vec<i32> {
        process::tree(root)
    }
    fn libraries(&self, pid: i32) -> std::io::Result<Libraries> {
        process::libraries(pid)
    }
    fn comm(&self, pid: i32) -> String {
        process::comm(pid).unwrap_or_default()
    }
    fn ns_pid(&self, pid: i32) -> Option<i32> {
        process::ns_pid(pid)
    }
    fn starttime(&self, pid: i32) -> Option<u64> {
        process::starttime(pid)
    }
    fn held(&self, pid: i32, tid: Option<i32>, criu: i32) -> Option<Held> {
        if let Some(cgroup) = process::frozen_cgroup(pid) {
            return Some(Held::Frozen { cgroup });
        }
        let (state, tracer) = process::thread_state(pid, pid)?;
        if tracer != 0 && tracer != criu {
            return Some(Held::Traced { by: tracer });
        }
        if state == 'T' || (state == 't' && tracer != criu) {
            return Some(Held::Stopped);
        }
        let tid = tid?;
        let (state, by) = process::thread_state(pid, tid)?;
        if by != 0 && by != criu {
            return Some(Held::Thread { tid, by });
        }
        (state == 'T').then_some(Held::Thread { tid, by: 0 })
    }
    fn tracer(&self, pid: i32) -> i32 {
        process::tracer(pid).unwrap_or(0)
    }
    fn dying(&self, pid: i32) -> bool {
        process::is_dying(pid)
    }
    fn has_gpu_node(&self, pid: i32, minor: u32) -> bool {
        std::path::Path::new(&format!("/proc/{pid}/root/dev/nvidia{minor}")).exists()
    }
    fn nccl(&self, ranks: &[(i32, String)]) -> Option<Refusal> {
        refusal::nccl(ranks, |pid| {
            process_facts::nccl::Config::of(pid).unwrap_or_default()
        })
    }
    fn io_uring(&self, pid: i32, support: RingSupport) -> Option<Refusal> {
        refusal::io_uring(pid, &self.comm(pid), support)
    }
    fn anon_writable(&self, pid: i32) -> std::io::Result<Vec<Range<u64>>> {
        process::maps::anon_writable(pid)
    }
    fn room(&self, pids: &[i32]) -> Room {
        Room::of(pids)
    }
    fn kill(&self, pid: i32) {
        // CRIU holds the restored threads in ptrace-stop: reap what only it can (core::kill).
        crate::core::kill::kill_and_reap(pid, std::time::Duration::from_secs(5));
    }
}
