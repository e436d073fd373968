//! The facts about a process that a GPU checkpoint needs and that no GPU driver gives: the one
//! /proc reader ([`process`]: trees, libraries, what holds a thread, files, sockets, io_uring
//! rings), the NCCL settings a rank runs with ([`nccl`]), what a checkpoint refuses because of
//! them ([`refusal`]), sizes as people read them and switches as
//! they write them ([`units`]). Vendor-neutral: the NVIDIA
//! crate, the AMD backend, the plugin's core and the tools all read processes through it.

// CRIU loads this library with the plugin: its code answers with errors, never a panic (see
// criu-plugin/src/lib.rs); tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod nccl;
pub mod process;
pub mod refusal;
pub mod units;
