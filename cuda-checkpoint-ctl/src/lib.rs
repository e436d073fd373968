//! The NVIDIA side of GPU checkpointing: the CUDA driver's process checkpoint API
//! (`cuCheckpointProcess{Lock,Checkpoint,Restore,Unlock,GetState,GetRestoreThreadId}`), loaded at
//! run time, with process discovery, GPU inventory and group operations on top.
//!
//! ```no_run
//! use cuda_checkpoint_ctl::{driver::Driver, ops};
//! let driver = Driver::load(None)?;
//! let mut t = ops::Timings::default();
//! ops::suspend(&driver, 1234, Some(std::time::Duration::from_secs(5)), &mut t)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// CRIU loads this library with the plugin: its code answers with errors, never a panic (see
// criu-plugin/src/lib.rs); tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod driver;
pub mod error;
pub mod inventory;
pub mod ops;
pub mod placement;

pub use error::{Error, Result};
