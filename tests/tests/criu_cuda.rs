//! The CRIU plugin with the real CRIU and the simulated CUDA driver: dumps and restores of GPU
//! process trees, and every failure on the way leaving the application alive with its data.

use std::time::Duration;

use gpu_ckpt_tests::criu::{self, assert_ok, plugin_lines, Criu};
use gpu_ckpt_tests::*;
use nix::sys::signal::Signal;

/// Dumps `app` (killing it), waits for its pids to be free, restores it.
fn dump_kill_restore(sim: &mut Sim, c: &Criu, app: &App, images: &std::path::Path) {
    let tree = process_facts::process::tree(app.pid);
    let out = c.dump(sim, app.pid, images, &[], &[]);
    assert_ok(&out, images, "dump.log");
    for pid in &tree {
        wait_gone(*pid);
    }
    let out = c.restore(sim, images, &[], &[]);
    assert_ok(&out, images, "restore.log");
    sim.adopt(app.pid);
    // The plugin's phase times as data: what the benchmarks read.
    use criu_gpu_image::timings::{read, Command};
    let dump = read(images, Command::Dump).unwrap().expect("dump timings");
    let restore = read(images, Command::Restore)
        .unwrap()
        .expect("restore timings");
    let checkpointed = dump.phase("checkpoint").map_or(0, |p| p.processes);
    assert!(
        checkpointed >= 1 && dump.phase("lock").is_some(),
        "{dump:?}"
    );
    let restored = restore.phase("restore").map(|p| p.processes);
    assert_eq!(restored, Some(checkpointed), "{restore:?}");
}

/// Restores `images` and checks the application runs on with its data.
fn restore_and_check(
    sim: &mut Sim,
    c: &Criu,
    app: &App,
    images: &std::path::Path,
    env: &[(&str, &str)],
) {
    assert_ok(&c.restore(sim, images, &[], env), images, "restore.log");
    sim.adopt(app.pid);
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}

/// Dumps `pid`, expects CRIU to fail, and returns the dump log.
fn failed_dump(
    sim: &Sim,
    c: &Criu,
    pid: i32,
    images: &std::path::Path,
    env: &[(&str, &str)],
) -> String {
    let out = c.dump(sim, pid, images, &[], env);
    assert!(!out.status.success(), "the dump was expected to fail");
    criu::log(images, "dump.log")
}

#[test]
fn without_the_plugin_criu_cannot_dump_a_gpu_process() {
    let mut sim = Sim::start();
    let app = sim.app("app", &[]);
    let images = sim.dir.join("img");
    let empty = sim.dir.join("no-plugins");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&empty).unwrap();
    let out = std::process::Command::new(criu::criu_binary())
        .args([
            "dump",
            "-t",
            &app.pid.to_string(),
            "-D",
            images.to_str().unwrap(),
        ])
        .args(["-v4", "-o", "dump.log", "--lib", empty.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        criu::log(&images, "dump.log").contains("External socket is used"),
        "the simulated device holds the memory outside the process, out of CRIU's reach"
    );
    assert!(
        app.advances(2),
        "a failed dump leaves the application running"
    );
}

#[test]
fn one_process_is_dumped_and_restored_with_its_device_memory() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", "32"]);
    let images = sim.dir.join("img");
    let before = app.steps();
    dump_kill_restore(&mut sim, &c, &app, &images);
    assert!(images.join("gpu-cuda.json").exists());
    let dump_log = plugin_lines(&images, "dump.log").join("\n");
    assert!(
        dump_log.contains("checkpointed 1 CUDA process(es)"),
        "{dump_log}"
    );
    assert!(app.advances(5), "restored app runs: {}", app.tail());
    app.assert_healthy();
    assert!(app.steps() > before);
    assert_eq!(sim.state(app.pid), "running");
    assert_eq!(
        sim.gpus()[0].1,
        32 << 20,
        "device memory is back on the GPU"
    );
    // Logged at CRIU's verbosity with the plugin's prefix.
    let restore_log = plugin_lines(&images, "restore.log").join("\n");
    assert!(
        restore_log.contains("restored CUDA state of 1 of 1"),
        "{restore_log}"
    );
    // The driver's staging (its checkpoint of the 32 MiB) arrived while the driver restored.
    assert!(
        restore_log.contains("the GPU restore overlaps CRIU's pages: 0.03 GiB"),
        "{restore_log}"
    );
    let criu_log = criu::log(&images, "restore.log");
    assert!(
        criu_log.contains("deferred-pages: 0.03 GiB of 1 task(s) in place"),
        "{criu_log}"
    );
}

