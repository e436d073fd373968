//! --recover after interrupted checkpoints, and group operations whose members fail or hang:
//! every wait bounded, every process back to running or a loud error.

use std::time::Instant;

use super::*;

/// The issue: right after a killed CRIU, --recover met the orphaned action still running,
/// failed, and had to be run again. Now it waits for it and finishes the job.
#[test]
fn recover_waits_for_an_orphaned_action_and_brings_the_process_back() {
    let mut sim = Sim::start();
    let app = sim.app("orphan", &["--mib", "8"]);
    let p = pid_s(app.pid);
    assert!(sim.ctl(&["--action", "lock", "--pid", &p]).status.success());
    let slow = [("CUDA_SIM_FAULT", "checkpoint=delay:3000")];
    let caller = sim.ctl_spawn(&["--action", "checkpoint", "--pid", &p], &slow);
    assert!(sim.wait_busy(app.pid));
    kill_child(caller); // CRIU killed mid-checkpoint
    let out = sim.ctl(&["--recover", "--pid", &p]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "waiting for an action in progress on process {p} (cuda-sim-app)"
        )),
        "{}",
        stderr(&out)
    );
    assert_eq!(sim.state(app.pid), "running");
    assert!(app.advances(2), "{}", app.tail());
    app.assert_healthy();
}

#[test]
fn recover_brings_back_a_tree_of_locked_and_checkpointed_processes() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let root = sim.app("tree", &["--children", "2", "--mib", "4"]);
    let kids = gpu_children(&root, 2);
    let (a, b) = (pid_s(kids[0]), pid_s(kids[1]));
    assert!(sim.ctl(&["--action", "lock", "--pid", &a]).status.success());
    assert!(sim.ctl(&["--suspend", "--pid", &b]).status.success());
    let slow = [("CUDA_SIM_FAULT", "unlock=delay:1500")];
    let orphan = sim.ctl_spawn(&["--action", "unlock", "--pid", &a], &slow);
    assert!(sim.wait_busy(kids[0]));
    kill_child(orphan);
    let out = sim.ctl(&["--recover", "--tree", &pid_s(root.pid)]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("3 of 3 CUDA process(es) done"),
        "{}",
        stdout(&out)
    );
    for pid in [root.pid, kids[0], kids[1]] {
        assert_eq!(sim.state(pid), "running");
    }
    assert!(root.advances(2));
}

/// A process whose GPU state is lost cannot be recovered: say so, fail.
#[test]
fn recover_fails_loudly_on_a_process_whose_gpu_state_is_lost() {
    let mut sim = Sim::start();
    let app = sim.app("lost", &[]);
    let p = pid_s(app.pid);
    let out = sim.ctl_env(
        &["--suspend", "--pid", &p],
        &[("CUDA_SIM_FAULT", "checkpoint=failed")],
    );
    assert_eq!(
        exit_code(&out),
        999 & 0xff,
        "CUDA_ERROR_UNKNOWN: {}",
        stderr(&out)
    );
    assert_eq!(sim.state(app.pid), "failed");
    let lost = format!(
        "the GPU state of process {p} (cuda-sim-app) is lost: the driver reports it failed; restart it"
    );
    let out = sim.ctl(&["--recover", "--pid", &p]);
    assert_eq!(exit_code(&out), 1);
    assert!(stderr(&out).contains(&lost), "{}", stderr(&out));
    let out = sim.ctl(&["--recover", "--tree", &p, "--json"]);
    assert_eq!(exit_code(&out), 1);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["processes"][0]["error"], lost.as_str());
}

