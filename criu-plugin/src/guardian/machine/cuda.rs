//! NVIDIA: the CUDA driver and NVML as the guardian's [`CudaDriver`], loaded in the guardian
//! (never in CRIU's process) from the libraries the settings name.

use std::time::Duration;

use cuda_checkpoint_ctl::driver::{CudaError, DeviceMap, Driver, DriverInfo, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;

use criu_gpu_host::settings::declared::{LIBCUDA, LIBNVML};
use criu_gpu_host::settings::Settings;

use super::CudaDriver;

/// The driver, and the NVML library to ask for the machine's GPUs.
pub struct Nvidia {
    driver: Driver,
    nvml: Option<String>,
}

impl Nvidia {
    /// Loads the driver `CUDA_CKPT_LIBCUDA` names (else the system's).
    pub fn load(settings: &Settings) -> Result<Nvidia, String> {
        let library = settings.get(&LIBCUDA).map_err(|e| e.to_string())?;
        let driver = Driver::load(library.as_deref()).map_err(|e| e.to_string())?;
        let nvml = settings.get(&LIBNVML).map_err(|e| e.to_string())?;
        Ok(Nvidia { driver, nvml })
    }
}

impl CudaDriver for Nvidia {
    fn info(&self) -> DriverInfo {
        self.driver.info().clone()
    }
    fn restore_tid(&self, pid: i32) -> Result<i32, CudaError> {
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
    fn inventory(&self) -> Result<Inventory, String> {
        Inventory::query(self.nvml.as_deref()).map_err(|e| e.to_string())
    }
}