#[test]
fn a_tree_of_gpu_and_plain_processes_is_checkpointed_and_restored_together() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let c = Criu::new(&sim);
    let root = sim.app(
        "tree",
        &["--children", "2", "--plain-children", "2", "--mib", "8"],
    );
    let logs: Vec<App> = ["gpu0", "gpu1", "plain0", "plain1"]
        .iter()
        .map(|s| App {
            pid: 0,
            log: root.log.with_extension(format!("log.{s}")),
        })
        .collect();
    assert!(wait_until(Duration::from_secs(20), || logs
        .iter()
        .all(|a| a.lines().len() > 1)));
    let images = sim.dir.join("img");
    dump_kill_restore(&mut sim, &c, &root, &images);
    let dump_log = plugin_lines(&images, "dump.log").join("\n");
    assert!(
        dump_log.contains("checkpointed 3 CUDA process(es)"),
        "{dump_log}"
    );
    let restore_log = plugin_lines(&images, "restore.log").join("\n");
    assert!(
        restore_log.contains("restored CUDA state of 3 of 3"),
        "{restore_log}"
    );
    assert!(root.advances(3));
    root.assert_healthy();
    for l in &logs {
        let n = l.lines().len();
        assert!(
            wait_until(Duration::from_secs(10), || l.lines().len() > n + 2),
            "{}",
            l.log.display()
        );
        l.assert_healthy();
    }
}

#[test]
fn restore_on_another_machine_needs_a_map_and_then_works() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", "16"]);
    let images = sim.dir.join("img");
    let out = c.dump(&sim, app.pid, &images, &[], &[]);
    assert_ok(&out, &images, "dump.log");
    wait_gone(app.pid);
    // Another machine: GPUs with other UUIDs.
    sim.swap_gpus(SimSpec {
        gpus: 2,
        seed: "machine-b",
        ..SimSpec::default()
    });
    let out = c.restore(&sim, &images, &[], &[]);
    assert!(
        !out.status.success(),
        "restore must refuse GPUs that are not here"
    );
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("is not on this machine") && log.contains("CRIU_GPU_DEVICE_MAP"),
        "{}",
        criu::tail(&log, 20)
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{}", app.pid)).exists(),
        "nothing was started"
    );
    // The operator asks for the mapping.
    restore_and_check(
        &mut sim,
        &c,
        &app,
        &images,
        &[("CRIU_GPU_DEVICE_MAP", "auto")],
    );
    let used: Vec<u64> = sim.gpus().iter().map(|g| g.1).collect();
    assert_eq!(used.iter().sum::<u64>(), 16 << 20);
}

