//! `criu-gpu`, the operator's command around GPU checkpoints: `dump` and `restore` take a GPU
//! job through CRIU with the options it needs ([`job`]); `check` and `inspect` read a
//! checkpoint wherever it is ([`archive`]), `doctor` looks at this node ([`doctor`]),
//! `runtime-config` writes the network lock it can take into the container runtimes' CRIU
//! settings ([`runtime_conf`]), `thp` runs a command with huge pages ([`thp`]). `node`
//! (checkpoint, drain and restore the GPU workloads of a Kubernetes node) and `image` (an archive
//! as a CRI-O checkpoint image) are the `criu-gpu-node` crate's: [`node`] turns their arguments
//! into its options. `check` ([`check`]) says the verdict on a checkpoint.

pub mod archive;
pub mod check;
pub mod cli;
pub mod doctor;
pub mod error;
pub mod human;
pub mod inspect;
pub mod job;
pub mod node;
pub mod out;
pub mod runtime_conf;
pub mod snapshots;
pub mod thp;

/// CRIU's binary as this command finds it: $CRIU, then PATH, then where
/// scripts/install-criu.sh puts it.
pub fn find_criu() -> Option<std::path::PathBuf> {
    criu_gpu_host::criu_bin::find_criu(
        std::env::var_os("CRIU").map(Into::into),
        std::env::var_os("PATH").as_deref(),
    )
}