/// A hung GPU: the action never ends, so --recover gives up after --wait and says why.
#[test]
fn a_hung_action_bounds_recover_by_its_wait() {
    let mut sim = Sim::start();
    let app = sim.app("hung", &[]);
    let p = pid_s(app.pid);
    assert!(sim.ctl(&["--action", "lock", "--pid", &p]).status.success());
    let hang = [("CUDA_SIM_FAULT", "checkpoint=hang")];
    let caller = sim.ctl_spawn(&["--action", "checkpoint", "--pid", &p], &hang);
    assert!(sim.wait_busy(app.pid));
    kill_child(caller);
    let start = Instant::now();
    let out = sim.ctl(&["--recover", "--pid", &p, "--wait", "1"]);
    assert!(start.elapsed() < Duration::from_secs(5), "bounded");
    assert_eq!(exit_code(&out), 1);
    let err = stderr(&out);
    assert!(
        err.contains("within 1.0 s") && err.contains("hung GPU") && err.contains("--wait"),
        "{err}"
    );
    let out = sim.ctl(&["--list", "--tree", &p, "--json", "--wait", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["processes"][0]["state"], "busy",
        "--list does not hang either"
    );
}

/// A Ctrl-Z right after the lock: --recover cannot unlock a stopped process and says how to
/// continue it; its request dies with it (F3), and a second --recover finishes the job.
#[test]
fn a_process_stopped_after_its_lock_is_recovered_once_it_continues() {
    let mut sim = Sim::start();
    let app = sim.app("ctrl-z", &[]);
    let p = pid_s(app.pid);
    let out = sim.ctl_env(
        &["--action", "lock", "--pid", &p],
        &[("CUDA_SIM_FAULT", &format!("lock/{p}=stop"))],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(wait_until(Duration::from_secs(5), || is_stopped(app.pid)));
    let out = sim.ctl(&["--recover", "--pid", &p, "--wait", "1"]);
    assert_eq!(exit_code(&out), 1);
    assert!(
        stderr(&out).contains("is stopped") && stderr(&out).contains(&format!("kill -CONT {p}")),
        "{}",
        stderr(&out)
    );
    signal(app.pid, Signal::SIGCONT);
    assert_eq!(
        sim.state(app.pid),
        "locked",
        "the dead caller's unlock was dropped"
    );
    assert!(sim.ctl(&["--recover", "--pid", &p]).status.success());
    assert_eq!(sim.state(app.pid), "running");
    assert!(app.advances(1));
}

/// One member of a group cannot run its driver thread: the group's suspension fails within
/// --wait and the others are put back.
#[test]
fn when_one_member_is_stopped_the_others_are_put_back_within_the_wait() {
    let mut sim = Sim::start();
    let root = sim.app("group", &["--children", "2", "--mib", "4"]);
    let kids = gpu_children(&root, 2);
    signal(kids[0], Signal::SIGSTOP);
    assert!(wait_until(Duration::from_secs(5), || is_stopped(kids[0])));
    let start = Instant::now();
    let out = sim.ctl(&[
        "--suspend",
        "--tree",
        &pid_s(root.pid),
        "--json",
        "--wait",
        "1",
    ]);
    assert!(start.elapsed() < Duration::from_secs(10), "bounded");
    assert_eq!(exit_code(&out), 1);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for p in v["processes"].as_array().unwrap() {
        if p["pid"] == kids[0] {
            let err = p["error"].as_str().unwrap();
            // Its state query already waits for the stopped driver thread (F11).
            assert!(
                err.contains("is stopped") && err.contains("kill -CONT"),
                "{p}"
            );
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

/// A fault aimed at one process (CUDA_SIM_FAULT=op/PID=...) after its state changed: its
/// suspension is undone, and so are the others'.
#[test]
fn a_member_whose_checkpoint_fails_after_the_fact_is_brought_back_with_the_others() {
    let mut sim = Sim::start();
    let root = sim.app("late", &["--children", "2", "--mib", "4"]);
    let kids = gpu_children(&root, 2);
    let fault = format!("checkpoint/{}=ILLEGAL_STATE@after", kids[1]);
    let out = sim.ctl_env(
        &["--suspend", "--tree", &pid_s(root.pid), "--json"],
        &[("CUDA_SIM_FAULT", &fault)],
    );
    assert_eq!(exit_code(&out), 1);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for p in v["processes"].as_array().unwrap() {
        assert_eq!(p["after"], "running", "{p}");
        if p["pid"] == kids[1] {
            assert!(
                p["error"].as_str().unwrap().contains("present state"),
                "{p}"
            );
        } else {
            assert_eq!(p["rolled_back"], true, "{p}");
        }
    }
    for (i, &pid) in kids.iter().enumerate() {
        let log = App {
            pid,
            log: root.log.with_extension(format!("log.gpu{i}")),
        };
        assert!(log.advances(1), "{}", log.tail());
        log.assert_healthy();
    }
}
