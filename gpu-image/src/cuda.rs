//! What the CUDA part of a checkpoint records (`gpu-cuda.json` in the image directory): the
//! processes that held CUDA state and what they were, the GPUs the driver saw, the driver, and
//! digests of the image files.

use cuda_checkpoint_ctl::driver::{DriverInfo, GpuUuid, ProcessState};
use cuda_checkpoint_ctl::inventory::Gpu;
use serde::{Deserialize, Serialize};

use crate::digest::FileDigest;

/// The CUDA backend's entry in the image's inventory.
pub const INVENTORY_NAME: &str = "criu_gpu_cuda";
/// The file in the image directory.
pub const RECORD: &str = "gpu-cuda.json";
pub const FORMAT: &str = "criu-gpu/cuda";
/// 2: every GPU the driver saw, image digests, NCCL.
pub const VERSION: u32 = 2;

/// The CUDA part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaImage {
    pub driver: DriverInfo,
    /// NVML's driver version of the dumping machine, when known.
    pub driver_version: Option<String>,
    /// Every GPU of the dumping machine (what the driver saw at checkpoint time: a restore onto
    /// other GPUs must map each of them).
    pub gpus: Vec<Gpu>,
    pub processes: Vec<ProcessRecord>,
    /// Digests of the image files, taken when the dump ended (empty when it could not).
    #[serde(default)]
    pub digests: Vec<FileDigest>,
    /// Every process of the dumped tree, by its pid in its own namespace (a restore into the
    /// same pid namespace gives them back these pids).
    #[serde(default)]
    pub tree: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// The pid inside the process's own pid namespace: what CRIU restores it as.
    pub ns_pid: i32,
    /// The pid at dump time, in CRIU's namespace (for messages).
    pub pid: i32,
    pub comm: String,
    /// The CUDA state before the dump; restore returns the process to it.
    pub initial_state: ProcessState,
    /// GPU memory held per GPU; empty when NVML could not tell.
    pub gpus: Vec<Usage>,
    /// The process had NCCL loaded.
    #[serde(default)]
    pub nccl: bool,
    /// Where its checkpoint put the device memory in the process (the driver's staging, plain
    /// private memory that only the driver's restore reads): a restore lets these pages arrive
    /// while the driver already runs. Empty in records of earlier releases.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub staging: Vec<Span>,
}

/// An address range of a process, `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub start: u64,
    pub end: u64,
}

impl Span {
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub uuid: GpuUuid,
    pub memory: Option<u64>,
}

impl CudaImage {
    /// Device memory the processes held, in bytes (what their GPU checkpoint moved).
    pub fn device_bytes(&self) -> u64 {
        self.processes
            .iter()
            .flat_map(|p| p.gpus.iter().filter_map(|u| u.memory))
            .sum()
    }

    /// Bytes of the processes' staging (see `ProcessRecord::staging`).
    pub fn staging_bytes(&self) -> u64 {
        self.processes
            .iter()
            .flat_map(|p| p.staging.iter().map(Span::len))
            .sum()
    }
}
