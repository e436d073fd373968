//! The GPU backends. Each lives in its own folder and implements [`crate::core::Backend`];
//! adding a vendor means adding a folder and a line in [`all`].

pub mod amd;
pub mod cuda;

use crate::core::Backend;

/// Every backend, in the order CRIU's calls are offered to them.
pub fn all() -> Vec<Box<dyn Backend>> {
    vec![Box::new(cuda::Cuda::new()), Box::new(amd::Amd::new())]
}
