//! The test applications (`cuda-sim-app` and its kin): started in a session of their own, read
//! through their step log.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::{artifact, fake_nccl, reap_in_background, setsid_command, wait_until, Sim};

/// Starts a test application (`program --log LOG ARGS`) in a session of its own and waits for
/// its first verified step.
pub fn start_app(program: &str, log: &Path, args: &[&str], env: Vec<(String, String)>) -> App {
    let child = setsid_command(&artifact(program))
        .args(["--log", log.to_str().unwrap()])
        .args(args)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    let app = App {
        pid: reap_in_background(child),
        log: log.to_path_buf(),
    };
    assert!(
        wait_until(Duration::from_secs(20), || app.steps() >= 1),
        "{program} did not start: {}",
        app.tail()
    );
    app
}

/// A running test application and its log.
pub struct App {
    pub pid: i32,
    pub log: PathBuf,
}

impl App {
    pub fn lines(&self) -> Vec<String> {
        read_lines(&self.log)
    }

    /// The number of verified steps so far.
    pub fn steps(&self) -> usize {
        self.lines().iter().filter(|l| l.ends_with(" ok")).count()
    }

    /// Asserts no step found wrong data and the application did not fail.
    pub fn assert_healthy(&self) {
        for l in self.lines() {
            assert!(
                !l.starts_with("MISMATCH") && !l.starts_with("ERROR"),
                "{}: {l}",
                self.log.display()
            );
        }
    }

    /// Waits for `n` more verified steps.
    pub fn advances(&self, n: usize) -> bool {
        let start = self.steps();
        wait_until(Duration::from_secs(20), || self.steps() >= start + n)
    }

    /// True if no step completes within `d` (the process is locked or stopped). The one step
    /// that was past its last CUDA call may still log, however late a loaded machine lets it.
    pub fn stalls_for(&self, d: Duration) -> bool {
        let start = self.steps();
        std::thread::sleep(d + Duration::from_millis(200));
        self.steps() <= start + 1
    }

    pub fn tail(&self) -> String {
        self.lines()
            .iter()
            .rev()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

pub fn read_lines(p: &Path) -> Vec<String> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// NCCL's settings that make ranks of one node talk through sockets only.
pub const NCCL_SOCKETS_ONLY: [(&str, &str); 3] = [
    ("NCCL_P2P_DISABLE", "1"),
    ("NCCL_SHM_DISABLE", "1"),
    ("NCCL_CUMEM_ENABLE", "0"),
];

/// Starts `cuda-sim-app ARGS` on `sim` as an NCCL job: the fake NCCL preloaded, `extra` in its
/// environment (forked children inherit both).
pub fn nccl_app(sim: &mut Sim, name: &str, args: &[&str], extra: &[(&str, &str)]) -> App {
    let lib = fake_nccl(&sim.dir);
    let mut env = sim.env();
    env.push(("LD_PRELOAD".into(), lib.display().to_string()));
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let app = start_app(
        "cuda-sim-app",
        &sim.dir.join(format!("{name}.log")),
        args,
        env,
    );
    sim.adopt(app.pid);
    app
}
