//! The GPU backends. Each lives in its own folder and implements [`crate::core::Backend`];
//! adding a vendor means adding a folder and a line in [`all`].

pub mod amd;
pub mod cuda;

use crate::core::Backend;

/// Every backend, in the order CRIU's calls are offered to them; the CUDA one makes its driver
/// calls through guardians started by `spawn`.
pub fn all(spawn: cuda::SpawnGuardian) -> Vec<Box<dyn Backend>> {
    vec![Box::new(cuda::Cuda::new(spawn)), Box::new(amd::Amd::new())]
}
