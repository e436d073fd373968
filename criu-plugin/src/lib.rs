//! `criu_gpu`: a CRIU plugin that checkpoints and restores GPU processes through the vendor
//! drivers, with no change to the applications.
//!
//! Layout: [`abi`] is the C edge CRIU calls (descriptor, hook trampolines, CRIU's internals,
//! ptrace); [`core`] is the logic and the [`core::Vendor`] trait; [`vendor`] holds one folder per
//! GPU vendor. Logs go to CRIU's log through [`log`].

pub mod abi;
pub mod check;
pub mod core;
pub mod log;
pub mod vendor;
