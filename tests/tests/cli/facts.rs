//! The measured driver facts (docs/driver-facts.md, F1-F10) as the CLI meets them on the
//! simulated driver: each test would pass against a kinder simulation only if it were wrong.

use std::time::Instant;

use super::*;

/// Runs `attempt` until it meets the busy GPU (a lock can land in the short gap between two
/// kernels; `undo` puts the process back then).
fn on_a_busy_gpu<T>(mut attempt: impl FnMut() -> Result<T, String>, undo: impl Fn()) -> T {
    let mut last = String::new();
    for _ in 0..5 {
        match attempt() {
            Ok(v) => return v,
            Err(e) => last = e,
        }
        undo();
    }
    panic!("the lock never met the busy GPU: {last}");
}

/// F1: a lock that gives up answers CUDA_ERROR_NOT_READY and leaves the process running; with
/// --pid in NVIDIA's words, in group and JSON modes with the timeout to raise.
#[test]
fn f1_a_lock_that_gives_up_answers_not_ready_and_the_process_runs_on() {
    let mut sim = Sim::start();
    // Every step submits a kernel that keeps the GPU busy for 1.5 s.
    let app = sim.app("busy", &["--busy-ms", "1500", "--interval-ms", "0"]);
    let p = pid_s(app.pid);
    let undo = || assert!(sim.ctl(&["--recover", "--pid", &p]).status.success());
    let out = on_a_busy_gpu(
        || {
            let out = sim.ctl(&["--action", "lock", "--pid", &p, "--timeout", "300"]);
            match exit_code(&out) {
                0 => Err("locked between two kernels".into()),
                _ => Ok(out),
            }
        },
        undo,
    );
    assert_eq!(exit_code(&out), 600 & 0xff, "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim(),
        format!("Error locking CUDA in process ID {p}: \"device not ready\"")
    );
    assert_eq!(sim.state(app.pid), "running");
    assert!(
        app.advances(1),
        "the app keeps running after a lock that gave up"
    );

    let err = on_a_busy_gpu(
        || {
            let v = sim.ctl_json(&["--suspend", "--tree", &p, "--timeout", "300"]);
            match v["processes"][0]["error"].as_str() {
                Some(e) => Ok(e.to_owned()),
                None => Err(v.to_string()),
            }
        },
        undo,
    );
    assert_eq!(
        err,
        format!(
            "GPU work in process {p} (cuda-sim-app) did not finish within 300 ms; raise --timeout"
        )
    );
    assert_eq!(sim.state(app.pid), "running");

    let start = Instant::now();
    let out = sim.ctl(&["--action", "lock", "--pid", &p, "--timeout", "10000"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        start.elapsed() >= Duration::from_millis(100),
        "the lock waited for the running kernel"
    );
    assert!(app.stalls_for(Duration::from_millis(1500)));
    assert!(sim
        .ctl(&["--action", "unlock", "--pid", &p])
        .status
        .success());
    assert!(app.advances(1));
    app.assert_healthy();
}

/// F2, F3, F4: a lock of a stopped process waits past its timeout, the state cannot be read
/// meanwhile, and when the caller dies first the request is dropped. The driver is called
/// directly: cuda-checkpoint-ctl refuses a stopped process before calling it (cli/held.rs).
#[test]
fn f2_f3_f4_a_stopped_processs_request_waits_and_dies_with_its_caller() {
    let mut sim = Sim::start();
    let app = sim.app("stopped", &[]);
    let p = pid_s(app.pid);
    signal(app.pid, Signal::SIGSTOP);
    assert!(wait_until(Duration::from_secs(5), || is_stopped(app.pid)));
    let mut lock = sim.driver_spawn(&["lock", &p, "100"]);
    // Posted, not taken: from here its 100 ms would run out if they counted before pickup.
    let posted = || cuda_sim::controller::pending(app.pid) == Ok(true);
    assert!(
        wait_until(Duration::from_secs(10), posted),
        "the lock was never posted"
    );
    let mut state = sim.driver_spawn(&["state", &p]);
    std::thread::sleep(Duration::from_millis(700));
    let lock_done = lock.try_wait().unwrap();
    assert!(
        lock_done.is_none(),
        "F2: still waiting 7x past its timeout: {lock_done:?}"
    );
    // (Queued behind the lock; F11 alone would hold it too on a stopped process.)
    let state_done = state.try_wait().unwrap();
    assert!(
        state_done.is_none(),
        "F4: no state while a lock is pending: {state_done:?}"
    );
    kill_child(lock);
    kill_child(state);
    assert!(posted(), "F3: the dead caller's lock is still posted");
    // The restore thread id is answered at once (F5).
    assert!(sim
        .ctl(&["--get-restore-tid", "--pid", &p])
        .status
        .success());
    signal(app.pid, Signal::SIGCONT);
    assert!(
        app.advances(2),
        "F3: the dead caller's lock was not carried out"
    );
    assert_eq!(sim.state(app.pid), "running");
    app.assert_healthy();
}

/// F3, F4, F5: an action the driver took completes though its caller died; the state is given
/// once it is done; the restore thread id at once.
#[test]
fn f3_f4_f5_a_taken_action_completes_after_its_caller_died() {
    let mut sim = Sim::start();
    let app = sim.app("orphan", &["--mib", "8"]);
    let p = pid_s(app.pid);
    assert!(sim.ctl(&["--action", "lock", "--pid", &p]).status.success());
    let slow = [("CUDA_SIM_FAULT", "checkpoint=delay:2500")];
    let start = Instant::now();
    let caller = sim.ctl_spawn(&["--action", "checkpoint", "--pid", &p], &slow);
    assert!(sim.wait_busy(app.pid));
    let tid_start = Instant::now();
    assert!(sim
        .ctl(&["--get-restore-tid", "--pid", &p])
        .status
        .success());
    assert!(
        tid_start.elapsed() < Duration::from_millis(500),
        "F5: at once"
    );
    kill_child(caller);
    assert_eq!(sim.state(app.pid), "checkpointed", "F3: it completed");
    assert!(
        start.elapsed() >= Duration::from_millis(2500),
        "F4: the state waited for the checkpoint to end"
    );
    assert_eq!(sim.gpus()[0].1, 0);
    assert!(sim.ctl(&["--resume", "--pid", &p]).status.success());
    assert!(app.advances(2));
    app.assert_healthy();
}

/// F6: a second action waits its turn and then meets the state the first left.
#[test]
fn f6_a_second_action_waits_its_turn() {
    let mut sim = Sim::start();
    let app = sim.app("queue", &[]);
    let p = pid_s(app.pid);
    assert!(sim.ctl(&["--action", "lock", "--pid", &p]).status.success());
    let slow = [("CUDA_SIM_FAULT", "checkpoint=delay:2000")];
    let first = sim.ctl_spawn(&["--action", "checkpoint", "--pid", &p], &slow);
    assert!(sim.wait_busy(app.pid));
    let start = Instant::now();
    let out = sim.ctl(&["--action", "unlock", "--pid", &p]);
    assert!(start.elapsed() >= Duration::from_millis(500), "it queued");
    assert_eq!(
        exit_code(&out),
        401 & 0xff,
        "unlock of a checkpointed process"
    );
    let first = finish_within(first, Duration::from_secs(10)).expect("checkpoint ends");
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(sim.state(app.pid), "checkpointed");
    assert!(sim.ctl(&["--resume", "--pid", &p]).status.success());
    assert!(app.advances(1));
}

/// F7: the target dies during a checkpoint: the call returns OPERATING_SYSTEM at once.
#[test]
fn f7_a_target_that_dies_ends_the_call_at_once() {
    let mut sim = Sim::start();
    let app = sim.app("dies", &[]);
    let p = pid_s(app.pid);
    assert!(sim.ctl(&["--action", "lock", "--pid", &p]).status.success());
    let slow = [("CUDA_SIM_FAULT", "checkpoint=delay:20000")];
    let caller = sim.ctl_spawn(&["--action", "checkpoint", "--pid", &p], &slow);
    assert!(sim.wait_busy(app.pid));
    signal(app.pid, Signal::SIGKILL);
    let out = finish_within(caller, Duration::from_secs(2)).expect("returns at once");
    assert_eq!(exit_code(&out), 304 & 0xff, "{}", stderr(&out));
    assert!(stderr(&out).contains("OS call failed"), "{}", stderr(&out));
}

/// F8 as the driver enforces it: a map that leaves out a GPU seen at checkpoint is refused
/// and the process is unharmed (without NVML the CLI passes the map as given).
#[test]
fn f8_the_driver_refuses_an_incomplete_map() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let app = sim.app("app", &["--mib", "8"]);
    let p = pid_s(app.pid);
    let gpus = sim.gpu_uuids();
    assert!(sim.ctl(&["--suspend", "--pid", &p]).status.success());
    let partial = format!("{}={}", gpus[0], gpus[1]);
    let out = sim.ctl(&[
        "--action",
        "restore",
        "--pid",
        &p,
        "-d",
        &partial,
        "--nvml",
        "/nonexistent/libnvml.so",
    ]);
    assert_eq!(
        exit_code(&out),
        1,
        "CUDA_ERROR_INVALID_VALUE: {}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("invalid argument"),
        "{}",
        stderr(&out)
    );
    assert_eq!(sim.state(app.pid), "checkpointed", "unharmed");
    assert!(sim.ctl(&["--resume", "--pid", &p]).status.success());
    assert!(app.advances(1));
}

