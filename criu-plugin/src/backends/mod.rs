//! The GPU backends. Each lives in its own folder and implements [`crate::core::Backend`];
//! adding a vendor means adding a folder and a line in [`all`].

pub mod amd;
pub mod cuda;

use std::sync::Arc;

use crate::core::{Backend, Settings};
use crate::guardian::SpawnGuardian;

/// Every backend, in the order CRIU's calls are offered to them, with the command's `settings`;
/// each starts the guardians it needs with `spawn` (the CUDA one makes its driver calls through
/// them).
pub fn all(settings: Arc<Settings>, spawn: SpawnGuardian) -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(cuda::Cuda::new(settings.clone(), spawn.clone())),
        Box::new(amd::Amd::new(settings, spawn)),
    ]
}
