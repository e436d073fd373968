//! cuda-checkpoint-ctl against the simulated driver: the cuda-checkpoint command line, the
//! driver's state machine and errors, group operations, rollback, device maps.

use std::time::{Duration, Instant};

use gpu_ckpt_tests::*;
use nix::sys::signal::Signal;

fn pid_s(pid: i32) -> String {
    pid.to_string()
}

#[test]
fn toggle_moves_device_memory_out_and_back_and_the_data_survives() {
    let mut sim = Sim::start();
    let app = sim.app("app", &["--mib", "16", "--interval-ms", "20"]);
    let p = pid_s(app.pid);
    assert_eq!(sim.state(app.pid), "running");
    assert_eq!(
        sim.gpus()[0].1,
        16 << 20,
        "the device holds the app's memory"
    );

    let out = sim.ctl(&["--toggle", "--pid", &p]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).is_empty(),
        "cuda-checkpoint prints nothing on success"
    );
    assert_eq!(sim.state(app.pid), "checkpointed");
    assert_eq!(
        sim.gpus()[0].1,
        0,
        "a checkpointed process holds no device memory"
    );
    assert!(
        app.stalls_for(Duration::from_millis(300)),
        "CUDA calls block while checkpointed"
    );

    let out = sim.ctl(&["--toggle", "--pid", &p]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(sim.state(app.pid), "running");
    assert_eq!(sim.gpus()[0].1, 16 << 20);
    assert!(app.advances(5), "the app runs again: {}", app.tail());
    app.assert_healthy();
}

#[test]
fn output_and_exit_codes_match_cuda_checkpoint() {
    let mut sim = Sim::start();
    let app = sim.app("app", &[]);
    let p = pid_s(app.pid);

    let out = sim.ctl(&["--get-state", "--pid", &p]);
    assert_eq!(stdout(&out), "running\n");
    let out = sim.ctl(&["--get-restore-tid", "-p", &p]);
    let tid: i32 = stdout(&out).trim().parse().expect("a tid");
    assert_ne!(
        tid, app.pid,
        "the restore thread is the driver's own thread"
    );
    assert!(std::path::Path::new(&format!("/proc/{}/task/{tid}", app.pid)).exists());

    // Wrong state: CUDA_ERROR_ILLEGAL_STATE (401), exit status 401 & 0xff.
    let out = sim.ctl(&["--action", "unlock", "--pid", &p]);
    assert_eq!(exit_code(&out), 401 & 0xff);
    assert_eq!(
        stderr(&out).trim(),
        format!(
            "Error unlocking CUDA in process ID {p}: \"the operation cannot be performed in the present state\""
        )
    );
    // A process without CUDA: the real driver answers CUDA_ERROR_NOT_INITIALIZED (3).
    let me = pid_s(std::process::id() as i32);
    let out = sim.ctl(&["--get-state", "--pid", &me]);
    assert_eq!(exit_code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("\"initialization error\""));
    // No such process: CUDA_ERROR_OPERATING_SYSTEM (304).
    let out = sim.ctl(&["--get-state", "--pid", "999999999"]);
    assert_eq!(exit_code(&out), 304 & 0xff, "{}", stderr(&out));

    // The four actions one by one, as CRIU's upstream plugin runs them.
    for (action, state) in [
        ("lock", "locked"),
        ("checkpoint", "checkpointed"),
        ("restore", "locked"),
        ("unlock", "running"),
    ] {
        let out = sim.ctl(&["--action", action, "--pid", &p, "--timeout", "5000"]);
        assert!(out.status.success(), "{action}: {}", stderr(&out));
        assert_eq!(sim.state(app.pid), state, "after {action}");
    }
    assert!(app.advances(3));
    app.assert_healthy();
}

