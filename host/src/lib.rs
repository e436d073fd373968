//! This machine, as GPU checkpoints meet it (the checkpoint itself is `criu-gpu-image`'s): its
//! CRIU binary ([`criu_bin`]), the plugin's settings, read once from the environment and
//! `/etc/criu/gpu-plugin.conf` ([`settings`]), the node's transparent huge page policy raised
//! for a dump and put back ([`thp`]), CRIU's network lock: which one this node can take, and
//! taking a run's back when CRIU cannot ([`netlock`]), and whether this node can restore a
//! checkpoint, the plugin's checks run from a tool that loads the drivers itself
//! ([`restore_check`]).

// CRIU loads this library with the plugin: its code answers with errors, never a panic (see
// criu-plugin/src/lib.rs); tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod criu_bin;
pub mod netlock;
pub mod restore_check;
pub mod settings;
pub mod thp;
