//! Rootful Podman (Debian's packages, runc) checkpointing a container whose process holds GPU
//! state on the simulated driver: `checkpoint --export`, `rm`, `restore --import`, the process
//! goes on with its data; and a restore on a node without the checkpoint's GPUs, refused by the
//! pre-restore check and by the plugin, then done with a GPU map.

use std::process::Command;
use std::time::Duration;

use gpu_ckpt_tests::podman::{self, sim_settings, Image, Podman};
use gpu_ckpt_tests::*;

/// `criu-gpu-check ARCHIVE` with the test's plugin settings.
fn check(p: &Podman, archive: &std::path::Path) -> (i32, String) {
    let out = Command::new(artifact("criu-gpu-check"))
        .arg(archive)
        .env("CRIU_GPU_CONFIG", &p.conf)
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
    let _one = podman::serial();
    let mut sim = Sim::start();
    let p = Podman::new(&sim.dir);
    let image = Image::build(&p, &sim.dir);
    let logs = sim.dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let name = format!("criu-gpu-test-{}", std::process::id());
    let _cleanup = Cleanup(p.clone(), name.clone());
    let mut settings = sim_settings(&sim);
    p.settings(&settings);
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
        &p.run(&[
            "container",
            "checkpoint",
            "--keep",
            "--export",
            archive.to_str().unwrap(),
            &name,
        ]),
        "podman container checkpoint --export",
    );
    let dump_log = p.container_log(&name, "dump.log");
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
    let (code, text) = check(&p, &archive);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("OK: this node can restore it"), "{text}");

    ok(&p.run(&["rm", &name]), "podman rm");
    ok(
        &p.run(&[
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
    let restore_log = p.container_log(&name, "restore.log");
    assert!(
        restore_log.contains("criu_gpu: restored CUDA state of 1 of 1"),
        "{}",
        criu::tail(&restore_log, 20)
    );

    // Another node: GPUs with other UUIDs.
    let archive2 = sim.dir.join("ckpt2.tar.zst");
    ok(
        &p.run(&[
            "container",
            "checkpoint",
            "--export",
            archive2.to_str().unwrap(),
            &name,
        ]),
        "second checkpoint",
    );
    ok(&p.run(&["rm", &name]), "podman rm");
    sim.swap_gpus(SimSpec {
        seed: "other-node",
        ..SimSpec::default()
    });
    let (code, text) = check(&p, &archive2);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("is not on this machine") && text.contains("CRIU_GPU_DEVICE_MAP"),
        "{text}"
    );
    let out = p.run(&[
        "container",
        "restore",
        "--import",
        archive2.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "the plugin refuses it too");
    let restore_log = p.container_log(&name, "restore.log");
    assert!(
        restore_log.contains("is not on this machine"),
        "{}",
        criu::tail(&restore_log, 20)
    );
    let _ = p.run(&["rm", "-f", &name]);
    // The operator maps the GPUs.
    settings.push("CRIU_GPU_DEVICE_MAP=auto".into());
    p.settings(&settings);
    let (code, text) = check(&p, &archive2);
    assert_eq!(code, 0, "{text}");
    let steps = app.steps();
    ok(
        &p.run(&[
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

struct Cleanup(Podman, String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.0.run(&["rm", "-f", &self.1]);
    }
}

/// `podman ARGS`, killed after two minutes: a restore that never ends fails the test.
fn podman_bounded(p: &Podman, args: &[&str]) -> std::process::Output {
    gpu_ckpt_tests::containerd::run_bounded(p.command(args), Duration::from_secs(120))
}

/// A container's device nodes come back from its checkpoint (runc restores /dev, a tmpfs, from
/// CRIU's image, and Podman the spec saved in the archive), so a container given GPU 0 cannot
/// take its state to GPU 1: the plugin refuses, naming the missing /dev/nvidia1, and the restore
/// ends (it once hung runc and podman for ever: the tree was killed while CRIU still traced it),
/// the archive restorable as before. A container given every GPU's node is restored onto GPU 1
/// with CRIU_GPU_DEVICE_MAP. scripts/gpu/containers/run.sh does the same on real GPUs.
#[test]
fn a_container_goes_to_another_gpu_only_with_that_gpu_s_device_node() {
    podman::require();
    let _one = podman::serial();
    let sim = Sim::with(SimSpec {
        gpus: 2,
        device_nodes: true,
        ..SimSpec::default()
    });
    let p = Podman::new(&sim.dir);
    let image = Image::build(&p, &sim.dir);
    let cdi = podman::Cdi::write(2);
    let logs = sim.dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let name = format!("criu-gpu-test-other-{}", std::process::id());
    let _cleanup = Cleanup(p.clone(), name.clone());
    let uuids = sim.gpu_uuids();
    let mut settings = sim_settings(&sim);
    let map = format!("CRIU_GPU_DEVICE_MAP={}={}", uuids[0], uuids[1]);
    let app = App {
        pid: 0,
        log: logs.join("app.log"),
    };
    let archive = sim.dir.join("gpu0.tar");
    let archive = archive.to_str().unwrap();

    // Given GPU 0 only.
    p.settings(&settings);
    let dev0 = cdi.device("0");
    ok(
        &image.run_with(
            &sim,
            &name,
            &logs,
            &["--device", &dev0],
            &["--mib", "16", "--interval-ms", "50"],
        ),
        "podman run with the GPU by CDI",
    );
    assert!(
        wait_until(Duration::from_secs(20), || app.steps() > 2),
        "{}",
        app.tail()
    );
    ok(
        &podman_bounded(
            &p,
            &[
                "container",
                "checkpoint",
                "--compress",
                "none",
                "--export",
                archive,
                &name,
            ],
        ),
        "checkpoint",
    );
    ok(&p.run(&["rm", &name]), "podman rm");
    settings.push(map.clone());
    p.settings(&settings);
    let start = std::time::Instant::now();
    let out = podman_bounded(&p, &["container", "restore", "--keep", "--import", archive]);
    assert!(!out.status.success(), "restored without /dev/nvidia1");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "the refused restore took {:?}: {}",
        start.elapsed(),
        stderr(&out)
    );
    let log = p.container_log(&name, "restore.log");
    assert!(
        log.contains("its root file system has no /dev/nvidia1"),
        "{}",
        criu::tail(&log, 20)
    );
    assert_eq!(sim.gpus()[1].1, 0, "nothing is left on GPU 1");
    ok(&p.run(&["rm", "-f", "-t", "0", &name]), "podman rm -f");
    // The archive as it was: restored where it ran.
    settings.retain(|s| s != &map);
    p.settings(&settings);
    ok(
        &podman_bounded(&p, &["container", "restore", "--import", archive]),
        "restore on GPU 0",
    );
    assert!(app.advances(5), "{}", app.tail());
    app.assert_healthy();
    assert_eq!(sim.gpus()[0].1, 16 << 20);
    ok(&p.run(&["rm", "-f", "-t", "0", &name]), "podman rm -f");

    // Given every GPU's node: its state goes to GPU 1.
    let all = cdi.device("all");
    ok(
        &image.run_with(
            &sim,
            &name,
            &logs,
            &["--device", &all],
            &["--mib", "16", "--interval-ms", "50"],
        ),
        "podman run with every GPU",
    );
    assert!(app.advances(3), "{}", app.tail());
    ok(
        &podman_bounded(
            &p,
            &[
                "container",
                "checkpoint",
                "--compress",
                "none",
                "--export",
                archive,
                &name,
            ],
        ),
        "checkpoint",
    );
    ok(&p.run(&["rm", &name]), "podman rm");
    settings.push(map);
    p.settings(&settings);
    ok(
        &podman_bounded(&p, &["container", "restore", "--import", archive]),
        "restore onto GPU 1",
    );
    assert!(app.advances(5), "{}", app.tail());
    app.assert_healthy();
    let gpus = sim.gpus();
    assert_eq!(
        (gpus[0].1, gpus[1].1),
        (0, 16 << 20),
        "the state is on GPU 1"
    );
    // Hand the simulated GPU back before the Sim goes.
    let _ = p.run(&["rm", "-f", "-t", "0", &name]);
}

/// `criu-gpu ARGS` (the snapshot store's commands) with the test's plugin settings.
fn store_cmd(p: &Podman, args: &[&str]) -> std::process::Output {
    let out = Command::new(artifact("criu-gpu"))
        .args(args)
        .env("CRIU_GPU_CONFIG", &p.conf)
        .output()
        .unwrap();
    eprintln!("criu-gpu {args:?}: {}{}", stdout(&out), stderr(&out));
    out
}

/// Container checkpoints kept in a snapshot store: two checkpoints of a running GPU container
/// stored by content (the second mostly found in the store already), then the store's export
/// of the second restored by `podman container restore --import`, going on with its data.
#[test]
fn a_gpu_container_is_restored_from_a_snapshot_store() {
    podman::require();
    let _one = podman::serial();
    let sim = Sim::start();
    let p = Podman::new(&sim.dir);
    let image = Image::build(&p, &sim.dir);
    let logs = sim.dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let name = format!("criu-gpu-store-{}", std::process::id());
    let _cleanup = Cleanup(p.clone(), name.clone());
    p.settings(&sim_settings(&sim));
    ok(
        &image.run(
            &sim,
            &name,
            &logs,
            &["--mib", "32", "--interval-ms", "5000"],
        ),
        "podman run",
    );
    let app = App {
        pid: 0,
        log: logs.join("app.log"),
    };
    // A step rewrites 256 KiB of the 32 MiB (and its two copies in host memory): between two
    // checkpoints little changes.
    assert!(
        wait_until(Duration::from_secs(20), || app.steps() >= 1),
        "{}",
        app.tail()
    );
    let store = sim.dir.join("store");
    let s = store.to_str().unwrap();
    let mut new = Vec::new();
    for snap in ["one", "two"] {
        let archive = sim.dir.join(format!("{snap}.tar.zst"));
        let a = archive.to_str().unwrap();
        ok(
            &p.run(&[
                "container",
                "checkpoint",
                "--leave-running",
                "--export",
                a,
                &name,
            ]),
            "podman container checkpoint --leave-running --export",
        );
        let out = store_cmd(&p, &["store", "put", s, snap, a, "--json"]);
        ok(&out, "criu-gpu store put");
        let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        new.push((
            w["new_bytes"].as_u64().unwrap(),
            w["bytes"].as_u64().unwrap(),
        ));
    }
    assert!(new[0].0 > 32 << 20, "(new, all) bytes: {new:?}");
    // Mostly in the store: at least three quarters of the second archive's bytes were stored
    // with the first (measured against the first's new bytes, as before, the margin was thin:
    // 11.9 MB of 101 MB new failed against the first's 45 MB).
    assert!(
        new[1].0 * 4 < new[1].1,
        "the second checkpoint is mostly in the store: (new, all) bytes {new:?}"
    );
    ok(&p.run(&["rm", "-f", &name]), "podman rm");
    let exported = sim.dir.join("two.tar");
    let e = exported.to_str().unwrap();
    ok(
        &store_cmd(&p, &["store", "export", s, "two", "--output", e]),
        "criu-gpu store export",
    );
    let (code, text) = check(&p, &exported);
    assert_eq!(code, 0, "{text}");
    let steps = app.steps();
    ok(
        &p.run(&["container", "restore", "--import", e]),
        "podman container restore --import (from the store)",
    );
    assert!(app.advances(2), "{}", app.tail());
    assert!(app.steps() > steps);
    app.assert_healthy();
}
