//! Interoperation with CRIU's own C CUDA plugin (built from the same CRIU source): it drives
//! `cuda-checkpoint-ctl` installed as `cuda-checkpoint`, and what it dumps, this project's
//! plugin restores.

use gpu_ckpt_tests::criu::{self, assert_ok, Criu};
use gpu_ckpt_tests::scenario::{Host, Work};
use gpu_ckpt_tests::{artifact, stderr, stdout, wait_gone, Machine};

/// A directory with `cuda-checkpoint` -> cuda-checkpoint-ctl, first in PATH.
fn drop_in(host: &Host) -> String {
    let bin = host.path("drop-in");
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
/// ("force enable") is on; that is what CRIU's own CI does with its mock cuda-checkpoint. A GPU
/// machine has the directory: the fault is for the simulation only.
fn upstream_env<'a>(host: &Host, path: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![("PATH", path)];
    if host.is_sim() {
        env.push(("CRIU_FAULT", "138"));
    }
    env
}

#[test]
fn criu_cuda_plugin_uses_cuda_checkpoint_ctl_as_cuda_checkpoint() {
    let mut host = Host::start();
    let c = Criu::upstream_cuda(&host);
    let path = drop_in(&host);
    let env = upstream_env(&host, &path);
    let app = host.app("app", &Work::mib(16));
    let images = host.path("img");
    assert_ok(
        &c.dump(&host, app.pid, &images, &[], &env),
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
    assert_ok(
        &c.restore(&host, &images, &[], &env),
        &images,
        "restore.log",
    );
    host.own(app.pid);
    host.runs_with_its_data(&app);
}

#[test]
fn images_of_criu_cuda_plugin_restore_with_this_plugin() {
    let mut host = Host::start();
    let upstream = Criu::upstream_cuda(&host);
    let ours = Criu::new(&host);
    let path = drop_in(&host);
    let app = host.app("app", &Work::mib(16));
    let images = host.path("img");
    let env = upstream_env(&host, &path);
    let out = upstream.dump(&host, app.pid, &images, &[], &env);
    assert_ok(&out, &images, "dump.log");
    assert!(
        !images.join("gpu-cuda.json").exists(),
        "an image of the C plugin"
    );
    let program = std::fs::read_to_string(format!("/proc/{}/comm", app.pid)).unwrap_or_default();
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
            .envs(host.env())
            .env("CRIU_GPU_CONFIG", "/nonexistent")
            .output()
            .unwrap();
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(
            text.contains(want)
                && text.contains(&app.pid.to_string())
                && text.contains(program.trim()),
            "{args:?}: {text}"
        );
    }
    wait_gone(app.pid);
    assert_ok(
        &ours.restore(&host, &images, &[], &[]),
        &images,
        "restore.log",
    );
    host.own(app.pid);
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("criu_gpu: restored CUDA state of 1 of 1"),
        "{}",
        criu::tail(&log, 30)
    );
    host.runs_with_its_data(&app);
}
