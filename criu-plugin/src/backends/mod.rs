//! The GPU backends. Each lives in its own folder and implements [`crate::core::Backend`];
//! adding a vendor means adding a folder and a line in [`all`].

pub mod amd;
pub mod cuda;

use crate::core::Backend;
use crate::guardian::SpawnGuardian;

/// Every backend, in the order CRIU's calls are offered to them; each starts the guardians it
/// needs with `spawn` (the CUDA one makes its driver calls through them).
pub fn all(spawn: SpawnGuardian) -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(cuda::Cuda::new(spawn.clone())),
        Box::new(amd::Amd::new(spawn)),
    ]
}
