//! containerd 1.6 (Debian's, with runc) checkpointing a container whose process holds GPU state
//! on the simulated driver, through real CRIU and the plugin: `ctr containers checkpoint`, the
//! checkpoint image exported and imported again, the container removed and restored from it,
//! the process going on with its data; then, on a "node" whose GPUs have other UUIDs, the
//! restore refused by `criu-gpu check` and by the plugin inside runc's CRIU, with the reason.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use gpu_ckpt_tests::containerd::{self, Containerd};
use gpu_ckpt_tests::podman::sim_settings;
use gpu_ckpt_tests::*;
use serde_json::{json, Value};

fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        stdout(out),
        stderr(out)
    );
}

/// criu-gpu on the simulated machine, with its settings from the environment only.
fn criu_gpu(sim: &Sim, args: &[&str]) -> std::process::Output {
    std::process::Command::new(artifact("criu-gpu"))
        .args(args)
        .envs(sim.env())
        .env("CRIU_GPU_CONFIG", "/nonexistent")
        .output()
        .unwrap()
}

/// The test application's root file system as an OCI archive, written by criu-gpu's own OCI
/// code (so containerd also checks that code), and imported.
fn import_image(ctd: &Containerd, scratch: &Path) -> String {
    let name = format!("localhost/criu-gpu-test:{}", std::process::id());
    let layout = scratch.join("app-image");
    let spec = criu_gpu_node::oci::ImageSpec {
        reference: name.clone(),
        annotations: BTreeMap::new(),
        runtime_config: json!({"Cmd": ["/usr/bin/cuda-sim-app"], "Env": ["LD_LIBRARY_PATH=/opt/sim/lib"]}),
    };
    criu_gpu_node::oci::write_layout(&layout, &app_rootfs_tar(scratch), None, &spec).unwrap();
    let archive = scratch.join("app-image.tar");
    criu_gpu_node::oci::pack(&layout, &archive).unwrap();
    ok(
        &ctd.ctr(&["images", "import", archive.to_str().unwrap()]),
        "ctr images import",
    );
    name
}

