//! Every command is bounded (issue 16). The driver waits without limit while a process's CUDA
//! driver thread cannot run (docs/driver-facts.md, F2, F11), as the simulated one does:
//! cuda-checkpoint-ctl sees a stopped, traced or frozen process first and refuses, with the fix
//! and without calling the driver; a process held while a call is in flight, or a driver that
//! never answers, is given up on within --wait, saying what may still happen.

use gpu_ckpt_tests::held::{Freezer, Frozen, Tracer};
use std::process::Output;

use super::*;

/// Each single-process command and the gerund of its NVIDIA-style error line.
const COMMANDS: [(&[&str], &str); 9] = [
    (&["--get-state"], "getting the state of"),
    (&["--action", "lock"], "locking"),
    (&["--action", "checkpoint"], "checkpointing"),
    (&["--action", "restore"], "restoring"),
    (&["--action", "unlock"], "unlocking"),
    (&["--toggle"], "toggling"),
    (&["--suspend"], "suspending"),
    (&["--resume"], "resuming"),
    (&["--recover"], "recovering"),
];

/// A refusal must not wait for the driver; the tool did, for ever, before.
const PROMPT: Duration = Duration::from_secs(10);
/// CUDA_ERROR_NOT_READY: nothing was asked of the driver; try again once the process can run.
const NOT_READY: i32 = 600 & 0xff;
/// CUDA_ERROR_TIMEOUT: a driver call was given up on; it may still take effect.
const TIMEOUT: i32 = 909 & 0xff;

/// Runs cuda-checkpoint-ctl, failing the test (not hanging) when it does not return in time.
fn ctl_within(sim: &Sim, args: &[&str], limit: Duration) -> Output {
    let child = sim.ctl_spawn(args, &[]);
    finish_within(child, limit).unwrap_or_else(|| {
        panic!("cuda-checkpoint-ctl {args:?} did not return within {limit:?}: it waited for the driver")
    })
}

fn json_of(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(out), stderr(out)))
}

