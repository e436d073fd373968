//! GPU inventory through NVML: the GPUs of this machine, their memory, and which processes
//! hold memory on which GPU. Used for listings, and to check a restore target before restoring.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use serde::{Deserialize, Serialize};

use crate::driver::GpuUuid;

/// The environment variable that names the NVML library (a path or a soname).
pub const LIBNVML_ENV: &str = "CUDA_CKPT_LIBNVML";
pub const DEFAULT_LIBNVML: &str = "libnvidia-ml.so.1";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: GpuUuid,
    pub name: String,
    pub memory_total: u64,
    pub memory_used: u64,
    pub memory_free: u64,
    /// The N of its device node `/dev/nvidiaN` (not always the index), when NVML tells.
    #[serde(default)]
    pub minor: Option<u32>,
}

/// Memory a process holds on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUsage {
    pub pid: i32,
    pub gpu: GpuUuid,
    /// None where NVML cannot tell (e.g. some containers, MIG).
    pub memory: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Inventory {
    pub nvml_library: String,
    pub driver_version: String,
    pub cuda_version: Option<i32>,
    pub gpus: Vec<Gpu>,
    pub processes: Vec<GpuUsage>,
}

/// NVML cannot be used: which library, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "NVML ({library}) cannot be used: {reason}; install the NVIDIA driver's NVML \
     (libnvidia-ml.so.1), or name it with --nvml PATH or CUDA_CKPT_LIBNVML=PATH"
)]
pub struct NvmlError {
    pub library: String,
    pub reason: String,
}

impl Inventory {
    /// Reads the machine's GPUs from `library`, else the system NVML. (The caller reads
    /// `$CUDA_CKPT_LIBNVML`, [`LIBNVML_ENV`], where its user sets it.)
    pub fn query(library: Option<&str>) -> Result<Inventory, NvmlError> {
        let lib = library.unwrap_or(DEFAULT_LIBNVML).to_owned();
        let err = |reason: String| NvmlError {
            library: lib.clone(),
            reason,
        };
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new(&lib))
            .init()
            .map_err(|e| err(e.to_string()))?;
        let mut inv = Inventory {
            nvml_library: lib.clone(),
            driver_version: nvml.sys_driver_version().map_err(|e| err(e.to_string()))?,
            cuda_version: nvml.sys_cuda_driver_version().ok(),
            gpus: Vec::new(),
            processes: Vec::new(),
        };
        let count = nvml.device_count().map_err(|e| err(e.to_string()))?;
        for index in 0..count {
            let dev = nvml
                .device_by_index(index)
                .map_err(|e| err(e.to_string()))?;
            let uuid_text = dev.uuid().map_err(|e| err(e.to_string()))?;
            let Ok(uuid) = uuid_text.parse::<GpuUuid>() else {
                tracing::debug!(uuid = %uuid_text, "skipping a device without a GPU UUID (MIG?)");
                continue;
            };
            let mem = dev.memory_info().map_err(|e| err(e.to_string()))?;
            let minor = dev.minor_number().ok();
            inv.gpus.push(Gpu {
                minor,
                index,
                uuid,
                name: dev.name().unwrap_or_default(),
                memory_total: mem.total,
                memory_used: mem.used,
                memory_free: mem.free,
            });
            for p in dev.running_compute_processes().unwrap_or_default() {
                inv.processes.push(GpuUsage {
                    pid: p.pid as i32,
                    gpu: uuid,
                    memory: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                });
            }
        }
        Ok(inv)
    }

    pub fn gpu(&self, uuid: GpuUuid) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// The GPUs `pid` holds memory on.
    pub fn usage_of(&self, pid: i32) -> Vec<GpuUsage> {
        self.processes
            .iter()
            .filter(|p| p.pid == pid)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_nvml_is_a_clear_error() {
        let err = Inventory::query(Some("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/libnvidia-ml.so.1"), "{msg}");
    }
}
