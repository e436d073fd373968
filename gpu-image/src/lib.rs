//! A GPU checkpoint as this project writes and reads it, outside CRIU and inside: the plugin's
//! records (checksummed JSON, [`record`]; the CUDA one, [`cuda`]), digests of every image file
//! ([`digest`]), the node's settings ([`settings`]) and huge page policy ([`thp`]), where the GPU
//! state goes on restore ([`placement`]), the checks a restore makes before anything starts
//! ([`restorable`], [`amd`]), where a restore moves the job's connections ([`addrmap`]), what a
//! checkpoint holds ([`inspect`]), and CRIU's network lock taken back when CRIU cannot
//! ([`netlock`]). The CRIU plugin and `criu-gpu` both use it; [`node`] runs the whole check from
//! a tool, loading the driver and NVML itself.

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
pub mod netlock;
pub mod node;
pub mod placement;
pub mod record;
pub mod restorable;
pub mod settings;
pub mod thp;
pub mod timings;