/// F21: a process that sees only the machine's GPU 1 (`CUDA_VISIBLE_DEVICES=1`) keeps its
/// memory there through a dump and a restore, and through a restore that swaps the GPUs.
#[test]
fn a_process_shown_gpu_1_only_is_dumped_and_restored_on_gpu_1() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let c = Criu::new(&sim);
    let mut env = sim.env();
    env.push(("CUDA_VISIBLE_DEVICES".into(), "1".into()));
    let app = start_app(
        "cuda-sim-app",
        &sim.dir.join("app.log"),
        &["--mib", "16"],
        env,
    );
    sim.adopt(app.pid);
    assert!(app.lines()[0].contains(" device=0 "), "{}", app.lines()[0]);
    let used = |sim: &Sim| sim.gpus().iter().map(|g| g.1).collect::<Vec<_>>();
    assert_eq!(used(&sim), [0, 16 << 20]);
    let gpus: Vec<String> = sim.gpus().into_iter().map(|g| g.0).collect();

    let images = sim.dir.join("img");
    dump_kill_restore(&mut sim, &c, &app, &images);
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
    assert_eq!(used(&sim), [0, 16 << 20], "back on GPU 1");

    let images = sim.dir.join("img-swapped");
    assert_ok(
        &c.dump(&sim, app.pid, &images, &[], &[]),
        &images,
        "dump.log",
    );
    wait_gone(app.pid);
    let swap = format!("{}={}", gpus[1], gpus[0]);
    restore_and_check(
        &mut sim,
        &c,
        &app,
        &images,
        &[("CRIU_GPU_DEVICE_MAP", &swap)],
    );
    assert_eq!(used(&sim), [16 << 20, 0], "moved to GPU 0 by the map");
}

/// F21: under `CUDA_VISIBLE_DEVICES=1` device ordinal 1 is CUDA_ERROR_INVALID_DEVICE (101).
#[test]
fn ordinal_1_is_refused_where_only_gpu_1_is_visible() {
    let sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let log = sim.dir.join("app.log");
    let status = std::process::Command::new(artifact("cuda-sim-app"))
        .args([
            "--log",
            log.to_str().unwrap(),
            "--device",
            "1",
            "--steps",
            "3",
        ])
        .envs(sim.env())
        .env("CUDA_VISIBLE_DEVICES", "1")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2));
    let lines = read_lines(&log);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ERROR") && l.contains("CUDA_ERROR_INVALID_DEVICE (101)")),
        "{lines:?}"
    );
    assert_eq!(sim.gpus().iter().map(|g| g.1).sum::<u64>(), 0);
}

#[test]
fn a_checkpoint_error_fails_the_dump_and_the_process_keeps_its_data() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let (root, kid) = app_with_gpu_child(&mut sim, "app", 8);
    let images = sim.dir.join("img");
    let fault = [("CUDA_SIM_FAULT", "checkpoint=OUT_OF_MEMORY")];
    let log = failed_dump(&sim, &c, root.pid, &images, &fault);
    assert!(
        log.contains("checkpoint of CUDA state failed"),
        "{}",
        criu::tail(&log, 20)
    );
    assert_eq!(sim.state(root.pid), "running");
    assert!(root.advances(3) && kid.advances(3));
    root.assert_healthy();
    kid.assert_healthy();
}

/// The driver's failed checkpoint after it changed the state (what the real driver does after a
/// failed checkpoint was never measured, docs/driver-facts.md): the rollback reads the state and
/// restores and unlocks the one that was checkpointed, with its data.
#[test]
fn a_checkpoint_that_fails_after_checkpointing_is_rolled_back_with_the_data() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let (root, kid) = app_with_gpu_child(&mut sim, "app", 8);
    let images = sim.dir.join("img");
    let kid_pid = first_child(root.pid);
    let fault = format!("checkpoint/{kid_pid}=OUT_OF_MEMORY@after");
    let log = failed_dump(&sim, &c, root.pid, &images, &[("CUDA_SIM_FAULT", &fault)]);
    let back =
        format!("process {kid_pid} (cuda-sim-app) returned to its state before the dump (running)");
    assert!(
        log.contains("checkpoint of CUDA state failed") && log.contains(&back),
        "{}",
        criu::tail(&log, 20)
    );
    assert_eq!(
        (sim.state(root.pid), sim.state(kid_pid)),
        ("running".into(), "running".into())
    );
    assert!(root.advances(3) && kid.advances(3));
    root.assert_healthy();
    kid.assert_healthy();
}

