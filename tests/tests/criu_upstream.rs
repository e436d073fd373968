//! Interoperation with CRIU's own C CUDA plugin (built from the same CRIU source): it drives
//! `cuda-checkpoint-ctl` installed as `cuda-checkpoint`, and what it dumps, this project's
//! plugin restores.

use gpu_ckpt_tests::criu::{self, assert_ok, Criu};
use gpu_ckpt_tests::*;

/// A directory with `cuda-checkpoint` -> cuda-checkpoint-ctl, first in PATH.
fn drop_in(sim: &Sim) -> String {
    let bin = sim.dir.join("drop-in");
    std::fs::create_dir_all(&bin).unwrap();
    let link = bin.join("cuda-checkpoint");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(artifact("cuda-checkpoint-ctl"), &link).unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// CRIU's plugin only runs where /proc/driver/nvidia/gpus exists, unless CRIU's fault 138
/// ("force enable") is on; that is what CRIU's own CI does with its mock cuda-checkpoint.
const FORCE: (&str, &str) = ("CRIU_FAULT", "138");

#[test]
fn criu_cuda_plugin_uses_cuda_checkpoint_ctl_as_cuda_checkpoint() {
    let mut sim = Sim::start();
    let c = Criu::upstream_cuda(&sim);
    let path = drop_in(&sim);
    let env = [("PATH", path.as_str()), FORCE];
    let app = sim.app("app", &["--mib", "16"]);
    let images = sim.dir.join("img");
    assert_ok(
        &c.dump(&sim, app.pid, &images, &[], &env),
        &images,
        "dump.log",
    );
    let log = criu::log(&images, "dump.log");
    assert!(
        log.contains("cuda_plugin: Checkpointing CUDA devices on pid"),
        "{}",
        criu::tail(&log, 30)
    );
    wait_gone(app.pid);
    assert_ok(&c.restore(&sim, &images, &[], &env), &images, "restore.log");
    sim.adopt(app.pid);
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
    assert_eq!(sim.state(app.pid), "running");
}

#[test]
fn images_of_criu_cuda_plugin_restore_with_this_plugin() {
    let mut sim = Sim::start();
    let upstream = Criu::upstream_cuda(&sim);
    let ours = Criu::new(&sim);
    let path = drop_in(&sim);
    let app = sim.app("app", &["--mib", "16"]);
    let images = sim.dir.join("img");
    let out = upstream.dump(
        &sim,
        app.pid,
        &images,
        &[],
        &[("PATH", path.as_str()), FORCE],
    );
    assert_ok(&out, &images, "dump.log");
    assert!(
        !images.join("gpu-cuda.json").exists(),
        "an image of the C plugin"
    );
    // What it holds, and whether this node restores it, before the restore.
    for (args, want) in [
        (
            vec!["inspect"],
            "dumped by CRIU's cuda_plugin (1 process(es))",
        ),
        (vec!["check"], "OK: this node can restore it"),
    ] {
        let out = std::process::Command::new(artifact("criu-gpu"))
            .args(&args)
            .arg(&images)
            .envs(sim.env())
            .env("CRIU_GPU_CONFIG", "/nonexistent")
            .output()
            .unwrap();
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(
            text.contains(want)
                && text.contains(&app.pid.to_string())
                && text.contains("cuda-sim-app"),
            "{args:?}: {text}"
        );
    }
    wait_gone(app.pid);
    assert_ok(
        &ours.restore(&sim, &images, &[], &[]),
        &images,
        "restore.log",
    );
    sim.adopt(app.pid);
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("criu_gpu: restored CUDA state of 1 of 1"),
        "{}",
        criu::tail(&log, 30)
    );
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}