#[test]
fn a_gpu_container_is_checkpointed_exported_imported_and_restored_with_ctr() {
    containerd::require();
    let mut sim = Sim::start();
    let criu = criu::Criu::new(&sim);
    // runc hands this file to CRIU: the plugin under test, CRIU's timeout for the GPU lock.
    let criu_conf = sim.dir.join("criu-runc.conf");
    std::fs::write(
        &criu_conf,
        format!("lib {}\ntimeout 600\n", criu.plugins.display()),
    )
    .unwrap();
    let settings = sim.dir.join("gpu-plugin.conf");
    std::fs::write(&settings, sim_settings(&sim).join("\n")).unwrap();
    let ctd = Containerd::start(&sim.dir, &settings);
    let image = import_image(&ctd, &sim.dir);
    let logs = sim.dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let id = "gpu-app";
    let sock = format!(
        "type=bind,src={},dst=/run/cuda-sim,options=rbind:rw",
        sim.socket.parent().unwrap().display()
    );
    let log_mount = format!(
        "type=bind,src={},dst=/logs,options=rbind:rw",
        logs.display()
    );
    let annotation = format!("org.criu.config={}", criu_conf.display());
    ok(
        &ctd.ctr(&[
            "run",
            "-d",
            "--annotation",
            &annotation,
            "--mount",
            &sock,
            "--mount",
            &log_mount,
            "--env",
            "CUDA_SIM_SOCKET=/run/cuda-sim/gpud.sock",
            &image,
            id,
            "/usr/bin/cuda-sim-app",
            "--log",
            "/logs/app.log",
            "--mib",
            "16",
            "--interval-ms",
            "50",
        ]),
        "ctr run",
    );
    let app = App {
        pid: 0,
        log: logs.join("app.log"),
    };
    assert!(
        wait_until(Duration::from_secs(20), || app.steps() > 2),
        "{}",
        app.tail()
    );
    assert_eq!(sim.gpus()[0].1, 16 << 20);

    let reference = format!("localhost/criu-gpu-checkpoint/{id}:1");
    ok(
        &ctd.ctr(&[
            "containers",
            "checkpoint",
            "--task",
            "--image",
            id,
            &reference,
        ]),
        "ctr containers checkpoint",
    );
    ctd.remove(id);
    assert!(
        wait_until(Duration::from_secs(10), || sim.gpus()[0].1 == 0),
        "the container is gone, its GPU memory free"
    );
    let steps = app.steps();

    // The checkpoint image leaves the machine and comes back.
    let exported = sim.dir.join("checkpoint-image.tar");
    ok(
        &ctd.ctr(&[
            "images",
            "export",
            "--skip-manifest-json",
            exported.to_str().unwrap(),
            &reference,
        ]),
        "ctr images export",
    );
    ok(
        &ctd.ctr(&["images", "remove", &reference]),
        "ctr images remove",
    );
    // Import unpacks the image's platform manifests; the checkpoint's own blobs are not
    // layers, which ctr 1.6 reports, so only the image's presence afterwards is asserted.
    let _ = ctd.ctr(&["images", "import", exported.to_str().unwrap()]);
    let listed = ctd.ctr(&["images", "list", "--quiet"]);
    assert!(
        stdout(&listed).lines().any(|l| l == reference),
        "{}",
        stdout(&listed)
    );

    // What the exported image holds, and that this node can take it.
    let out = criu_gpu(&sim, &["inspect", "--json", exported.to_str().unwrap()]);
    assert_eq!(exit_code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["format"], "containerd-image");
    assert_eq!(
        r["gpu"]["cuda"]["processes"].as_array().unwrap().len(),
        1,
        "{r}"
    );
    let per_gpu = &r["gpu"]["cuda"]["memory_per_gpu"][0];
    assert_eq!(per_gpu["uuid"], sim.gpus()[0].0.as_str(), "{r}");
    // The plugin records None where NVML could not attribute the memory at dump time.
    assert!(
        per_gpu["memory"] == 16 << 20 || per_gpu["memory"].is_null(),
        "{r}"
    );
    assert_eq!(r["this_node"]["can_restore"], true, "{r}");
    let out = criu_gpu(&sim, &["check", exported.to_str().unwrap()]);
    assert_eq!(exit_code(&out), 0, "{}", stdout(&out));

    ok(
        &ctd.ctr(&["containers", "restore", "--live", id, &reference]),
        "ctr containers restore",
    );
    assert!(app.advances(5), "{}", app.tail());
    assert!(app.steps() > steps);
    app.assert_healthy();
    assert_eq!(sim.gpus()[0].1, 16 << 20, "device memory back on the GPU");
    ctd.remove(id);

    // Another node: GPUs with other UUIDs. Refused before restoring, and by the plugin.
    sim.swap_gpus(SimSpec {
        seed: "other-node",
        ..SimSpec::default()
    });
    let out = criu_gpu(&sim, &["check", exported.to_str().unwrap()]);
    assert_eq!(exit_code(&out), 1, "{}", stdout(&out));
    assert!(
        stdout(&out).contains("is not on this machine")
            && stdout(&out).contains("CRIU_GPU_DEVICE_MAP"),
        "{}",
        stdout(&out)
    );
    let out = ctd.ctr(&["containers", "restore", "--live", id, &reference]);
    assert!(!out.status.success(), "the plugin refuses it too");
    assert!(stderr(&out).contains("criu failed"), "{}", stderr(&out));
    let log = ctd.restore_log(id);
    assert!(
        log.contains("is not on this machine"),
        "{}",
        criu::tail(&log, 20)
    );
    assert_eq!(sim.gpus()[0].1, 0, "nothing was restored");
    ctd.remove(id);
    assert!(
        !stderr(&ctd.ctr(&["tasks", "list"])).contains("killed after"),
        "cleanup is bounded"
    );
}