/// F10 (reported upstream): a restore that ran out of GPU memory leaves the process
/// unrestorable; --recover says so and that it must be restarted.
#[test]
fn f10_a_restore_without_room_leaves_the_process_unrestorable() {
    let mut sim = Sim::with(SimSpec {
        memory: "64MiB",
        ..SimSpec::default()
    });
    let a = sim.app("a", &["--mib", "40"]);
    let p = pid_s(a.pid);
    assert!(sim.ctl(&["--suspend", "--pid", &p]).status.success());
    let b = sim.app("b", &["--mib", "40"]);
    let out = sim.ctl(&["--resume", "--pid", &p]);
    assert_eq!(
        exit_code(&out),
        2,
        "CUDA_ERROR_OUT_OF_MEMORY: {}",
        stderr(&out)
    );
    assert_eq!(sim.state(a.pid), "checkpointed");
    signal(b.pid, Signal::SIGKILL);
    assert!(wait_until(Duration::from_secs(5), || sim.gpus()[0].1 == 0));
    let out = sim.ctl(&["--resume", "--pid", &p]);
    assert_eq!(
        exit_code(&out),
        304 & 0xff,
        "even with room now: {}",
        stderr(&out)
    );
    let out = sim.ctl(&["--recover", "--pid", &p]);
    assert_eq!(exit_code(&out), 304 & 0xff, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("can no longer restore") && stderr(&out).contains("restart it"),
        "{}",
        stderr(&out)
    );
}

