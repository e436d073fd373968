//! `criu_gpu`: a CRIU plugin that checkpoints and restores GPU processes through the vendor
//! drivers, with no change to the applications.
//!
//! Layout: [`abi`] is the C edge CRIU calls (descriptor, hook trampolines, CRIU's internals,
//! ptrace); [`core`] holds CRIU's rules and the [`core::Backend`] trait; [`backends`] one folder
//! per GPU vendor; [`guardian`] the process that makes the driver calls and outlives CRIU. Logs
//! go to CRIU's log through [`log`].

pub mod abi;
pub mod backends;
pub mod check;
pub mod core;
pub mod guardian;
pub mod log;
