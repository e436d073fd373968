//! `criu_gpu`: a CRIU plugin that checkpoints and restores GPU processes through the vendor
//! drivers, with no change to the applications.
//!
//! Layers, each importing only those below it:
//!
//! - [`abi`], the C edge CRIU calls: the descriptor, the hook trampolines, CRIU's internals,
//!   ptrace, the guardian's fork and the log writer; it hands each hook to the backends;
//! - [`backends`], one folder per GPU vendor, each implementing [`core::Backend`];
//! - below them, side by side and unaware of each other, [`guardian`] (the process that makes
//!   the driver calls and outlives CRIU; [`guardian::SpawnGuardian`] starts one) and [`core`]
//!   (CRIU's rules: stages, the `Backend` and `Host` traits, dispatch, hook errors);
//! - [`log`], a leaf: lines into CRIU's log through a writer the C edge installs.
//!
//! The checkpoint image and the checks before a restore are the `criu-gpu-image` crate's.

// Code that runs inside CRIU answers with errors, never a panic (the C edge would catch one and
// fail the hook, but a panic says nothing an operator can act on); tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod abi;
pub mod backends;
pub mod core;
pub mod guardian;
pub mod log;