/// A checkpoint that loses the GPU state (the driver's `failed` state; the simulation then
/// discards the device data and blocks the process's CUDA calls, never kinder than a driver that
/// gives up): the dump fails, the others are rolled back, and the lost one is named with what
/// to do, without a wait that never ends.
#[test]
fn a_checkpoint_that_loses_the_gpu_state_fails_the_dump_naming_the_process() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let (root, _kid) = app_with_gpu_child(&mut sim, "app", 8);
    let images = sim.dir.join("img");
    let kid_pid = first_child(root.pid);
    let fault = format!("checkpoint/{kid_pid}=failed");
    let start = std::time::Instant::now();
    let log = failed_dump(&sim, &c, root.pid, &images, &[("CUDA_SIM_FAULT", &fault)]);
    assert!(start.elapsed() < Duration::from_secs(60), "bounded");
    let lost = format!(
        "the GPU state of process {kid_pid} (cuda-sim-app) is lost: the driver reports it \
         failed, and nothing can return it to its state before the dump; restart it"
    );
    assert!(log.contains(&lost), "{}", criu::tail(&log, 20));
    assert_eq!(sim.state(root.pid), "running");
    assert_eq!(sim.state(kid_pid), "failed");
    assert!(root.advances(3));
    root.assert_healthy();
}

/// The test application with one GPU child of `mib` MiB, once the child has stepped; the child's
/// `App` reads its log only (pid 0).
fn app_with_gpu_child(sim: &mut Sim, name: &str, mib: u32) -> (App, App) {
    let root = sim.app(name, &["--children", "1", "--mib", &mib.to_string()]);
    let kid = App {
        pid: 0,
        log: root.log.with_extension("log.gpu0"),
    };
    assert!(wait_until(Duration::from_secs(20), || kid.steps() > 0));
    (root, kid)
}

/// The first child of `pid` (the test application's GPU child).
fn first_child(pid: i32) -> i32 {
    let path = format!("/proc/{pid}/task/{pid}/children");
    let mut kids = String::new();
    assert!(wait_until(Duration::from_secs(10), || {
        kids = std::fs::read_to_string(&path).unwrap_or_default();
        !kids.trim().is_empty()
    }));
    kids.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn a_failed_gpu_restore_fails_criu_and_the_images_restore_on_retry() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", "16"]);
    let images = sim.dir.join("img");
    let out = c.dump(&sim, app.pid, &images, &[], &[]);
    assert_ok(&out, &images, "dump.log");
    wait_gone(app.pid);
    let out = c.restore(
        &sim,
        &images,
        &[],
        &[("CUDA_SIM_FAULT", "restore=OUT_OF_MEMORY")],
    );
    assert!(
        !out.status.success(),
        "CRIU must report the failed GPU restore"
    );
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("restoring CUDA state of process")
            && log.contains("killing the restored process tree"),
        "{}",
        criu::tail(&log, 30)
    );
    wait_gone(app.pid);
    restore_and_check(&mut sim, &c, &app, &images, &[]);
}

#[test]
fn not_enough_gpu_memory_is_refused_before_restoring_and_a_retry_works() {
    let mut sim = Sim::with(SimSpec {
        memory: "64MiB",
        ..SimSpec::default()
    });
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", "40"]);
    let images = sim.dir.join("img");
    assert_ok(
        &c.dump(&sim, app.pid, &images, &[], &[]),
        &images,
        "dump.log",
    );
    wait_gone(app.pid);
    let hog = sim.app("hog", &["--mib", "40"]);
    let out = c.restore(&sim, &images, &[], &[]);
    assert!(!out.status.success());
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("free but the restored processes need"),
        "{}",
        criu::tail(&log, 20)
    );
    signal(hog.pid, Signal::SIGKILL);
    assert!(wait_until(Duration::from_secs(5), || sim.gpus()[0].1 == 0));
    restore_and_check(&mut sim, &c, &app, &images, &[]);
}

