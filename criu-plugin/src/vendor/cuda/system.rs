//! Everything the CUDA backend asks of the machine: the driver, NVML and /proc. A trait, so the
//! backend's decisions can be tested without a GPU or processes.

use std::time::Duration;

use cuda_checkpoint_ctl::driver::{CudaError, DeviceMap, Driver, DriverInfo, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;
use cuda_checkpoint_ctl::process;

pub trait CudaSystem: Send + Sync {
    fn driver_info(&self) -> DriverInfo;
    fn restore_thread_id(&self, pid: i32) -> Result<i32, CudaError>;
    fn state(&self, pid: i32) -> Result<ProcessState, CudaError>;
    fn lock(&self, pid: i32, timeout: Duration) -> Result<(), CudaError>;
    fn checkpoint(&self, pid: i32) -> Result<(), CudaError>;
    fn restore(&self, pid: i32, map: &DeviceMap) -> Result<(), CudaError>;
    fn unlock(&self, pid: i32) -> Result<(), CudaError>;
    /// NVML's view, if NVML is there.
    fn inventory(&self) -> Option<Inventory>;

    /// Cheap test before asking the driver: does the process map a CUDA driver library?
    fn maps_libcuda(&self, pid: i32) -> bool;
    /// Stopped by a signal or a frozen cgroup: its driver thread cannot run.
    fn is_stopped(&self, pid: i32) -> bool;
    fn ns_pid(&self, pid: i32) -> Option<i32>;
    fn comm(&self, pid: i32) -> Option<String>;
    /// A process and its descendants, parents first.
    fn tree(&self, root: i32) -> Vec<i32>;
    fn kill(&self, pid: i32);
}

/// The machine itself.
pub struct Real {
    driver: Driver,
}

impl Real {
    pub fn load() -> Result<Real, cuda_checkpoint_ctl::driver::LoadError> {
        Ok(Real {
            driver: Driver::load(None)?,
        })
    }
}

impl CudaSystem for Real {
    fn driver_info(&self) -> DriverInfo {
        self.driver.info().clone()
    }
    fn restore_thread_id(&self, pid: i32) -> Result<i32, CudaError> {
        self.driver.restore_thread_id(pid)
    }
    fn state(&self, pid: i32) -> Result<ProcessState, CudaError> {
        self.driver.state(pid)
    }
    fn lock(&self, pid: i32, timeout: Duration) -> Result<(), CudaError> {
        self.driver.lock(pid, Some(timeout))
    }
    fn checkpoint(&self, pid: i32) -> Result<(), CudaError> {
        self.driver.checkpoint(pid)
    }
    fn restore(&self, pid: i32, map: &DeviceMap) -> Result<(), CudaError> {
        self.driver.restore(pid, map)
    }
    fn unlock(&self, pid: i32) -> Result<(), CudaError> {
        self.driver.unlock(pid)
    }
    fn inventory(&self) -> Option<Inventory> {
        Inventory::query(None)
            .map_err(|e| tracing::info!("NVML unavailable, GPU usage not recorded: {e}"))
            .ok()
    }
    fn maps_libcuda(&self, pid: i32) -> bool {
        process::maps_libcuda(pid)
    }
    fn is_stopped(&self, pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("State:").map(|v| v.trim().starts_with('T')))
            })
            .unwrap_or(false)
    }
    fn ns_pid(&self, pid: i32) -> Option<i32> {
        process::ns_pid(pid)
    }
    fn comm(&self, pid: i32) -> Option<String> {
        process::comm(pid)
    }
    fn tree(&self, root: i32) -> Vec<i32> {
        process::tree(root)
    }
    fn kill(&self, pid: i32) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
