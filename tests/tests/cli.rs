//! cuda-checkpoint-ctl against the simulated driver: the cuda-checkpoint command line, the
//! driver's state machine and errors, group operations, rollback. The measured driver facts
//! (docs/driver-facts.md), held processes and bounded waits, recovery, messages and device maps
//! have modules of their own.

use std::time::Duration;

use gpu_ckpt_tests::*;
use nix::sys::signal::Signal;

#[path = "cli/facts.rs"]
mod facts;
#[path = "cli/held.rs"]
mod held;
#[path = "cli/messages.rs"]
mod messages;
#[path = "cli/placement.rs"]
mod placement;
#[path = "cli/recover.rs"]
mod recover;

fn pid_s(pid: i32) -> String {
    pid.to_string()
}

/// The pids of a test app's GPU children, once each has logged a step.
fn gpu_children(root: &App, n: usize) -> Vec<i32> {
    for i in 0..n {
        let log = root.log.with_extension(format!("log.gpu{i}"));
        assert!(
            wait_until(Duration::from_secs(20), || read_lines(&log).len() > 1),
            "child {i} did not start"
        );
    }
    let kids = process_facts::process::children(root.pid);
    assert_eq!(kids.len(), n, "{kids:?}");
    kids
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
    assert!(
        stderr(&out).contains("\"initialization error\""),
        "{}",
        stderr(&out)
    );
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

/// Ranks of one node whose NCCL transports the driver cannot restore (F13) are not suspended as
/// a group, and stay running; sockets-only ranks, or --no-nccl-check, are.
#[test]
fn nccl_ranks_that_could_not_be_restored_are_not_suspended() {
    let mut sim = Sim::start();
    let root = nccl_app(&mut sim, "ranks", &["--children", "1", "--mib", "8"], &[]);
    let kid = gpu_children(&root, 1)[0];
    let tree = pid_s(root.pid);
    let out = sim.ctl(&["--suspend", "--tree", &tree]);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "process {} (cuda-sim-app) (P2P, SHM and cuMem)",
            root.pid
        )) && text.contains(&kid.to_string())
            && text.contains("NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0")
            && text.contains("--no-nccl-check"),
        "{text}"
    );
    assert_eq!(
        (sim.state(root.pid), sim.state(kid)),
        ("running".into(), "running".into())
    );
    assert!(root.advances(2), "{}", root.tail());

    let out = sim.ctl(&["--suspend", "--tree", &tree, "--no-nccl-check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(sim.state(kid), "checkpointed");
    assert!(sim.ctl(&["--resume", "--tree", &tree]).status.success());

    let ok = nccl_app(
        &mut sim,
        "sockets",
        &["--children", "1", "--mib", "8"],
        &NCCL_SOCKETS_ONLY,
    );
    gpu_children(&ok, 1);
    let tree = pid_s(ok.pid);
    let out = sim.ctl(&["--suspend", "--tree", &tree]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(sim.ctl(&["--resume", "--tree", &tree]).status.success());
    assert!(ok.advances(2), "{}", ok.tail());
    ok.assert_healthy();
}

/// The simulated driver reads its variables from the plugin's settings file (container runtimes
/// start CRIU, and so the guardian that loads the driver, with an environment of their own): it
/// finds in a file what the plugin's settings find there.
#[test]
fn the_simulated_driver_reads_the_settings_file_as_the_plugin_does() {
    use criu_gpu_host::settings::{declared::LIBCUDA, Settings};
    let key = LIBCUDA.key;
    let files = [
        String::new(),
        "OTHER=1\n".into(),
        format!("{key}=/a\n{key} = /b # why\n"),
        format!("{key}=/a\n{key}=\n"),
        format!("# {key}=/a\n"),
    ];
    for file in &files {
        let plugin = Settings::from_sources(&[], file, "gpu-plugin.conf").get(&LIBCUDA);
        assert_eq!(Ok(cuda_sim::config::in_file(file, key)), plugin, "{file:?}");
    }
}
