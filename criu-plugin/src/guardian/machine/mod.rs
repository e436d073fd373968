//! The machine the guardian acts on, in parts, so that each concern is written (and faked in
//! tests) on its own:
//!
//! - [`Machine`]: what every command needs, whatever the GPUs: whether a process is still the one
//!   it was, killing one, what a restore created, and the record the guardian leaves;
//! - [`Leftovers`]: what CRIU leaves behind when it dies half-way, for any tree, GPU or not: its
//!   network lock, sockets in TCP repair mode, a restore's ghost files, and the huge page policy
//!   the guardian raised for it ([`criu`]);
//! - one part per GPU vendor, for what undoes that vendor's change: [`CudaDriver`] (locks and
//!   checkpoints, undone through the driver; [`cuda`]) and [`KfdQueues`] (paused queues,
//!   restarted through amdkfd; [`amd`]), each behind an accessor of [`Machine`] that has none by
//!   default. The agent drives them through one interface per vendor (`agent::vendor`).
//!
//! [`Real`] puts the real parts together; tests put fakes of the parts they need.

pub mod amd;
pub mod criu;
pub mod cuda;
mod real;
mod repair;

use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::time::Duration;

use criu_gpu_host::thp::Thp;
use cuda_checkpoint_ctl::driver::{CudaError, DeviceMap, DriverInfo, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;

pub use self::real::{Real, LOG_FILE};
use super::proto::Level;

/// The machine the guardian acts on: processes and the record, and access to the other parts.
pub trait Machine: Send + Sync + 'static {
    /// Whether `pid` is still the process that started at `starttime` (not a reused pid).
    fn alive(&self, pid: i32, starttime: u64) -> bool;
    fn kill(&self, pid: i32);
    /// Restore: the processes the watched CRIU created that are still alive, with their pids
    /// in their own pid namespace ([`super::lineage`]).
    fn created(&self) -> Vec<(i32, i32)>;
    /// Kills a process the watched CRIU created, and no other that has its pid now.
    fn kill_created(&self, pid: i32);
    /// Where the guardian writes when CRIU is gone: syslog and its log ([`LOG_FILE`]).
    fn record(&self, level: Level, line: &str);
    /// The image directory, for checking image files.
    fn image_dir(&self) -> Option<PathBuf> {
        None
    }
    /// What CRIU leaves behind when it dies; none unless the machine says otherwise.
    fn leftovers(&self) -> &dyn Leftovers {
        &NoLeftovers
    }
    /// NVIDIA: the CUDA driver, loaded in the guardian (never in CRIU), or why there is none.
    fn cuda(&self) -> Result<&dyn CudaDriver, String> {
        Err("this guardian has no CUDA support".to_owned())
    }
    /// AMD: amdkfd's queue control, or why there is none.
    fn amd(&self) -> Result<&dyn KfdQueues, String> {
        Err("this guardian has no AMD support".to_owned())
    }
}

/// What CRIU leaves behind when it dies before it cleaned up, and the guardian puts right. Each
/// answers what it did, for the record; nothing was there to do by default.
pub trait Leftovers: Send + Sync {
    /// Takes back the network lock of the watched CRIU run (of the dumping run, on `restore`).
    fn unlock_network(&self, _restore: bool) -> Option<String> {
        None
    }
    /// Dump: takes the job's sockets out of the TCP repair mode CRIU left them in.
    fn release_repair(&self, _tracked: &[i32]) -> Option<String> {
        None
    }
    /// Restore: removes the image's unlinked files that the restore made and left.
    fn remove_ghosts(&self) -> Vec<String> {
        Vec::new()
    }
    /// The node's huge page policy, if the guardian may change it (and so put it back).
    fn thp(&self) -> Option<Thp> {
        None
    }
}

/// A machine where CRIU leaves nothing the guardian could put right (tests).
pub struct NoLeftovers;

impl Leftovers for NoLeftovers {}

/// The CUDA driver as the guardian uses it.
pub trait CudaDriver: Send + Sync {
    fn info(&self) -> DriverInfo;
    fn restore_tid(&self, pid: i32) -> Result<i32, CudaError>;
    fn state(&self, pid: i32) -> Result<ProcessState, CudaError>;
    fn lock(&self, pid: i32, timeout: Duration) -> Result<(), CudaError>;
    fn checkpoint(&self, pid: i32) -> Result<(), CudaError>;
    fn restore(&self, pid: i32, map: &DeviceMap) -> Result<(), CudaError>;
    fn unlock(&self, pid: i32) -> Result<(), CudaError>;
    fn inventory(&self) -> Result<Inventory, String>;
}

/// amdkfd's queue control as the guardian uses it.
pub trait KfdQueues: Send + Sync {
    /// Restarts the GPU queues of process `pid` that a dump paused through its KFD file `file`
    /// (the process's own open file, handed over by the plugin). Only once CRIU is gone:
    /// amdkfd takes these calls from the process itself or from its tracer only.
    fn unpause(&self, pid: i32, file: BorrowedFd<'_>) -> Result<Unpaused, String>;
}

/// What an UNPAUSE from the guardian found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpaused {
    /// The queues were paused and run again.
    Running,
    /// They were not paused (the dump had not paused them yet, or had restarted them).
    WasNot,
    /// The process has exited.
    Gone,
}