/// CUDA_SIM_TRACE shows that the checkpoints of a group ran at the same time.
#[test]
fn traces_show_a_group_checkpointed_at_once() {
    let mut sim = Sim::start();
    let root = sim.app("traced", &["--children", "2", "--mib", "4"]);
    let kids = gpu_children(&root, 2);
    let trace = sim.dir.join("trace.log");
    let env = [
        ("CUDA_SIM_FAULT", "checkpoint=delay:500"),
        ("CUDA_SIM_TRACE", trace.to_str().unwrap()),
    ];
    let out = sim.ctl_env(&["--suspend", "--tree", &pid_s(root.pid)], &env);
    assert!(out.status.success(), "{}", stdout(&out));
    let spans: Vec<(i32, u64, u64)> = read_lines(&trace)
        .iter()
        .filter(|l| l.contains(" op=checkpoint "))
        .map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix(k))
                    .unwrap_or_else(|| panic!("{k} in {l}"))
                    .to_owned()
            };
            assert_eq!(field("result="), "0", "{l}");
            (
                field("pid=").parse().unwrap(),
                field("start_ns=").parse().unwrap(),
                field("end_ns=").parse().unwrap(),
            )
        })
        .collect();
    let mut pids: Vec<i32> = spans.iter().map(|s| s.0).collect();
    pids.sort_unstable();
    let mut all = vec![root.pid];
    all.extend(&kids);
    all.sort_unstable();
    assert_eq!(pids, all, "one line per process: {spans:?}");
    let last_start = spans.iter().map(|s| s.1).max().unwrap();
    let first_end = spans.iter().map(|s| s.2).min().unwrap();
    assert!(last_start < first_end, "all three ran at once: {spans:?}");
    assert!(sim
        .ctl(&["--resume", "--tree", &pid_s(root.pid)])
        .status
        .success());
    assert!(root.advances(1));
}
