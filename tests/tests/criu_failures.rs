//! Failure paths with the real CRIU and the simulated GPU: CRIU killed in a restore, damaged
//! images, settings, stopped trees. Each ends with the application running with its data (or the
//! images restoring on a retry). CRIU stopped at each stage of a dump, and the other failures a
//! real GPU must also show, are scenarios shared with the NVIDIA machine (tests/tests/scenarios).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_ckpt_tests::criu::{self, assert_ok, Criu};
use gpu_ckpt_tests::scenario::action_spans;
use gpu_ckpt_tests::*;
use nix::sys::signal::Signal;

/// The application is running again with every word of its device data.
fn runs_with_its_data(sim: &Sim, app: &App) {
    assert!(
        wait_until(Duration::from_secs(20), || sim.state(app.pid) == "running"),
        "state {}",
        sim.state(app.pid)
    );
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}

/// A simulated GPU, CRIU with the plugin, and an application holding `mib` MiB of device data,
/// dumped into the returned image directory (the application is gone).
fn dumped(mib: &str) -> (Sim, Criu, App, PathBuf) {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", mib]);
    let images = sim.dir.join("img");
    assert_ok(
        &c.dump(&sim, app.pid, &images, &[], &[]),
        &images,
        "dump.log",
    );
    wait_gone(app.pid);
    (sim, c, app, images)
}

/// A plain restore succeeds, and the application runs on with every word of its data.
fn restores_with_its_data(sim: &mut Sim, c: &Criu, app: &App, images: &Path) {
    assert_ok(&c.restore(sim, images, &[], &[]), images, "restore.log");
    sim.adopt(app.pid);
    runs_with_its_data(sim, app);
}

#[test]
fn criu_killed_mid_restore_leaves_no_half_restored_tree_and_the_images_restore() {
    let (mut sim, c, app, images) = dumped("32");
    // After the memory is restored, before the GPU state is: CRIU dies.
    let script = criu::killing_script(&sim.dir, "post-restore");
    let out = c.restore(&sim, &images, &["--action-script", &script], &[]);
    assert!(!out.status.success());
    let rec = criu::guardian_log(&images, "half-restored");
    assert!(rec.contains("restore again"), "{rec}");
    wait_gone(app.pid);
    restores_with_its_data(&mut sim, &c, &app, &images);
}

#[test]
fn damaged_or_truncated_pages_are_refused_with_the_file_name_and_a_good_copy_restores() {
    let (mut sim, c, app, images) = dumped("16");
    let pages = std::fs::read_dir(&images)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("pages-"))
        })
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let good = std::fs::read(&pages).unwrap();
    let name = pages.file_name().unwrap().to_string_lossy().into_owned();

    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x55;
    std::fs::write(&pages, &bad).unwrap();
    let out = c.restore(&sim, &images, &[], &[]);
    assert!(!out.status.success());
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains(&format!("{name} is damaged")),
        "{}",
        criu::tail(&log, 10)
    );
    assert!(!pid_alive(app.pid), "nothing was started");

    std::fs::write(&pages, &good[..good.len() / 3]).unwrap();
    let out = c.restore(&sim, &images, &[], &[]);
    assert!(!out.status.success());
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains(&format!("{name} is truncated")),
        "{}",
        criu::tail(&log, 10)
    );

    std::fs::write(&pages, &good).unwrap();
    restores_with_its_data(&mut sim, &c, &app, &images);
}

#[test]
fn a_leftover_record_in_a_reused_directory_does_not_break_a_later_dump() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let gpu = sim.app("gpu", &["--mib", "8"]);
    let images = sim.dir.join("img");
    assert_ok(
        &c.dump(&sim, gpu.pid, &images, &[], &[]),
        &images,
        "dump.log",
    );
    let record = images.join("gpu-cuda.json");
    let stale = std::fs::read(&record).unwrap();
    // The same directory, now for a process without CUDA: the old record goes.
    let plain = sim.app("plain", &["--plain"]);
    assert_ok(
        &c.dump(&sim, plain.pid, &images, &[], &[]),
        &images,
        "dump.log",
    );
    assert!(!record.exists(), "the earlier dump's record is removed");
    wait_gone(plain.pid);
    // Copied back by hand (or by a tool that merges directories): ignored, with a warning.
    std::fs::write(&record, stale).unwrap();
    assert_ok(&c.restore(&sim, &images, &[], &[]), &images, "restore.log");
    sim.adopt(plain.pid);
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("is not this image's"),
        "{}",
        criu::tail(&log, 20)
    );
    let n = plain.lines().len();
    assert!(wait_until(Duration::from_secs(5), || plain.lines().len() > n + 2));
}

#[test]
fn a_restore_without_a_gpu_is_refused_before_anything_starts() {
    let (mut sim, c, app, images) = dumped("8");
    // The driver library loads, but the GPUs are gone: NVML says the driver is not loaded.
    sim.stop_gpus();
    let out = c.restore(&sim, &images, &[], &[]);
    assert!(!out.status.success());
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("nothing was restored") && !log.contains("Forking"),
        "{}",
        criu::tail(&log, 20)
    );
    assert!(!pid_alive(app.pid));
}

