//! Rootful Podman (Debian's packages, runc) checkpointing a container whose process holds GPU
//! state on the simulated driver: `checkpoint --export`, `rm`, `restore --import`, the process
//! goes on with its data; and a restore on a node without the checkpoint's GPUs, refused by the
//! pre-restore check and by the plugin, then done with a GPU map.

use std::process::Command;
use std::time::Duration;

use gpu_ckpt_tests::podman::{self, container_log, podman, Image, Settings};
use gpu_ckpt_tests::*;

fn check(archive: &std::path::Path) -> (i32, String) {
    let out = Command::new(artifact("criu-gpu-check"))
        .arg(archive)
        .output()
        .unwrap();
    (exit_code(&out), stdout(&out) + &stderr(&out))
}

fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        stdout(out),
        stderr(out)
    );
}

#[test]
fn a_gpu_container_is_exported_removed_and_imported_with_its_device_data() {
    podman::require();
    let mut sim = Sim::start();
    let image = Image::build(&sim.dir);
    let logs = sim.dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let name = format!("criu-gpu-test-{}", std::process::id());
    let _cleanup = Cleanup(name.clone());
    let mut settings = Settings::for_sim(&sim);
    let conf = Settings::set(&settings);
    ok(
        &image.run(&sim, &name, &logs, &["--mib", "16", "--interval-ms", "50"]),
        "podman run",
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

    let archive = sim.dir.join("ckpt.tar.zst");
    ok(
        &podman(&[
            "container",
            "checkpoint",
            "--keep",
            "--export",
            archive.to_str().unwrap(),
            &name,
        ]),
        "podman container checkpoint --export",
    );
    let dump_log = container_log(&name, "dump.log");
    assert!(
        dump_log.contains("criu_gpu: checkpointed 1 CUDA process"),
        "{}",
        criu::tail(&dump_log, 20)
    );
    assert_eq!(
        sim.gpus()[0].1,
        0,
        "the container is gone, its GPU memory free"
    );
    let steps = app.steps();
    let (code, text) = check(&archive);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("OK: this node can restore it"), "{text}");

    ok(&podman(&["rm", &name]), "podman rm");
    ok(
        &podman(&[
            "container",
            "restore",
            "--keep",
            "--import",
            archive.to_str().unwrap(),
        ]),
        "podman container restore --import",
    );
    assert!(app.advances(5), "{}", app.tail());
    assert!(app.steps() > steps);
    app.assert_healthy();
    assert_eq!(sim.gpus()[0].1, 16 << 20, "device memory back on the GPU");
    let restore_log = container_log(&name, "restore.log");
    assert!(
        restore_log.contains("criu_gpu: restored CUDA state of 1 of 1"),
        "{}",
        criu::tail(&restore_log, 20)
    );

    // Another node: GPUs with other UUIDs.
    let archive2 = sim.dir.join("ckpt2.tar.zst");
    ok(
        &podman(&[
            "container",
            "checkpoint",
            "--export",
            archive2.to_str().unwrap(),
            &name,
        ]),
        "second checkpoint",
    );
    ok(&podman(&["rm", &name]), "podman rm");
    sim.swap_gpus(SimSpec {
        seed: "other-node",
        ..SimSpec::default()
    });
    let (code, text) = check(&archive2);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("is not on this machine") && text.contains("CRIU_GPU_DEVICE_MAP"),
        "{text}"
    );
    let out = podman(&[
        "container",
        "restore",
        "--import",
        archive2.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "the plugin refuses it too");
    let restore_log = container_log(&name, "restore.log");
    assert!(
        restore_log.contains("is not on this machine"),
        "{}",
        criu::tail(&restore_log, 20)
    );
    let _ = podman(&["rm", "-f", &name]);
    // The operator maps the GPUs.
    drop(conf);
    settings.push("CRIU_GPU_DEVICE_MAP=auto".into());
    let _conf = Settings::set(&settings);
    let (code, text) = check(&archive2);
    assert_eq!(code, 0, "{text}");
    let steps = app.steps();
    ok(
        &podman(&[
            "container",
            "restore",
            "--import",
            archive2.to_str().unwrap(),
        ]),
        "restore with CRIU_GPU_DEVICE_MAP=auto",
    );
    assert!(app.advances(5), "{}", app.tail());
    assert!(app.steps() > steps);
    app.assert_healthy();
}

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", &self.0]);
    }
}
