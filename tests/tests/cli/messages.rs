//! What the CLI says when it cannot do its job: missing permissions, a missing driver or
//! NVML, JSON errors, a reader that went away.

use std::io::Read;
use std::process::{Command, Stdio};

use super::*;

/// The issue: as a non-root user, group operations and --list saw nothing and exited 0.
#[test]
fn processes_this_user_cannot_inspect_are_an_error_with_the_fix() {
    let mut sim = Sim::start();
    let app = sim.app("root-owned", &[]);
    let p = pid_s(app.pid);
    let out = sim.ctl_as_nobody(&["--list", "--tree", &p]);
    assert_eq!(exit_code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 process(es) could not be inspected for lack of permission")
            && stderr(&out).contains("run as root"),
        "{}",
        stderr(&out)
    );
    let out = sim.ctl_as_nobody(&["--suspend", "--tree", &p, "--json"]);
    assert_eq!(exit_code(&out), 1);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["error"].as_str().unwrap().contains("run as root"), "{v}");
    assert_eq!(sim.state(app.pid), "running", "refused before acting");
    let out = sim.ctl_as_nobody(&["--recover", "--tree", &p]);
    assert_eq!(exit_code(&out), 1, "{}", stdout(&out));
}

/// `cuda-checkpoint-ctl --list | head -1`: the reader leaves, the tool ends quietly.
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    let mut sim = Sim::start();
    let app = sim.app("piped", &[]);
    let mut child = Command::new(artifact("cuda-checkpoint-ctl"))
        .args(["--list", "--tree", &pid_s(app.pid)])
        .envs(sim.env())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before the first line
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn json_modes_report_every_error_as_json() {
    let sim = Sim::start();
    let json_of = |args: &[&str]| {
        let out = sim.ctl(args);
        assert_ne!(exit_code(&out), 0, "{args:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", stdout(&out)));
        v["error"].as_str().unwrap_or_default().to_owned()
    };
    assert!(json_of(&["--get-state", "--json"]).contains("--pid"));
    assert!(json_of(&["--list", "--json", "--driver", ""]).contains("empty"));
    assert!(json_of(&["--suspend", "--json", "--tree", "999999999"]).contains("does not exist"));
    assert!(json_of(&["--bogus", "--json"]).contains("--bogus"));
    let err = json_of(&[
        "--gpus",
        "--json",
        "--nvml",
        "/nonexistent/libnvidia-ml.so.1",
    ]);
    assert!(
        err.contains("/nonexistent") && err.contains("CUDA_CKPT_LIBNVML"),
        "{err}"
    );
}

#[test]
fn a_missing_empty_or_old_driver_is_named_with_the_fix() {
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
    let out = sim.ctl(&["--list", "--driver", ""]);
    assert_eq!(exit_code(&out), 1);
    assert!(stderr(&out).contains("--driver"), "{}", stderr(&out));
    let out = sim.ctl(&["--get-state"]);
    assert_eq!(exit_code(&out), 2, "no process named");
}