#[test]
fn a_missing_or_corrupt_plugin_image_is_refused_and_the_fixed_image_restores() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", "8"]);
    let images = sim.dir.join("img");
    assert_ok(
        &c.dump(&sim, app.pid, &images, &[], &[]),
        &images,
        "dump.log",
    );
    wait_gone(app.pid);
    let record = images.join("gpu-cuda.json");
    let good = std::fs::read(&record).unwrap();

    std::fs::remove_file(&record).unwrap();
    let out = c.restore(&sim, &images, &[], &[]);
    assert!(!out.status.success());
    assert!(criu::log(&images, "restore.log").contains("gpu-cuda.json is missing"));

    let mut bad = good.clone();
    let n = bad.len();
    bad.truncate(n / 2);
    std::fs::write(&record, &bad).unwrap();
    let out = c.restore(&sim, &images, &[], &[]);
    assert!(!out.status.success());
    assert!(criu::log(&images, "restore.log").contains("is unusable"));
    assert!(!std::path::Path::new(&format!("/proc/{}", app.pid)).exists());

    std::fs::write(&record, &good).unwrap();
    restore_and_check(&mut sim, &c, &app, &images, &[]);
}

#[test]
fn pre_dump_is_refused_clearly_and_nothing_is_locked() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &[]);
    let images = sim.dir.join("pre");
    let out = c.pre_dump(&sim, app.pid, &images);
    assert!(!out.status.success());
    let log = criu::log(&images, "pre-dump.log");
    assert!(
        log.contains("pre-dump is not supported for CUDA process"),
        "{}",
        criu::tail(&log, 20)
    );
    assert_eq!(sim.state(app.pid), "running");
    assert!(app.advances(2));
}

#[test]
fn a_stopped_gpu_process_is_refused_without_hanging() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &[]);
    signal(app.pid, Signal::SIGSTOP);
    let images = sim.dir.join("img");
    let log = failed_dump(&sim, &c, app.pid, &images, &[]);
    assert!(log.contains(&format!("kill -CONT {}", app.pid)));
    signal(app.pid, Signal::SIGCONT);
    assert_eq!(sim.state(app.pid), "running");
    assert!(app.advances(2));
}

#[test]
fn processes_without_cuda_dump_and_restore_as_if_the_plugin_were_absent() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    // A tree without CUDA, dumped with the plugin loaded on a machine without NVIDIA's driver.
    let root = sim.app("plain", &["--plain", "--plain-children", "1"]);
    let images = sim.dir.join("img");
    let env = [("CUDA_CKPT_LIBCUDA", "/nonexistent/libcuda.so.1")];
    let tree = process_facts::process::tree(root.pid);
    assert_eq!(tree.len(), 2);
    let out = c.dump(&sim, root.pid, &images, &[], &env);
    assert_ok(&out, &images, "dump.log");
    assert!(!images.join("gpu-cuda.json").exists());
    tree.iter().for_each(|p| wait_gone(*p));
    let out = c.restore(&sim, &images, &[], &env);
    assert_ok(&out, &images, "restore.log");
    sim.adopt(root.pid);
    let n = root.lines().len();
    assert!(wait_until(Duration::from_secs(5), || root.lines().len() > n + 2));
    for log in ["dump.log", "restore.log"] {
        let lines = plugin_lines(&images, log);
        assert!(
            lines
                .iter()
                .all(|l| !l.contains("Error") && !l.contains("Warn")),
            "{lines:?}"
        );
    }
}

