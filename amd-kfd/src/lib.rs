//! The AMD side of GPU checkpointing: amdkfd's CRIU interface.
//!
//! * [`uapi`]: the ioctl structs and codes, checked against the system's `linux/kfd_ioctl.h`;
//! * [`topology`]: the KFD topology in sysfs and the GPU matching for restore elsewhere;
//! * [`image`]: the versioned, checksummed image file of one process's KFD state;
//! * [`device`]: the KFD operations behind one trait, for the kernel and for a simulation;
//! * [`dump`], [`restore`], [`vma`]: the sequences CRIU's hooks run.

// CRIU loads this library with the plugin: its code answers with errors, never a panic (see
// criu-plugin/src/lib.rs); tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
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
