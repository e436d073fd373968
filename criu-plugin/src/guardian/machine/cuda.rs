//! NVIDIA: the CUDA driver as the guardian's [`CudaDriver`], loaded in the guardian (never in
//! CRIU's process).

use std::time::Duration;

use cuda_checkpoint_ctl::driver::{CudaError, DeviceMap, Driver, DriverInfo, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;

use super::CudaDriver;

impl CudaDriver for Driver {
    fn info(&self) -> DriverInfo {
        Driver::info(self).clone()
    }
    fn restore_tid(&self, pid: i32) -> Result<i32, CudaError> {
        self.restore_thread_id(pid)
    }
    fn state(&self, pid: i32) -> Result<ProcessState, CudaError> {
        Driver::state(self, pid)
    }
    fn lock(&self, pid: i32, timeout: Duration) -> Result<(), CudaError> {
        Driver::lock(self, pid, Some(timeout))
    }
    fn checkpoint(&self, pid: i32) -> Result<(), CudaError> {
        Driver::checkpoint(self, pid)
    }
    fn restore(&self, pid: i32, map: &DeviceMap) -> Result<(), CudaError> {
        Driver::restore(self, pid, map)
    }
    fn unlock(&self, pid: i32) -> Result<(), CudaError> {
        Driver::unlock(self, pid)
    }
    fn inventory(&self) -> Result<Inventory, String> {
        Inventory::query(None).map_err(|e| e.to_string())
    }
}
