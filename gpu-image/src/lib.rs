//! A GPU checkpoint as this project writes and reads it, outside CRIU and inside: the plugin's
//! records (checksummed JSON, [`record`]; the CUDA one, [`cuda`]; phase times, [`timings`]),
//! digests of every image file ([`digest`]), what it reads of CRIU's own image files
//! ([`criu_image`]), where the GPU state goes on restore ([`placement`]), the checks a restore
//! makes before anything starts ([`restorable`], [`amd`]), where a restore moves the job's
//! connections ([`addrmap`]), and what a checkpoint holds ([`inspect`]). The CRIU plugin and
//! `criu-gpu` both use it; this machine's side (settings, huge pages, CRIU's network lock, the
//! whole restore check from a tool) is `criu-gpu-host`'s.

// CRIU loads this library with the plugin: its code answers with errors, never a panic (see
// criu-plugin/src/lib.rs); tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod addrmap;
pub mod amd;
pub mod cluster;
pub mod criu_image;
pub mod cuda;
pub mod digest;
pub mod inspect;
pub mod placement;
pub mod record;
pub mod restorable;
pub mod timings;
