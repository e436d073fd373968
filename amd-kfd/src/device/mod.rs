//! The KFD operations checkpointing needs, behind one trait: the kernel's ([`real::RealKfd`])
//! and a simulation for machines without an AMD GPU ([`sim::SimKfd`]), which enforces the
//! kernel's order and rules.

pub mod real;
#[cfg(any(test, feature = "simulation"))]
pub mod sim;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use crate::uapi::{BoBucket, DeviceBucket};

/// What PROCESS_INFO reports (and, as a side effect, the process's queues are now paused).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The process's pid in its own pid namespace.
    pub pid: u32,
    pub num_devices: u32,
    pub num_bos: u32,
    pub num_objects: u32,
    pub priv_data_size: u64,
}

/// What CHECKPOINT returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    pub devices: Vec<DeviceBucket>,
    pub bos: Vec<BoBucket>,
    pub priv_data: Vec<u8>,
}

/// A failed KFD operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct KfdError {
    pub op: &'static str,
    pub errno: Option<i32>,
    pub message: String,
}

impl KfdError {
    pub fn new(op: &'static str, errno: i32, message: impl Into<String>) -> KfdError {
        KfdError {
            op,
            errno: Some(errno),
            message: message.into(),
        }
    }

    /// RESUME's answer for a process without KFD state: not an error, not ours.
    pub fn is_no_such_process(&self) -> bool {
        self.errno == Some(libc::ESRCH)
    }
}

pub trait Kfd: Send + Sync {
    /// For messages: which KFD this is.
    fn describe(&self) -> String;
    /// Where this KFD's topology is (sysfs for the kernel's).
    fn topology_root(&self) -> std::path::PathBuf;
    /// The KFD ioctl version (major, minor).
    fn version(&self) -> Result<(u32, u32), KfdError>;
    /// Whether an fd of a dumped process (CRIU's copy) is a KFD device file.
    fn is_kfd_file(&self, fd: BorrowedFd<'_>) -> bool;
    /// Whether a `/proc/PID/fd/N` link names a KFD device file.
    fn is_kfd_link(&self, fd_link: &Path) -> bool;
    /// The render-node minor if the fd is a GPU render node.
    fn render_minor(&self, fd: BorrowedFd<'_>) -> Option<u32>;

    /// PROCESS_INFO: counts, and pauses the process's queues.
    fn process_info(&self, fd: BorrowedFd<'_>) -> Result<ProcessInfo, KfdError>;
    /// CHECKPOINT: queues must be paused and the counts current.
    fn checkpoint(&self, fd: BorrowedFd<'_>, info: &ProcessInfo) -> Result<Checkpoint, KfdError>;
    /// Copies `dst.len()` bytes of a checkpointed buffer from `offset`.
    fn read_bo(
        &self,
        fd: BorrowedFd<'_>,
        bo: &BoBucket,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), KfdError>;
    /// Closes what CHECKPOINT or RESTORE handed out for the buffers (dma-buf fds).
    fn release(&self, bos: &[BoBucket]);
    /// UNPAUSE: restarts the queues PROCESS_INFO paused.
    fn unpause(&self, fd: BorrowedFd<'_>) -> Result<(), KfdError>;

    /// In the restored process: a new KFD file, at an fd number >= `min_fd`.
    fn open_for_restore(&self, min_fd: i32) -> Result<OwnedFd, KfdError>;
    /// A render node of a local GPU, at an fd number >= `min_fd`.
    fn open_render(&self, minor: u32, min_fd: i32) -> Result<OwnedFd, KfdError>;
    /// RESTORE: recreates buffers, queues and events; fills in the buffers' new offsets.
    fn restore(
        &self,
        fd: BorrowedFd<'_>,
        devices: &[DeviceBucket],
        bos: &mut [BoBucket],
        num_objects: u32,
        priv_data: &[u8],
    ) -> Result<(), KfdError>;
    fn write_bo(
        &self,
        fd: BorrowedFd<'_>,
        bo: &BoBucket,
        offset: u64,
        src: &[u8],
    ) -> Result<(), KfdError>;
    /// RESUME, from CRIU once the process's mappings exist.
    fn resume(&self, pid: u32) -> Result<(), KfdError>;
}

/// The fds of process `pid` that are KFD files.
fn kfd_fds(kfd: &dyn Kfd, pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| kfd.is_kfd_link(&e.path()))
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether process `pid` has a KFD file open.
pub fn holds_kfd(kfd: &dyn Kfd, pid: i32) -> bool {
    !kfd_fds(kfd, pid).is_empty()
}

/// Whether process `pid` has `file` open, a KFD file (CRIU's copy of it, in CRIU). Where the
/// kernel cannot compare files (no kcmp), any KFD file of `pid` counts.
pub fn has_open(kfd: &dyn Kfd, pid: i32, file: BorrowedFd<'_>) -> bool {
    kfd_fds(kfd, pid)
        .into_iter()
        .any(|n| real::same_file(file, pid, n).unwrap_or(true))
}

/// The kernel's KFD, if `/dev/kfd` exists. (The simulated one is opened by name,
/// [`sim::SimKfd::new`], where a test build's settings name it.)
pub fn detect() -> Option<Box<dyn Kfd>> {
    real::RealKfd::open().map(|k| Box::new(k) as Box<dyn Kfd>)
}
