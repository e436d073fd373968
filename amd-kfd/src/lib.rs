//! The AMD side of GPU checkpointing: amdkfd's CRIU interface.
//!
//! * [`uapi`]: the ioctl structs and codes, checked against the system's `linux/kfd_ioctl.h`;
//! * [`topology`]: the KFD topology in sysfs and the GPU matching for restore elsewhere;
//! * [`image`]: the versioned, checksummed image file of one process's KFD state;
//! * [`device`]: the KFD operations behind one trait, for the kernel and for a simulation;
//! * [`dump`], [`restore`], [`vma`]: the sequences CRIU's hooks run.

// Tests read as one scenario each: the length limit is for the library.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod device;
pub mod dump;
pub mod image;
pub mod restore;
pub mod topology;
pub mod uapi;
pub mod vma;

#[cfg(test)]
mod tests;
