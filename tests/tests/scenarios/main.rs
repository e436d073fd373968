//! The scenarios written once and run on two machines: the simulated GPU (CI, `cargo test`) and a
//! real NVIDIA machine (`GPU_CKPT_MACHINE=nvidia`, from this test binary carried there:
//! scripts/gpu/scenarios.sh). Each starts applications that check every word of their device
//! data at every step, drives the CLI or the real CRIU with the plugin, and ends with the
//! applications running with their data, or a clear refusal with nothing locked.
//!
//! Modules by what they drive: `ctl` (cuda-checkpoint-ctl alone), `criu` (dumps and restores),
//! `failures` (CRIU stopped in every way a runtime or an operator stops it), `interop` (CRIU's
//! own C CUDA plugin), `job` (distributed jobs with criu-gpu).

mod criu;
mod ctl;
mod failures;
mod interop;
mod job;

use std::path::Path;

use gpu_ckpt_tests::criu::{assert_ok, Criu};
use gpu_ckpt_tests::scenario::Host;
use gpu_ckpt_tests::{wait_gone, App};

/// Data each application of a scenario holds: small on the simulation, 1 GiB on a GPU.
pub fn data_mib(host: &Host) -> u64 {
    if host.is_sim() {
        32
    } else {
        1024
    }
}

/// Dumps `root` (killing its tree), waits for its pids to be free, restores it; the
/// applications' pids are the host's again.
pub fn dump_kill_restore(
    host: &mut Host,
    c: &Criu,
    root: i32,
    apps: &[&App],
    images: &Path,
    env: &[(&str, &str)],
) {
    let tree = process_facts::process::tree(root);
    assert_ok(&c.dump(host, root, images, &[], env), images, "dump.log");
    for pid in &tree {
        wait_gone(*pid);
    }
    assert_ok(&c.restore(host, images, &[], env), images, "restore.log");
    host.own(root);
    for app in apps {
        host.runs_with_its_data(app);
    }
}
