//! What a scenario needs of the machine it runs on, written once for the simulated GPU and a
//! real NVIDIA machine: applications holding device data that they check at every step (both
//! log in the same protocol, see [`App`]), the CLI, the driver's state of a process, the GPUs as
//! NVML sees them.
//!
//! The machine is the simulation unless `GPU_CKPT_MACHINE=nvidia` selects this host's GPUs
//! (scripts/gpu/scenarios.sh does); nothing selects a real GPU by accident.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::nvidia::{self, Nvidia};
use crate::{artifact, finish_within, reap_in_background, wait_until, App, Machine, Sim, SimSpec};

/// The environment variable that selects the machine: `sim` (the default) or `nvidia`.
pub const MACHINE_ENV: &str = "GPU_CKPT_MACHINE";

/// The machine a scenario runs on.
pub enum Host {
    Sim(Sim),
    Nvidia(Nvidia),
}

/// What an application does: how much device data it holds and checks, how long it pauses
/// between steps, how long each step keeps the GPU busy.
#[derive(Clone, Copy, Debug)]
pub struct Work {
    pub mib: u64,
    pub seed: u64,
    pub interval_ms: u64,
    /// A kernel of this length at every step (a process whose GPU is busy).
    pub busy_ms: u64,
}

impl Work {
    pub fn mib(mib: u64) -> Work {
        Work {
            mib,
            seed: 7,
            interval_ms: 100,
            busy_ms: 0,
        }
    }

    /// Steps back to back, each with a kernel of `ms` ms.
    pub fn busy(mib: u64, ms: u64) -> Work {
        Work {
            interval_ms: 0,
            busy_ms: ms,
            ..Work::mib(mib)
        }
    }
}

/// A process tree: a plain root (`sh`) and its GPU applications.
pub struct Tree {
    pub root: i32,
    pub apps: Vec<App>,
}

impl Host {
    /// The machine `GPU_CKPT_MACHINE` names, with one GPU at least.
    pub fn start() -> Host {
        Host::with_gpus(1)
    }

    /// The machine `GPU_CKPT_MACHINE` names, which must have `gpus` GPUs at least (the
    /// simulation is made with that many).
    pub fn with_gpus(gpus: u32) -> Host {
        let host = match std::env::var(MACHINE_ENV).as_deref() {
            Err(_) | Ok("sim") => Host::Sim(Sim::with(SimSpec {
                gpus,
                ..SimSpec::default()
            })),
            Ok("nvidia") => Host::Nvidia(Nvidia::start()),
            Ok(other) => panic!("{MACHINE_ENV}={other:?}: name `sim` or `nvidia`"),
        };
        let found = host.gpu_uuids().len();
        assert!(
            found >= gpus as usize,
            "this scenario needs {gpus} GPU(s), NVML reports {found}: run it on a machine with \
             more (scripts/gpu/scenarios.sh runs the 2-GPU scenarios only where 2 are present)"
        );
        host
    }

    pub fn is_sim(&self) -> bool {
        matches!(self, Host::Sim(_))
    }

    pub fn dir(&self) -> &Path {
        self.scratch()
    }

