//! CRIU stopped in every way an operator or a runtime stops it, with the GPU at each stage of a
//! dump: a lock that gives up, a restore thread held by a debugger, CRIU SIGKILLed or sent
//! SIGTERM at the lock, the checkpoint and the pages, a failing post-dump script, busy processes
//! that must be locked together. Each ends with the application running with its data, or a
//! clear refusal with nothing locked, whatever stopped CRIU.

use std::path::Path;
use std::time::Duration;

use gpu_ckpt_tests::criu::{self, assert_ok, guardian_log, plugin_lines, signal_when, Criu};
use gpu_ckpt_tests::held::Tracer;
use gpu_ckpt_tests::scenario::{action_spans, Host, Work};
use gpu_ckpt_tests::stdout;
use nix::sys::signal::Signal;

#[test]
fn a_lock_timeout_fails_the_dump_and_the_process_keeps_running() {
    let mut host = Host::start();
    let c = Criu::new(&host);
    let app = host.app("busy", &Work::busy(16, 2000));
    let images = host.path("img");
    let env = [("CRIU_GPU_LOCK_TIMEOUT_MS", "300")];
    let out = c.dump(&host, app.pid, &images, &[], &env);
    assert!(!out.status.success(), "the dump was expected to fail");
    let log = criu::log(&images, "dump.log");
    assert!(
        log.contains("GPU work in process") && log.contains("did not finish within 300 ms"),
        "{}",
        criu::tail(&log, 20)
    );
    host.runs_with_its_data(&app);
}

#[test]
fn a_restore_thread_held_by_a_debugger_is_refused_with_nothing_locked() {
    let mut host = Host::start();
    let c = Criu::new(&host);
    let app = host.app("held", &Work::mib(16));
    let p = app.pid.to_string();
    let tid = stdout(&host.ctl(&["--get-restore-tid", "--pid", &p]));
    let tracer = Tracer::hold(app.pid, &["--only", tid.trim()]);
    let images = host.path("img");
    let out = c.dump(&host, app.pid, &images, &[], &[]);
    assert!(!out.status.success(), "the dump was expected to fail");
    let log = criu::log(&images, "dump.log");
    assert!(
        log.contains("nothing was locked"),
        "{}",
        criu::tail(&log, 20)
    );
    drop(tracer);
    host.runs_with_its_data(&app);
}

/// CRIU dumps `work`; `sig` reaches CRIU `delay` after `pattern` shows in its log. The guardian
/// puts the application back.
fn kill_dump_at(pattern: &str, delay: Duration, sig: Signal, work: fn(&Host) -> Work) {
    let mut host = Host::start();
    let c = Criu::new(&host);
    let app = host.app("app", &work(&host));
    let images = host.path("img");
    let mut criu = c.spawn_dump(&host, app.pid, &images, &[], &[]);
    assert!(
        signal_when(&mut criu, &images.join("dump.log"), pattern, delay, sig),
        "CRIU ended before {pattern:?}"
    );
    let rec = guardian_log(&images, "returned to its state before the dump");
    assert!(rec.contains("ended in the middle of a dump"), "{rec}");
    host.runs_with_its_data(&app);
}

#[test]
fn criu_killed_while_a_lock_waits_for_the_gpu_leaves_the_app_running() {
    // The lock lands after CRIU died (the driver finishes calls whose caller is gone): the
    // guardian waits for it, then unlocks.
    kill_dump_at(
        "criu_gpu' hook 10",
        Duration::from_millis(300),
        Signal::SIGKILL,
        |_| Work::busy(16, 1500),
    );
}

#[test]
fn criu_killed_during_the_gpu_checkpoint_leaves_the_app_running() {
    kill_dump_at(
        "criu_gpu' hook 11",
        Duration::ZERO,
        Signal::SIGKILL,
        |host| Work::mib(host.big_mib()),
    );
}

#[test]
fn criu_killed_while_dumping_pages_leaves_the_app_running() {
    kill_dump_at(
        "checkpointed 1 CUDA process",
        Duration::ZERO,
        Signal::SIGKILL,
        |host| Work::mib(host.big_mib()),
    );
}

#[test]
fn criu_terminated_by_a_runtime_leaves_the_app_running() {
    kill_dump_at(
        "checkpointed 1 CUDA process",
        Duration::ZERO,
        Signal::SIGTERM,
        |host| Work::mib(host.big_mib()),
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
    let mut host = Host::start();
    let c = Criu::new(&host);
    let app = host.app("app", &Work::mib(32));
    let images = host.path("img");
    let script = failing_script(host.dir(), "post-dump");
    let out = c.dump(&host, app.pid, &images, &["--action-script", &script], &[]);
    assert!(!out.status.success(), "CRIU reports the script's failure");
    // Stock CRIU tells plugins the dump succeeded and resumes the tasks: the guardian sees them
    // alive once CRIU is gone. The project's CRIU tells the plugin, which rolls back in `exit`.
    host.runs_with_its_data(&app);
}

#[test]
fn busy_processes_are_locked_together_within_criu_timeout() {
    // Two processes whose kernels take 2 s: one lock after the other needs up to 4 s, which
    // criu --timeout 4 does not leave after its own seizing; locked together they take 2 s.
    let mut host = Host::start();
    let c = Criu::new(&host);
    let tree = host.tree("busy", 2, &Work::busy(8, 2000));
    let images = host.path("img");
    let trace = host.path("trace");
    let trace_s = trace.display().to_string();
    // The simulated driver's trace shows whether the two locks were pending at the same time.
    let env = [("CUDA_SIM_TRACE", trace_s.as_str())];
    let out = c.dump(&host, tree.root, &images, &["--timeout", "4"], &env);
    assert_ok(&out, &images, "dump.log");
    let log = plugin_lines(&images, "dump.log").join("\n");
    assert!(log.contains("locked 2 CUDA process(es) at once"), "{log}");
    // CRIU's own words when its seize alarm fires (the plugin's warning quotes part of them).
    assert!(
        !criu::log(&images, "dump.log").contains("Timeout reached. Try to interrupt"),
        "the locks fit in CRIU's seize time"
    );
    if host.is_sim() {
        let locks = action_spans(&trace, "lock");
        assert_eq!(locks.len(), 2, "{locks:?}");
        assert!(
            locks.iter().map(|l| l.0).max() < locks.iter().map(|l| l.1).min(),
            "the two locks did not overlap: {locks:?}"
        );
    }
}