/// Stock CRIU's lazy dump is post-copy (it ends the tasks however its transfer ends): refused.
/// The project's CRIU (patch 0014) keeps them until the receiver has every page: its lazy moves
/// are `tests/tests/criu_migrate.rs`.
#[test]
fn a_post_copy_lazy_dump_is_refused_and_nothing_is_locked() {
    let mut sim = Sim::start();
    let c = Criu {
        bin: criu::STOCK.into(),
        ..Criu::new(&sim)
    };
    let app = sim.app("app", &["--mib", "8"]);
    let images = sim.dir.join("img");
    let out = c.dump(&sim, app.pid, &images, &["--lazy-pages"], &[]);
    assert!(!out.status.success());
    let log = criu::log(&images, "dump.log");
    assert!(log.contains("--lazy-pages"), "{}", criu::tail(&log, 20));
    runs_with_its_data(&sim, &app);
}

#[test]
fn settings_are_checked_where_they_matter() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", "8"]);
    let images = sim.dir.join("img");
    // A bad dump setting: CRIU fails the dump at the plugin's `init`, before it seized anything,
    // with the key named; the app runs on.
    let bad = [("CRIU_GPU_DIGESTS", "maybe")];
    let out = c.dump(&sim, app.pid, &images, &["--leave-running"], &bad);
    assert!(!out.status.success(), "refused");
    let log = criu::log(&images, "dump.log");
    assert!(
        log.contains("CRIU_GPU_DIGESTS=\"maybe\"") && log.contains("Failed in init"),
        "{}",
        criu::tail(&log, 20)
    );
    runs_with_its_data(&sim, &app);
    // A bad restore-only setting and a typo: the dump goes on, the typo is named.
    let env = [
        ("CRIU_GPU_DEVICE_MAP", "GPU-nope"),
        ("CRIU_GPU_LOCK_TIMOUT_MS", "100"),
    ];
    let out = c.dump(&sim, app.pid, &images, &["--leave-running"], &env);
    assert_ok(&out, &images, "dump.log");
    let log = criu::log(&images, "dump.log");
    assert!(
        log.contains("unknown setting CRIU_GPU_LOCK_TIMOUT_MS"),
        "{}",
        criu::tail(&log, 20)
    );
    // The restore needs the map: refused with the key named, before anything starts.
    signal(app.pid, Signal::SIGKILL);
    wait_gone(app.pid);
    let out = c.restore(&sim, &images, &[], &env);
    assert!(!out.status.success());
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("CRIU_GPU_DEVICE_MAP=\"GPU-nope\""),
        "{}",
        criu::tail(&log, 20)
    );
}

#[test]
fn a_restore_that_leaves_the_tree_stopped_restores_the_gpu_state_first() {
    // `criu restore --leave-stopped` queues SIGSTOP for the tasks before the GPU state is back;
    // the driver's thread must not stop on it, or the restore waits for ever.
    let (mut sim, c, app, images) = dumped("16");
    let start = Instant::now();
    let out = c.restore(&sim, &images, &["--leave-stopped"], &[]);
    assert_ok(&out, &images, "restore.log");
    assert!(start.elapsed() < Duration::from_secs(20));
    sim.adopt(app.pid);
    assert!(
        wait_until(Duration::from_secs(5), || std::fs::read_to_string(format!(
            "/proc/{}/stat",
            app.pid
        ))
        .is_ok_and(|s| s
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('T')))),
        "the process is left stopped"
    );
    assert!(app.stalls_for(Duration::from_millis(500)));
    signal(app.pid, Signal::SIGCONT);
    runs_with_its_data(&sim, &app);
}

#[test]
fn a_dump_that_leaves_the_tree_stopped_puts_the_gpu_state_back() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", "16"]);
    let images = sim.dir.join("img");
    let out = c.dump(&sim, app.pid, &images, &["--leave-stopped"], &[]);
    assert_ok(&out, &images, "dump.log");
    let log = criu::log(&images, "dump.log");
    assert!(
        log.contains("returned to its state before the dump (running)"),
        "{}",
        criu::tail(&log, 20)
    );
    // (Its state cannot be asked while it is stopped: the driver's thread answers, F11.)
    signal(app.pid, Signal::SIGCONT);
    runs_with_its_data(&sim, &app);
}

#[test]
fn the_processes_of_a_tree_are_checkpointed_at_the_same_time() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let root = sim.app("tree", &["--children", "2", "--mib", "8"]);
    assert!(wait_until(Duration::from_secs(20), || {
        (0..2).all(|i| read_lines(&root.log.with_extension(format!("log.gpu{i}"))).len() > 1)
    }));
    for (parallel, overlap) in [("1", true), ("0", false)] {
        let images = sim.dir.join(format!("img-{parallel}"));
        let trace = sim.dir.join(format!("trace-{parallel}"));
        let trace_s = trace.display().to_string();
        let env = [
            ("CUDA_SIM_FAULT", "checkpoint=delay:600"),
            ("CUDA_SIM_TRACE", trace_s.as_str()),
            ("CRIU_GPU_PARALLEL", parallel),
        ];
        let out = c.dump(&sim, root.pid, &images, &["--leave-running"], &env);
        assert_ok(&out, &images, "dump.log");
        let spans = action_spans(&trace, "checkpoint");
        assert_eq!(spans.len(), 3, "{spans:?}");
        let latest_start = spans.iter().map(|s| s.0).max().unwrap();
        let earliest_end = spans.iter().map(|s| s.1).min().unwrap();
        assert_eq!(
            latest_start < earliest_end,
            overlap,
            "CRIU_GPU_PARALLEL={parallel}: {spans:?}"
        );
    }
    assert!(root.advances(2));
    root.assert_healthy();
}