    /// A path in the scratch directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir().join(name)
    }

    /// Device data of a size that makes a GPU checkpoint last long enough to be interrupted in
    /// its middle (256 MiB on the simulation, which copies slowly; 4 GiB on a GPU).
    pub fn big_mib(&self) -> u64 {
        if self.is_sim() {
            256
        } else {
            4096
        }
    }

    /// The command line that runs `work`, logging to `log` (and holding a connection to
    /// `socket` open).
    fn app_command(&self, work: &Work, log: &Path, socket: Option<&Path>) -> Vec<String> {
        let log = log.display().to_string();
        match self {
            Host::Sim(_) => {
                let mut a = vec![artifact("cuda-sim-app").display().to_string()];
                a.extend(
                    [
                        ("--log", log),
                        ("--mib", work.mib.to_string()),
                        ("--seed", work.seed.to_string()),
                        ("--interval-ms", work.interval_ms.to_string()),
                        ("--busy-ms", work.busy_ms.to_string()),
                    ]
                    .into_iter()
                    .flat_map(|(k, v)| [k.to_owned(), v]),
                );
                if let Some(s) = socket {
                    a.extend(["--hold-unix-socket".into(), s.display().to_string()]);
                }
                a
            }
            Host::Nvidia(_) => {
                let mut a = vec![
                    nvidia::ct_app().display().to_string(),
                    format!("{:.4}", work.mib as f64 / 1024.0),
                    work.seed.to_string(),
                    log,
                    work.interval_ms.to_string(),
                    work.busy_ms.to_string(),
                ];
                a.extend(socket.map(|s| s.display().to_string()));
                a
            }
        }
    }

    fn adopt(&mut self, pid: i32) {
        match self {
            Host::Sim(s) => s.adopt(pid),
            Host::Nvidia(n) => n.adopt(pid),
        }
    }

    /// Starts `argv` in a session of its own (as CRIU wants a dump root) and remembers it.
    fn spawn(&mut self, argv: &[String]) -> i32 {
        let child = Command::new("setsid")
            .args(argv)
            .envs(self.env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.path("apps.err")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {argv:?}: {e}"));
        let pid = reap_in_background(child);
        self.adopt(pid);
        pid
    }

    /// Starts an application doing `work`, and waits for its first verified step.
    pub fn app(&mut self, name: &str, work: &Work) -> App {
        self.app_holding(name, work, None)
    }

    /// [`Host::app`] holding a connection to the unix socket `socket` open.
    pub fn app_holding(&mut self, name: &str, work: &Work, socket: Option<&Path>) -> App {
        let log = self.path(&format!("{name}.log"));
        let argv = self.app_command(work, &log, socket);
        let pid = self.spawn(&argv);
        let app = App { pid, log };
        started(&app);
        app
    }

    /// `n` applications doing `work` under one plain root, each with its own data (seeds
    /// differ); waits for each one's first verified step.
    pub fn tree(&mut self, name: &str, n: usize, work: &Work) -> Tree {
        let logs: Vec<PathBuf> = (0..n)
            .map(|i| self.path(&format!("{name}.{i}.log")))
            .collect();
        let script: Vec<String> = logs
            .iter()
            .enumerate()
            .map(|(i, log)| {
                let w = Work {
                    seed: work.seed + i as u64,
                    ..*work
                };
                let argv: Vec<String> = self
                    .app_command(&w, log, None)
                    .iter()
                    .map(|a| format!("'{a}'"))
                    .collect();
                format!("{} &", argv.join(" "))
            })
            .collect();
        let argv = [
            "sh".to_owned(),
            "-c".to_owned(),
            format!("{} wait", script.join(" ")),
        ];
        let root = self.spawn(&argv);
        let apps = logs
            .into_iter()
            .map(|log| {
                let mut app = App { pid: 0, log };
                started(&app);
                app.pid = logged_pid(&app);
                app
            })
            .collect();
        Tree { root, apps }
    }

    /// Runs cuda-checkpoint-ctl on this machine.
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_command(args)
            .output()
            .expect("run cuda-checkpoint-ctl")
    }

    fn ctl_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(artifact("cuda-checkpoint-ctl"));
        c.args(args)
            .envs(self.env())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// `cuda-checkpoint-ctl ARGS --json`, parsed.
    pub fn ctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.ctl(&a);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "bad JSON from {args:?} ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// The driver's state of `pid`, or "no answer" when it gives none within 20 s (the driver
    /// waits as long as the process cannot run: docs/driver-facts.md, F11).
    pub fn state(&self, pid: i32) -> String {
        let child = self
            .ctl_command(&["--get-state", "--pid", &pid.to_string()])
            .spawn()
            .expect("start cuda-checkpoint-ctl");
        match finish_within(child, Duration::from_secs(20)) {
            Some(out) => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            None => "no answer".into(),
        }
    }

    /// GPUs as NVML sees them: (uuid, used bytes).
    pub fn gpus(&self) -> Vec<(String, u64)> {
        let v = self.ctl_json(&["--gpus"]);
        let gpus = v["gpus"].as_array().unwrap_or_else(|| {
            panic!("NVML reports no GPU on this machine ({v}): is the driver loaded?")
        });
        gpus.iter()
            .map(|g| {
                (
                    g["uuid"].as_str().unwrap().to_owned(),
                    g["memory_used"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    pub fn gpu_uuids(&self) -> Vec<String> {
        self.gpus().into_iter().map(|(u, _)| u).collect()
    }

    /// Device memory `pid` holds on all GPUs, in bytes, as NVML tells it (a checkpointed
    /// process holds none: NVML lists it on no GPU). A process's own, not the GPUs' totals: on
    /// a GPU machine the scenarios run side by side on the same GPUs.
    pub fn gpu_memory_of(&self, pid: i32) -> u64 {
        let v = self.ctl_json(&["--gpus"]);
        v["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["pid"].as_i64() == Some(pid.into()))
            .filter_map(|p| p["memory"].as_u64())
            .sum()
    }

    /// The application is running (its state, as the driver says) and goes on checking its
    /// data, every word of it.
    pub fn runs_with_its_data(&self, app: &App) {
        assert!(
            wait_until(Duration::from_secs(20), || self.state(app.pid) == "running"),
            "state {}",
            self.state(app.pid)
        );
        // Three more steps, each reading all of its data back: a minute, for a loaded machine
        // and a 4 GiB application.
        let start = app.steps();
        assert!(
            wait_until(Duration::from_secs(60), || app.steps() >= start + 3),
            "{}",
            app.tail()
        );
        app.assert_healthy();
    }

    /// Remembers a pid to kill at the end (a restored process).
    pub fn own(&mut self, pid: i32) {
        self.adopt(pid);
    }
}

impl Machine for Host {
    fn env(&self) -> Vec<(String, String)> {
        match self {
            Host::Sim(s) => s.env(),
            Host::Nvidia(n) => n.env(),
        }
    }
    fn scratch(&self) -> &Path {
        match self {
            Host::Sim(s) => s.scratch(),
            Host::Nvidia(n) => n.scratch(),
        }
    }
}

/// Waits for an application's first verified step (a GPU application may need a while to
/// create its context and fill its memory).
fn started(app: &App) {
    assert!(
        wait_until(Duration::from_secs(60), || app.steps() >= 1),
        "{} did not start: {}",
        app.log.display(),
        app.tail()
    );
}

/// The pid an application logged (`pid=P` on its step lines).
fn logged_pid(app: &App) -> i32 {
    app.lines()
        .iter()
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("pid="))
                .and_then(|p| p.parse().ok())
        })
        .unwrap_or_else(|| panic!("no pid= in {}", app.log.display()))
}

/// (start, end) of each `op` action in the simulated driver's trace (`CUDA_SIM_TRACE`).
pub fn action_spans(trace: &Path, op: &str) -> Vec<(u64, u64)> {
    let field = |l: &str, k: &str| -> u64 {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    crate::read_lines(trace)
        .iter()
        .filter(|l| l.contains(&format!("op={op} ")))
        .map(|l| (field(l, "start_ns="), field(l, "end_ns=")))
        .collect()
}