/// Every command on held process `pid` is refused at once, its message holding `why` and `fix`;
/// JSON, group operations and the listing say it in the same words.
fn every_command_is_refused(sim: &Sim, pid: i32, why: &str, fix: &str) {
    let p = pid_s(pid);
    for (cmd, gerund) in COMMANDS {
        let mut args = cmd.to_vec();
        args.extend(["--pid", &p]);
        let out = ctl_within(sim, &args, PROMPT);
        let err = stderr(&out);
        assert!(err.contains(why) && err.contains(fix), "{args:?}: {err}");
        if cmd == ["--recover"] {
            assert_eq!(exit_code(&out), 1, "{args:?}: {err}");
        } else {
            assert_eq!(exit_code(&out), NOT_READY, "{args:?}: {err}");
            let nvidia = format!("Error {gerund} CUDA in process ID {p}: \"");
            assert!(err.starts_with(&nvidia), "{args:?}: {err}");
        }
    }
    let out = ctl_within(sim, &["--get-state", "--pid", &p, "--json"], PROMPT);
    assert_eq!(exit_code(&out), NOT_READY);
    let error = json_of(&out)["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(error.contains(why) && error.contains(fix), "{error}");
    for args in [
        ["--suspend", "--pid", &p, "--json"],
        ["--suspend", "--tree", &p, "--json"],
        ["--recover", "--tree", &p, "--json"],
    ] {
        let out = ctl_within(sim, &args, PROMPT);
        assert_ne!(exit_code(&out), 0, "{args:?}");
        let v = json_of(&out);
        let error = v["processes"][0]["error"].as_str().unwrap_or_default();
        assert!(error.contains(why) && error.contains(fix), "{args:?}: {v}");
    }
    let v = json_of(&ctl_within(
        sim,
        &["--list", "--tree", &p, "--json"],
        PROMPT,
    ));
    assert_eq!(v["processes"][0]["state"], "held", "{v}");
    let held = v["processes"][0]["held"].as_str().unwrap_or_default();
    assert!(held.contains(why) && held.contains(fix), "{v}");
}

#[test]
fn a_stopped_process_is_refused_by_every_command_and_left_as_it_was() {
    let mut sim = Sim::start();
    let app = sim.app("stopped", &["--mib", "4"]);
    signal(app.pid, Signal::SIGSTOP);
    assert!(wait_until(Duration::from_secs(5), || is_stopped(app.pid)));
    let fix = format!("kill -CONT {}", app.pid);
    every_command_is_refused(&sim, app.pid, "is stopped", &fix);
    signal(app.pid, Signal::SIGCONT);
    assert_eq!(sim.state(app.pid), "running", "nothing was done");
    assert!(app.advances(2), "{}", app.tail());
    app.assert_healthy();
}

#[test]
fn a_process_held_by_a_debugger_is_refused_by_every_command_and_left_as_it_was() {
    let mut sim = Sim::start();
    let app = sim.app("traced", &["--mib", "4"]);
    let p = pid_s(app.pid);
    assert!(sim.ctl(&["--suspend", "--pid", &p]).status.success());
    let tracer = Tracer::hold(app.pid, &[]);
    let why = format!(
        "held in a ptrace stop by process {} (ptrace-hold)",
        tracer.pid
    );
    every_command_is_refused(&sim, app.pid, &why, "detach");
    drop(tracer);
    assert_eq!(sim.state(app.pid), "checkpointed", "nothing was done");

    // A debugger on the driver thread alone holds the process as well (F2).
    let tid = stdout(&sim.ctl(&["--get-restore-tid", "--pid", &p]));
    let tracer = Tracer::hold(app.pid, &["--only", tid.trim()]);
    for cmd in [["--get-state", "--pid", &p], ["--resume", "--pid", &p]] {
        let out = ctl_within(&sim, &cmd, PROMPT);
        assert_eq!(exit_code(&out), NOT_READY, "{cmd:?}: {}", stderr(&out));
        let why = format!(
            "driver thread {} held in a ptrace stop by process {}",
            tid.trim(),
            tracer.pid
        );
        assert!(stderr(&out).contains(&why), "{}", stderr(&out));
    }
    drop(tracer);
    assert!(sim.ctl(&["--resume", "--pid", &p]).status.success());
    assert!(app.advances(2), "{}", app.tail());
    app.assert_healthy();
}

/// CRIU's C plugin runs `cuda-checkpoint --action checkpoint` (and restore, unlock) while CRIU
/// holds every thread but the driver's: that thread runs, so the driver can act; the tool
/// must not refuse.
#[test]
fn a_process_whose_driver_thread_alone_runs_is_not_refused() {
    let mut sim = Sim::start();
    let app = sim.app("seized", &["--mib", "4"]);
    let p = pid_s(app.pid);
    let tid = stdout(&sim.ctl(&["--get-restore-tid", "--pid", &p]));
    let tracer = Tracer::hold(app.pid, &["--except", tid.trim()]);
    for (action, state) in [
        ("lock", "locked"),
        ("checkpoint", "checkpointed"),
        ("restore", "locked"),
        ("unlock", "running"),
    ] {
        let out = ctl_within(&sim, &["--action", action, "--pid", &p], PROMPT);
        assert!(out.status.success(), "{action}: {}", stderr(&out));
        let out = ctl_within(&sim, &["--get-state", "--pid", &p], PROMPT);
        assert_eq!(stdout(&out).trim(), state, "{}", stderr(&out));
    }
    drop(tracer);
    assert!(app.advances(2), "{}", app.tail());
    app.assert_healthy();
}

fn a_frozen_process_is_refused(freezer: Freezer) {
    let mut sim = Sim::start();
    let app = sim.app("frozen", &["--mib", "4"]);
    let p = pid_s(app.pid);
    assert!(sim.ctl(&["--action", "lock", "--pid", &p]).status.success());
    let frozen = Frozen::freeze(app.pid, freezer);
    let why = format!("is in the frozen cgroup {}", frozen.dir.display());
    every_command_is_refused(&sim, app.pid, &why, &frozen.thaw_command());
    drop(frozen);
    assert_eq!(sim.state(app.pid), "locked", "nothing was done");
    assert!(sim.ctl(&["--recover", "--pid", &p]).status.success());
    assert!(app.advances(2), "{}", app.tail());
    app.assert_healthy();
}

#[test]
fn a_process_in_a_frozen_v1_cgroup_is_refused_by_every_command_and_left_as_it_was() {
    a_frozen_process_is_refused(Freezer::V1);
}

#[test]
fn a_process_in_a_frozen_v2_cgroup_is_refused_by_every_command_and_left_as_it_was() {
    a_frozen_process_is_refused(Freezer::V2);
}

/// The process stops after the check, while the driver carries the call out: the command gives
/// up within --wait (with the default wait, once the process has stayed stopped for 2 s), says
/// the call may still take effect and how to undo it; it does, once the process runs, and
/// --recover brings the process back.
#[test]
fn a_process_stopped_during_a_call_is_given_up_on_within_the_wait_and_recovered() {
    let mut sim = Sim::start();
    let app = sim.app("race", &["--mib", "4"]);
    let p = pid_s(app.pid);
    // (set-up, command, its slowed action, the state once that action has landed)
    let cases: [(&[&str], &[&str], &str, &str); 3] = [
        (&[], &["--action", "lock"], "lock=delay:3000", "locked"),
        (
            &[],
            &["--suspend", "--wait", "4"],
            "checkpoint=delay:3000",
            "checkpointed",
        ),
        (
            &["--suspend"],
            &["--resume", "--json", "--wait", "4"],
            "restore=delay:3000",
            "locked",
        ),
    ];
    for (setup, cmd, fault, landed) in cases {
        if !setup.is_empty() {
            let out = sim.ctl(&[setup, &["--pid", &p]].concat());
            assert!(out.status.success(), "{setup:?}: {}", stderr(&out));
        }
        let args = [cmd, &["--pid", &p]].concat();
        let caller = sim.ctl_spawn(&args, &[("CUDA_SIM_FAULT", fault)]);
        assert!(sim.wait_busy(app.pid), "{args:?}: the call is in flight");
        signal(app.pid, Signal::SIGSTOP);
        let limit = if cmd.contains(&"--wait") { 4 } else { 2 };
        let out = finish_within(caller, Duration::from_secs(limit + 5))
            .unwrap_or_else(|| panic!("{args:?} did not return within {limit} s"));
        assert_eq!(exit_code(&out), TIMEOUT, "{args:?}: {}", stderr(&out));
        let err = if cmd.contains(&"--json") {
            let v = json_of(&out);
            assert_eq!(v["processes"][0]["abandoned"], "restore", "{v}");
            v["processes"][0]["error"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        } else {
            stderr(&out)
        };
        assert!(
            err.contains("may still take effect")
                && err.contains(&format!("kill -CONT {p}"))
                && err.contains(&format!("cuda-checkpoint-ctl --recover --pid {p}")),
            "{args:?}: {err}"
        );
        signal(app.pid, Signal::SIGCONT);
        assert_eq!(
            sim.state(app.pid),
            landed,
            "{args:?}: the driver had taken it (F3)"
        );
        let out = sim.ctl(&["--recover", "--pid", &p]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(sim.state(app.pid), "running");
        assert!(app.advances(1), "{}", app.tail());
    }
    app.assert_healthy();
}

/// A driver that never answers (a hung GPU): a state query and an action give up after --wait.
#[test]
fn calls_on_a_hung_process_give_up_after_the_wait() {
    let mut sim = Sim::start();
    let app = sim.app("hung", &[]);
    let p = pid_s(app.pid);
    assert!(sim.ctl(&["--action", "lock", "--pid", &p]).status.success());
    let hang = [("CUDA_SIM_FAULT", "checkpoint=hang")];
    let caller = sim.ctl_spawn(
        &["--action", "checkpoint", "--pid", &p, "--wait", "1"],
        &hang,
    );
    let out = finish_within(caller, PROMPT).expect("the hung checkpoint is given up on");
    assert_eq!(exit_code(&out), TIMEOUT, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("may still take effect"),
        "{}",
        stderr(&out)
    );

    let out = ctl_within(&sim, &["--get-state", "--pid", &p, "--wait", "1"], PROMPT);
    assert_eq!(exit_code(&out), TIMEOUT, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("within 1.0 s") && err.contains("--wait"),
        "{err}"
    );
    assert!(
        !err.contains("--recover"),
        "a state query changes nothing: {err}"
    );
    // An action reads the state first: it is given up on there, before anything was asked.
    let out = ctl_within(
        &sim,
        &["--action", "unlock", "--pid", &p, "--wait", "1"],
        PROMPT,
    );
    assert_eq!(exit_code(&out), TIMEOUT, "{}", stderr(&out));
    assert!(stderr(&out).contains("within 1.0 s"), "{}", stderr(&out));
}