#[test]
fn lock_waits_for_submitted_work_and_times_out_leaving_the_process_running() {
    let mut sim = Sim::start();
    // Every step submits a kernel that keeps the GPU busy for 1.5 s.
    let app = sim.app("busy", &["--busy-ms", "1500", "--interval-ms", "0"]);
    let p = pid_s(app.pid);
    let out = sim.ctl(&["--action", "lock", "--pid", &p, "--timeout", "300"]);
    assert_eq!(
        exit_code(&out),
        909 & 0xff,
        "CUDA_ERROR_TIMEOUT: {}",
        stderr(&out)
    );
    assert_eq!(sim.state(app.pid), "running");
    assert!(
        app.advances(1),
        "the app keeps running after a timed-out lock"
    );

    let start = Instant::now();
    let out = sim.ctl(&["--action", "lock", "--pid", &p, "--timeout", "10000"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        start.elapsed() >= Duration::from_millis(100),
        "the lock waited for the running kernel"
    );
    assert_eq!(sim.state(app.pid), "locked");
    assert!(app.stalls_for(Duration::from_millis(2000)));
    assert!(sim
        .ctl(&["--action", "unlock", "--pid", &p])
        .status
        .success());
    assert!(app.advances(1));
    app.assert_healthy();
}

#[test]
fn a_stopped_process_cannot_complete_an_action() {
    let mut sim = Sim::start();
    let app = sim.app("stopped", &[]);
    let p = pid_s(app.pid);
    signal(app.pid, Signal::SIGSTOP);
    // The driver's helper thread cannot run, so the lock cannot finish; the simulation gives up
    // after CUDA_SIM_PICKUP_TIMEOUT_MS instead of waiting for ever like the real driver.
    let out = sim.ctl_env(
        &["--action", "lock", "--pid", &p, "--timeout", "100"],
        &[("CUDA_SIM_PICKUP_TIMEOUT_MS", "500")],
    );
    assert_eq!(exit_code(&out), 909 & 0xff, "{}", stderr(&out));
    // State and restore thread are still readable: they need no help from the process.
    assert_eq!(sim.state(app.pid), "running");
    assert!(sim
        .ctl(&["--get-restore-tid", "--pid", &p])
        .status
        .success());
    signal(app.pid, Signal::SIGCONT);
    assert!(
        app.advances(2),
        "the withdrawn request was not carried out later"
    );
    assert_eq!(sim.state(app.pid), "running");
}

#[test]
fn a_failed_checkpoint_is_undone_and_the_process_keeps_running() {
    let mut sim = Sim::start();
    let app = sim.app("app", &[]);
    let p = pid_s(app.pid);
    let out = sim.ctl_env(
        &["--suspend", "--pid", &p],
        &[("CUDA_SIM_FAULT", "checkpoint=OUT_OF_MEMORY")],
    );
    assert_eq!(exit_code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("out of memory"), "{}", stderr(&out));
    assert_eq!(sim.state(app.pid), "running", "suspend unlocked again");
    assert!(app.advances(3));
    app.assert_healthy();
}

#[test]
fn a_tree_is_suspended_and_resumed_concurrently() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let root = sim.app(
        "tree",
        &["--children", "2", "--plain-children", "1", "--mib", "8"],
    );
    let gpu_logs: Vec<App> = (0..2)
        .map(|i| App {
            pid: 0,
            log: root.log.with_extension(format!("log.gpu{i}")),
        })
        .collect();
    assert!(wait_until(Duration::from_secs(20), || gpu_logs
        .iter()
        .all(|a| a.steps() > 0)));

    let list = sim.ctl_json(&["--list", "--tree", &pid_s(root.pid)]);
    let procs = list["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 3, "two children and the root use CUDA: {list}");
    for p in procs {
        assert_eq!(p["state"], "running");
        assert_eq!(p["gpus"][0]["memory"], 8 << 20, "{p}");
    }

    let out = sim.ctl_json(&["--suspend", "--tree", &pid_s(root.pid)]);
    let procs = out["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 3, "{out}");
    for p in procs {
        assert_eq!(p["after"], "checkpointed", "{p}");
        assert!(p["error"].is_null());
    }
    assert!(sim.gpus().iter().all(|g| g.1 == 0));
    let plain = App {
        pid: 0,
        log: root.log.with_extension("log.plain0"),
    };
    let ticks = plain.lines().len();
    assert!(
        wait_until(Duration::from_secs(5), || plain.lines().len() > ticks),
        "a process without CUDA is not touched"
    );

    let out = sim.ctl(&["--resume", "--tree", &pid_s(root.pid)]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("3 of 3 CUDA process(es) done"),
        "{}",
        stdout(&out)
    );
    assert!(root.advances(2));
    for a in &gpu_logs {
        assert!(a.advances(2), "{}", a.tail());
        a.assert_healthy();
    }
    root.assert_healthy();
}

#[test]
fn when_one_process_of_a_group_fails_the_others_are_put_back() {
    let mut sim = Sim::start();
    let root = sim.app("group", &["--children", "2", "--mib", "4"]);
    let kids = cuda_checkpoint_ctl::process::children(root.pid);
    assert_eq!(kids.len(), 2);
    for i in 0..2 {
        let log = root.log.with_extension(format!("log.gpu{i}"));
        assert!(wait_until(Duration::from_secs(20), || read_lines(&log)
            .len()
            > 1));
    }
    // One child cannot run its driver thread: its suspension fails.
    signal(kids[0], Signal::SIGSTOP);
    let out = sim.ctl_env(
        &["--suspend", "--tree", &pid_s(root.pid), "--json"],
        &[("CUDA_SIM_PICKUP_TIMEOUT_MS", "500")],
    );
    assert_eq!(exit_code(&out), 1);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for p in v["processes"].as_array().unwrap() {
        if p["pid"] == kids[0] {
            assert!(p["error"].as_str().unwrap().contains("timeout"), "{p}");
        } else {
            assert_eq!(p["rolled_back"], true, "{p}");
            assert_eq!(p["after"], "running", "{p}");
        }
    }
    signal(kids[0], Signal::SIGCONT);
    for pid in std::iter::once(root.pid).chain(kids) {
        assert_eq!(sim.state(pid), "running");
    }
    assert!(root.advances(2));
}

#[test]
fn restore_moves_a_process_to_another_gpu_by_uuid() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        memory: "256MiB",
        ..SimSpec::default()
    });
    let app = sim.app("app", &["--mib", "32"]);
    let p = pid_s(app.pid);
    let gpus = sim.gpus();
    assert_eq!((gpus[0].1, gpus[1].1), (32 << 20, 0));
    assert!(sim.ctl(&["--suspend", "--pid", &p]).status.success());

    // A map that does not name the process's GPU is refused (the driver wants them all).
    let elsewhere = format!("{}={}", gpus[1].0, gpus[0].0);
    let out = sim.ctl(&["--resume", "--pid", &p, "--device-map", &elsewhere]);
    assert_eq!(
        exit_code(&out),
        1,
        "CUDA_ERROR_INVALID_VALUE: {}",
        stderr(&out)
    );
    // A target that does not exist.
    let ghost = format!("{}=GPU-00000000-0000-0000-0000-000000000001", gpus[0].0);
    let out = sim.ctl(&["--resume", "--pid", &p, "--device-map", &ghost]);
    assert_eq!(
        exit_code(&out),
        101,
        "CUDA_ERROR_INVALID_DEVICE: {}",
        stderr(&out)
    );
    assert_eq!(
        sim.state(app.pid),
        "checkpointed",
        "failed restores change nothing"
    );

    let map = format!("{}={}", gpus[0].0, gpus[1].0);
    let out = sim.ctl(&["--resume", "--pid", &p, "-d", &map]);
    assert!(out.status.success(), "{}", stderr(&out));
    let gpus = sim.gpus();
    assert_eq!(
        (gpus[0].1, gpus[1].1),
        (0, 32 << 20),
        "now on the second GPU"
    );
    assert!(app.advances(3));
    app.assert_healthy();
}