/// A dump of NCCL ranks of one node whose transports the driver cannot restore (F13) is refused
/// before anything is locked, and every rank runs on; sockets-only ranks dump and restore.
#[test]
fn nccl_ranks_that_could_not_be_restored_are_refused_and_sockets_only_ranks_restore() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let root = nccl_app(&mut sim, "ranks", &["--children", "1", "--mib", "8"], &[]);
    let kid_log = App {
        pid: 0,
        log: root.log.with_extension("log.gpu0"),
    };
    assert!(wait_until(Duration::from_secs(20), || kid_log
        .lines()
        .len()
        > 1));
    let images = sim.dir.join("img-refused");
    let log = failed_dump(&sim, &c, root.pid, &images, &[]);
    assert!(
        log.contains("P2P, SHM and cuMem")
            && log.contains("NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0")
            && log.contains("nothing was locked"),
        "{}",
        criu::tail(&log, 20)
    );
    assert!(!log.contains("locked 2 CUDA"), "{}", criu::tail(&log, 20));
    assert!(root.advances(3), "{}", root.tail());
    root.assert_healthy();
    kid_log.assert_healthy();

    let ok = nccl_app(
        &mut sim,
        "sockets",
        &["--children", "1", "--mib", "8"],
        &NCCL_SOCKETS_ONLY,
    );
    let images = sim.dir.join("img");
    dump_kill_restore(&mut sim, &c, &ok, &images);
    assert!(ok.advances(3), "{}", ok.tail());
    ok.assert_healthy();
}

/// A process of a CUDA tree holding an io_uring, dumped by stock CRIU (which fails on any ring
/// after the GPU checkpoint): the plugin refuses the dump before anything is locked, naming the
/// process; the application runs on. (The project's CRIU dumps idle rings: criu_uring.rs.)
#[test]
fn an_io_uring_in_a_cuda_tree_is_refused_before_any_lock_on_stock_criu() {
    let mut sim = Sim::start();
    let c = Criu {
        bin: std::path::PathBuf::from(gpu_ckpt_tests::criu::STOCK),
        ..Criu::new(&sim)
    };
    let launcher = uring_launcher(&sim.dir);
    let log = sim.dir.join("uring.log");
    let child = setsid_command(&launcher)
        .arg(artifact("cuda-sim-app"))
        .args(["--log", log.to_str().unwrap(), "--mib", "8"])
        .envs(sim.env())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let app = App {
        pid: reap_in_background(child),
        log,
    };
    assert!(
        wait_until(Duration::from_secs(20), || app.steps() >= 1),
        "{}",
        app.tail()
    );
    sim.adopt(app.pid);
    let holder = process_facts::process::children(app.pid);
    assert_eq!(holder.len(), 1, "{holder:?}");
    assert!(wait_until(Duration::from_secs(5), || {
        process_facts::process::io_uring(holder[0]).is_ok_and(|u| u.is_some())
    }));
    let images = sim.dir.join("img");
    let dump_log = failed_dump(&sim, &c, app.pid, &images, &[]);
    assert!(
        dump_log.contains(&format!(
            "process {} (uring-launcher) holds io_uring",
            holder[0]
        )) && dump_log.contains("nothing was locked"),
        "{}",
        criu::tail(&dump_log, 20)
    );
    assert!(!dump_log.contains("locked 1 CUDA"));
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}

/// The plugin on stock CRIU 4.2.1, as scripts/install.sh installs it beside the project's CRIU:
/// a tree of CUDA processes dumped and restored with their data, without the project's patches
/// (no page I/O threads, no deferred pages, io_uring refused).
#[test]
fn the_plugin_dumps_and_restores_with_stock_criu() {
    let mut sim = Sim::start();
    let c = Criu {
        bin: std::path::PathBuf::from(gpu_ckpt_tests::criu::STOCK),
        ..Criu::new(&sim)
    };
    let out = std::process::Command::new(&c.bin)
        .arg("--version")
        .output()
        .unwrap();
    assert!(stdout(&out).contains("Version: 4.2.1"), "{}", stdout(&out));
    let (app, kid) = app_with_gpu_child(&mut sim, "stock", 32);
    let images = sim.dir.join("img");
    dump_kill_restore(&mut sim, &c, &app, &images);
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("restored CUDA state of 2 of 2"),
        "{}",
        criu::tail(&log, 20)
    );
    assert!(
        log.contains("this CRIU puts every page in place before the GPU restore"),
        "stock CRIU has no deferred pages: {}",
        criu::tail(&log, 20)
    );
    assert!(app.advances(3), "{}", app.tail());
    assert!(kid.advances(3), "{}", kid.tail());
    app.assert_healthy();
    kid.assert_healthy();
}
