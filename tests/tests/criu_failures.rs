//! Failure paths with the real CRIU and the simulated GPU: CRIU killed at each stage of a dump
//! and of a restore, a failing post-dump script, damaged images, busy processes that must be
//! locked together. Each ends with the application running with its data (or the images
//! restoring on a retry), whatever killed CRIU.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use gpu_ckpt_tests::criu::{self, assert_ok, plugin_lines, Criu};
use gpu_ckpt_tests::*;
use nix::sys::signal::Signal;

/// Sends `sig` to `child` once `pattern` shows in `log` (after `delay`); false if CRIU ended first.
fn signal_when(child: &mut Child, log: &Path, pattern: &str, delay: Duration, sig: Signal) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if std::fs::read_to_string(log).is_ok_and(|l| l.contains(pattern)) {
            std::thread::sleep(delay);
            signal(child.id() as i32, sig);
            let _ = child.wait();
            return true;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("{pattern:?} never appeared in {}", log.display());
}

/// The guardian's record in the image directory, once it mentions `what`.
fn guardian_log(images: &Path, what: &str) -> String {
    let path = images.join("gpu-guardian.log");
    let found = wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(&path).is_ok_and(|l| l.contains(what))
    });
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(found, "the guardian did not log {what:?}: {text}");
    text
}

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

fn kill_dump_at(pattern: &str, delay: Duration, sig: Signal, app_args: &[&str]) {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", app_args);
    let images = sim.dir.join("img");
    let mut criu = c.spawn_dump(&sim, app.pid, &images, &[], &[]);
    assert!(
        signal_when(&mut criu, &images.join("dump.log"), pattern, delay, sig),
        "CRIU ended before {pattern:?}"
    );
    let rec = guardian_log(&images, "returned to its state before the dump");
    assert!(rec.contains("ended in the middle of a dump"), "{rec}");
    runs_with_its_data(&sim, &app);
}

#[test]
fn criu_killed_while_a_lock_waits_for_the_gpu_leaves_the_app_running() {
    // The lock lands after CRIU died (the driver finishes calls whose caller is gone): the
    // guardian waits for it, then unlocks.
    kill_dump_at(
        "criu_gpu' hook 10",
        Duration::from_millis(300),
        Signal::SIGKILL,
        &["--busy-ms", "1500", "--interval-ms", "0"],
    );
}

#[test]
fn criu_killed_during_the_gpu_checkpoint_leaves_the_app_running() {
    kill_dump_at(
        "criu_gpu' hook 11",
        Duration::ZERO,
        Signal::SIGKILL,
        &["--mib", "256"],
    );
}

#[test]
fn criu_killed_while_dumping_pages_leaves_the_app_running() {
    kill_dump_at(
        "checkpointed 1 CUDA process",
        Duration::ZERO,
        Signal::SIGKILL,
        &["--mib", "256"],
    );
}

#[test]
fn criu_terminated_by_a_runtime_leaves_the_app_running() {
    kill_dump_at(
        "checkpointed 1 CUDA process",
        Duration::ZERO,
        Signal::SIGTERM,
        &["--mib", "256"],
    );
}

/// An action script that exits 1 at `action` (CRIU then reports the dump failed).
fn failing_script(dir: &Path, action: &str) -> String {
    let path = dir.join("action.sh");
    std::fs::write(
        &path,
        format!("#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = '{action}' ] && exit 1\nexit 0\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

#[test]
fn a_failing_post_dump_script_leaves_nothing_checkpointed() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", "32"]);
    let images = sim.dir.join("img");
    let script = failing_script(&sim.dir, "post-dump");
    let out = c.dump(&sim, app.pid, &images, &["--action-script", &script], &[]);
    assert!(!out.status.success(), "CRIU reports the script's failure");
    // Stock CRIU tells plugins the dump succeeded and resumes the tasks: the guardian sees them
    // alive once CRIU is gone. The project's CRIU tells the plugin, which rolls back in `exit`.
    runs_with_its_data(&sim, &app);
}

#[test]
fn criu_killed_mid_restore_leaves_no_half_restored_tree_and_the_images_restore() {
    let (mut sim, c, app, images) = dumped("32");
    // After the memory is restored, before the GPU state is: CRIU dies.
    let script = criu::killing_script(&sim.dir, "post-restore");
    let out = c.restore(&sim, &images, &["--action-script", &script], &[]);
    assert!(!out.status.success());
    let rec = guardian_log(&images, "half-restored");
    assert!(rec.contains("restore again"), "{rec}");
    wait_gone(app.pid);
    restores_with_its_data(&mut sim, &c, &app, &images);
}

#[test]
fn busy_processes_are_locked_together_within_criu_timeout() {
    // Two processes whose kernels take 2 s: one lock after the other needs up to 4 s, which
    // criu --timeout 4 does not leave after its own seizing; locked together they take 2 s.
    // The simulated driver's trace shows whether the two locks were pending at the same time.
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let root = sim.app(
        "busy",
        &[
            "--children",
            "1",
            "--busy-ms",
            "2000",
            "--interval-ms",
            "0",
            "--mib",
            "8",
        ],
    );
    let images = sim.dir.join("img");
    let trace = sim.dir.join("trace");
    let trace_s = trace.display().to_string();
    let env = [("CUDA_SIM_TRACE", trace_s.as_str())];
    let out = c.dump(&sim, root.pid, &images, &["--timeout", "4"], &env);
    assert_ok(&out, &images, "dump.log");
    let log = plugin_lines(&images, "dump.log").join("\n");
    assert!(log.contains("locked 2 CUDA process(es) at once"), "{log}");
    let locks = action_spans(&trace, "lock");
    assert_eq!(locks.len(), 2, "{locks:?}");
    assert!(
        locks.iter().map(|l| l.0).max() < locks.iter().map(|l| l.1).min(),
        "the two locks did not overlap: {locks:?}"
    );
    // CRIU's own words when its seize alarm fires (the plugin's warning quotes part of them).
    assert!(
        !criu::log(&images, "dump.log").contains("Timeout reached. Try to interrupt"),
        "the locks fit in CRIU's seize time"
    );
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

/// (start, end) of each `op` action in the simulated driver's trace.
fn action_spans(trace: &Path, op: &str) -> Vec<(u64, u64)> {
    let field = |l: &str, k: &str| -> u64 {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    read_lines(trace)
        .iter()
        .filter(|l| l.contains(&format!("op={op} ")))
        .map(|l| (field(l, "start_ns="), field(l, "end_ns=")))
        .collect()
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