#[test]
fn a_restore_without_room_fails_cleanly_and_can_be_retried() {
    let mut sim = Sim::with(SimSpec {
        memory: "64MiB",
        ..SimSpec::default()
    });
    let a = sim.app("a", &["--mib", "40"]);
    assert!(sim
        .ctl(&["--suspend", "--pid", &pid_s(a.pid)])
        .status
        .success());
    let b = sim.app("b", &["--mib", "40"]);
    let out = sim.ctl(&["--resume", "--pid", &pid_s(a.pid)]);
    assert_eq!(
        exit_code(&out),
        2,
        "CUDA_ERROR_OUT_OF_MEMORY: {}",
        stderr(&out)
    );
    assert_eq!(sim.state(a.pid), "checkpointed");
    signal(b.pid, Signal::SIGKILL);
    assert!(wait_until(Duration::from_secs(5), || sim.gpus()[0].1 == 0));
    let out = sim.ctl(&["--resume", "--pid", &pid_s(a.pid)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(a.advances(3));
    a.assert_healthy();
}

#[test]
fn recover_brings_back_locked_and_checkpointed_processes() {
    let mut sim = Sim::start();
    let a = sim.app("a", &[]);
    let b = sim.app("b", &[]);
    assert!(sim
        .ctl(&["--action", "lock", "--pid", &pid_s(a.pid)])
        .status
        .success());
    assert!(sim
        .ctl(&["--suspend", "--pid", &pid_s(b.pid)])
        .status
        .success());
    let out = sim.ctl(&["--recover", "--all"]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert_eq!(sim.state(a.pid), "running");
    assert_eq!(sim.state(b.pid), "running");
    assert!(a.advances(2) && b.advances(2));
}

#[test]
fn a_cgroup_selects_its_processes() {
    let mut sim = Sim::start();
    let app = sim.app("app", &[]);
    let other = sim.app("other", &[]);
    // Any hierarchy with cgroup.procs will do (v1 here, v2 elsewhere).
    let base = [
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ]
    .iter()
    .map(std::path::Path::new)
    .find(|p| p.join("cgroup.procs").exists())
    .expect("a cgroup hierarchy");
    let cg = base.join(format!("gpu-ckpt-test-{}", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("cgroup.procs"), pid_s(app.pid)).unwrap();
    let out = sim.ctl(&["--suspend", "--cgroup", cg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert_eq!(sim.state(app.pid), "checkpointed");
    assert_eq!(sim.state(other.pid), "running", "outside the cgroup");
    assert!(sim
        .ctl(&["--resume", "--cgroup", cg.to_str().unwrap()])
        .status
        .success());
    assert!(app.advances(2));
    signal(app.pid, Signal::SIGKILL);
    wait_gone(app.pid);
    let _ = std::fs::remove_dir(&cg);
}

#[test]
fn a_missing_or_old_driver_is_named_with_the_fix() {
    let sim = Sim::start();
    let out = sim.ctl_env(
        &["--get-state", "--pid", "1"],
        &[("CUDA_CKPT_LIBCUDA", "/nonexistent/libcuda.so.1")],
    );
    assert_eq!(exit_code(&out), 1);
    assert!(
        stderr(&out).contains("install the NVIDIA driver"),
        "{}",
        stderr(&out)
    );
    // A library without the checkpoint API stands in for a driver older than r570.
    let out = sim.ctl_env(
        &["--get-state", "--pid", "1"],
        &[("CUDA_CKPT_LIBCUDA", "libc.so.6")],
    );
    assert_eq!(exit_code(&out), 1);
    assert!(
        stderr(&out).contains("cuCheckpointProcess") && stderr(&out).contains("r570"),
        "{}",
        stderr(&out)
    );
    let out = sim.ctl(&["--get-state"]);
    assert_eq!(exit_code(&out), 2, "no process named");
}
