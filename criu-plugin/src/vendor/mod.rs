//! The vendor backends. Each lives in its own folder and implements [`crate::core::Vendor`];
//! adding a vendor means adding a folder and a line in [`all`].

pub mod amd;
pub mod cuda;

use crate::core::Vendor;

/// Every backend, in the order CRIU's calls are offered to them.
pub fn all() -> Vec<Box<dyn Vendor>> {
    vec![Box::new(cuda::Cuda::new()), Box::new(amd::Amd::new())]
}
