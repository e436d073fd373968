//! The kill sweep's parts: a workload (a CUDA process, a tree of three, a job with TCP
//! connections, a process beside an io_uring loop) dumped and restored by `criu-gpu` with the
//! real CRIU, CRIU SIGKILLed at a chosen instant (CRIU_KILL_AT, the project's CRIU: it kills
//! itself after a log line or a time, patch 0011), and what each kill left: the workload running
//! its own code with its data, or not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::criu::Criu;
use crate::job::{start_job_with, text, Job};
use crate::uring::{start_tree, Tree};
use crate::*;

/// What is dumped.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// One CUDA process holding 8 MiB.
    Cuda,
    /// A CUDA process with two CUDA children, each with the driver's helper thread, each holding
    /// 8 MiB.
    Tree,
    /// A job of two ranks under a parent, with its store and ring TCP connections.
    Job,
    /// A CUDA process beside an event loop holding io_uring rings.
    Uring,
}

/// A workload on its own simulated GPU.
pub struct Workload {
    pub kind: Kind,
    pub sim: Sim,
    pub criu: Criu,
    pub root: i32,
    /// Every process, as started (a restore brings the same pids back).
    pub pids: Vec<i32>,
    /// Every GPU process's log: each step checks the process's data.
    apps: Vec<App>,
    uring: Option<Tree>,
    /// Each process's descriptors before any dump: a dump must leave none behind.
    fds: Vec<BTreeMap<String, usize>>,
    /// Lines of each GPU log (in `logs()` order) written before the processes now running:
    /// errors there are the ended processes' own.
    judged: Vec<usize>,
}

/// Pause between steps: a few steps fit in a check of each kill.
const STEP_MS: u32 = 20;

/// A dump or restore of these small workloads takes about a second, several under load.
const CRIU_GPU_LIMIT: Duration = Duration::from_secs(180);

/// Each running criu's pid, state and the wait channel it sleeps in.
fn criu_states() -> String {
    let mut states = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let dir = e.path();
        if std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim() == "criu") {
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            let wchan = std::fs::read_to_string(dir.join("wchan")).unwrap_or_default();
            states.push(format!(
                "{} ({wchan})",
                stat.split(' ').take(5).collect::<Vec<_>>().join(" ")
            ));
        }
    }
    states.join(", ")
}

impl Workload {
    pub fn start(kind: Kind) -> Workload {
        let mut sim = Sim::with(SimSpec {
            gpus: 2,
            ..SimSpec::default()
        });
        let criu = Criu::new(&sim);
        let step = STEP_MS.to_string();
        let (root, apps, uring) = match kind {
            Kind::Cuda => {
                let app = sim.app("cuda", &["--mib", "8", "--interval-ms", &step]);
                (app.pid, vec![app], None)
            }
            Kind::Tree => {
                let args = ["--children", "2", "--mib", "8", "--interval-ms", &step];
                let app = sim.app("tree", &args);
                let kids = (0..2).map(|i| App {
                    pid: 0,
                    log: app.log.with_extension(format!("log.gpu{i}")),
                });
                let mut apps: Vec<App> = kids.collect();
                for a in &apps {
                    assert!(wait_until(Duration::from_secs(20), || a.steps() >= 2));
                }
                let root = app.pid;
                apps.push(app);
                (root, apps, None)
            }
            Kind::Job => {
                let more = ["--interval-ms", &step];
                let Job { root, ranks, .. } =
                    start_job_with(&mut sim, None, 2, &NCCL_SOCKETS_ONLY, &more);
                (root, ranks, None)
            }
            Kind::Uring => {
                let t = start_tree(&mut sim, "", STEP_MS);
                (t.app.pid, Vec::new(), Some(t))
            }
        };
        let pids = process_facts::process::tree(root);
        let fds = pids.iter().map(|p| fds_of(*p)).collect();
        Workload {
            kind,
            sim,
            criu,
            root,
            pids,
            apps,
            uring,
            fds,
            judged: Vec::new(),
        }
    }

    /// Lines the workload's GPU processes (and the io_uring loop) have logged so far.
    pub fn lines_logged(&self) -> usize {
        self.logs().map(|a| a.lines().len()).sum()
    }

    /// The processes now running are restored ones: what the ended ones logged (a process that
    /// a CRIU killed while it ended the tree did not reach, meeting its connections in repair
    /// mode) is not held against them.
    pub fn judge_from_now(&mut self) {
        self.judged = self.logs().map(|a| a.lines().len()).collect();
    }

    fn logs(&self) -> impl Iterator<Item = &App> {
        self.apps.iter().chain(self.uring.as_ref().map(|t| &t.app))
    }

    /// `criu-gpu -v dump ROOT IMAGES [--leave-running]` (CRIU at -v4, whose lines the instants
    /// are found by), CRIU killing itself at `kill_at`.
    pub fn dump(&self, images: &Path, leave_running: bool, kill_at: Option<&str>) -> Output {
        let _ = std::fs::remove_dir_all(images);
        let root = self.root.to_string();
        let mut args = vec!["-v", "dump", &root, images.to_str().unwrap()];
        if leave_running {
            args.push("--leave-running");
        }
        self.criu_gpu(&args, kill_at)
    }

    /// `criu-gpu restore IMAGES --work-dir WORK` (restore_work), CRIU killing itself at
    /// `kill_at`.
    pub fn restore(&self, images: &Path, kill_at: Option<&str>) -> Output {
        let work = self.restore_work();
        let _ = std::fs::remove_dir_all(&work);
        let w = work.to_str().unwrap();
        let args = ["-v", "restore", images.to_str().unwrap(), "--work-dir", w];
        self.criu_gpu(&args, kill_at)
    }

    /// `criu-gpu ARGS`, CRIU killing itself at `kill_at`, for at most `CRIU_GPU_LIMIT`. Its
    /// output goes to a file, not a pipe: a CRIU that outlived criu-gpu (a defect this sweep is
    /// there to find) cannot hold the test up by holding the pipe open.
    fn criu_gpu(&self, args: &[&str], kill_at: Option<&str>) -> Output {
        let out_path = self.sim.dir.join("criu-gpu.out");
        let out_file = std::fs::File::create(&out_path).unwrap();
        let mut cmd = Command::new(artifact("criu-gpu"));
        crate::job::criu_gpu_args(&mut cmd, &self.sim, &self.criu, args, &[], &[]);
        cmd.stdin(Stdio::null())
            .stdout(out_file.try_clone().unwrap())
            .stderr(out_file);
        if let Some(k) = kill_at {
            cmd.env("CRIU_KILL_AT", k);
        }
        let mut child = cmd.spawn().unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > CRIU_GPU_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "criu-gpu {args:?} (CRIU_KILL_AT={kill_at:?}) ran past {} s; criu: {}",
                    CRIU_GPU_LIMIT.as_secs(),
                    criu_states()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let output = std::fs::read(&out_path).unwrap_or_default();
        eprintln!("criu-gpu {args:?}:\n{}", String::from_utf8_lossy(&output));
        Output {
            status,
            stdout: output,
            stderr: Vec::new(),
        }
    }

    /// Where a restore writes its log and records (never into the images).
    pub fn restore_work(&self) -> PathBuf {
        self.sim.dir.join("restore-work")
    }

    /// Every process runs its own code with its data: each is alive and holds the descriptors
    /// it had, each GPU process verifies two more steps (its data and its GPU state are back),
    /// the io_uring loop serves.
    pub fn lives(&self) -> Result<(), String> {
        for p in &self.pids {
            if !pid_alive(*p) {
                let tails: Vec<String> = self.logs().map(App::tail).collect();
                return Err(format!("process {p} is gone; the logs end: {tails:?}"));
            }
        }
        // Two more verified steps of each GPU process, waited for together.
        let start: Vec<usize> = self.logs().map(App::steps).collect();
        let advanced = || self.logs().zip(&start).all(|(a, s)| a.steps() >= s + 2);
        if !wait_until(Duration::from_secs(20), advanced) {
            let stopped = self.logs().zip(&start).find(|(a, s)| a.steps() < *s + 2);
            if let Some((a, _)) = stopped {
                return Err(format!("{} stopped: {}", a.log.display(), a.tail()));
            }
        }
        for (i, a) in self.logs().enumerate() {
            let judged = self.judged.get(i).copied().unwrap_or(0);
            if let Some(bad) = a
                .lines()
                .into_iter()
                .skip(judged)
                .find(|l| l.starts_with("MISMATCH") || l.starts_with("ERROR"))
            {
                return Err(format!("{}: {bad}", a.log.display()));
            }
        }
        if let Some(t) = self.uring.as_ref().filter(|t| !t.serves()) {
            return Err(format!("the io_uring loop: {}", t.ask("state")));
        }
        // Now that each runs its own code (a parasite that outlived CRIU has ended). A
        // connection the io_uring loop just served is closed a moment after its answer: a
        // descriptor left behind stays, that one goes.
        for (p, before) in self.pids.iter().zip(&self.fds) {
            let extra = || -> Vec<String> {
                fds_of(*p)
                    .into_iter()
                    .filter(|(k, n)| before.get(k).copied().unwrap_or(0) < *n)
                    .map(|(k, _)| k)
                    .collect()
            };
            if !wait_until(Duration::from_secs(5), || extra().is_empty()) {
                return Err(format!(
                    "process {p} holds descriptors it did not: {:?}",
                    extra()
                ));
            }
        }
        Ok(())
    }

    /// Processes of the workload that are alive (not zombies).
    pub fn alive(&self) -> Vec<i32> {
        self.pids
            .iter()
            .copied()
            .filter(|p| pid_alive(*p))
            .collect()
    }

    /// Kills whatever is left of the workload and waits until its pids are free.
    pub fn kill_all(&self) {
        for p in self.alive() {
            signal(p, nix::sys::signal::Signal::SIGKILL);
        }
        for p in &self.pids {
            wait_gone(*p);
        }
    }

    /// Mappings of CRIU's parasite (and descriptors of its memfd, when CRIU was killed between
    /// the two calls that map it) left in the workload's processes.
    pub fn parasite_leftovers(&self) -> usize {
        let in_fds = |p: i32| {
            std::fs::read_dir(format!("/proc/{p}/fd"))
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| std::fs::read_link(e.path()).ok())
                        .filter(|t| t.to_string_lossy().contains("CRIUMFD"))
                        .count()
                })
                .unwrap_or(0)
        };
        self.alive()
            .iter()
            .map(|p| {
                std::fs::read_to_string(format!("/proc/{p}/maps"))
                    .unwrap_or_default()
                    .matches("CRIUMFD")
                    .count()
                    + in_fds(*p)
            })
            .sum()
    }
}

/// A process's descriptors, counted by kind (a socket or a pipe without its inode, a file's
/// path), but the files it appends its own log lines to (open for a moment at each step). Not
/// by number: the simulated driver connects again when its GPU state is back, at the lowest
/// number free then.
fn fds_of(pid: i32) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return kinds;
    };
    for e in dir.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let target = target.display().to_string();
        let own_log = target.contains("/gpu-ckpt-")
            && !target.ends_with("dump.log")
            && !target.ends_with("restore.log");
        // The parasite's memfd: counted with its mapping (parasite_leftovers).
        if !own_log && !target.contains("CRIUMFD") {
            let kind = target.split(":[").next().unwrap_or_default().to_owned();
            *kinds.entry(kind).or_default() += 1;
        }
    }
    kinds
}

/// CRIU's log of a run into `images`.
pub fn log_of(images: &Path, name: &str) -> String {
    std::fs::read_to_string(images.join(name)).unwrap_or_default()
}

/// Whether CRIU was killed: criu-gpu reports a criu ended by signal 9.
pub fn was_killed(out: &Output) -> bool {
    !out.status.success() && text(out).contains("signal 9")
}

/// CRIU had begun to end the dumped tasks (the dump's last step: the images are complete, and
/// from its "Dumped tasks now die with criu" the kernel kills them if CRIU dies; patch 0010).
pub fn dump_committed(images: &Path) -> bool {
    log_of(images, "dump.log").lines().any(|l| {
        l.contains("Dumped tasks now die with criu")
            || (l.contains("Unseizing") && l.ends_with("into 2"))
    })
}

/// The instants to kill at: the `nth` of CRIU's own lines of the log that contain each stage's
/// text, for a few of its occurrences (the first, one in the middle, the last), each after
/// `delays` (µs). Only CRIU's own lines: CRIU_KILL_AT counts those, not the lines its restored
/// tasks and its parasite write (after a "PID: " or "pie: ").
pub fn stage_points(log: &str, stages: &[&str], delays: &[u64]) -> Vec<String> {
    let mut points = Vec::new();
    let own: Vec<&str> = log.lines().filter(|l| criu_own(l)).collect();
    for stage in stages {
        let n = own.iter().filter(|l| l.contains(stage)).count();
        let mut nth: Vec<usize> = vec![1, n.div_ceil(2), n];
        nth.dedup();
        for k in nth.into_iter().filter(|k| (1..=n).contains(k)) {
            for d in delays {
                points.push(format!("{stage}#{k}+{d}"));
            }
        }
    }
    points
}

/// Whether a line of CRIU's log is CRIU's own: "(TIME) TEXT", not "(TIME)  PID: TEXT" nor
/// "(TIME) pie: PID: TEXT".
fn criu_own(line: &str) -> bool {
    let Some(text) = line
        .strip_prefix('(')
        .and_then(|l| l.split_once(") "))
        .map(|(_, t)| t)
    else {
        return false;
    };
    let text = text.trim_start();
    let pid_said = text
        .split_once(": ")
        .is_some_and(|(head, _)| head.parse::<u32>().is_ok());
    !pid_said && !text.starts_with("pie: ")
}

/// Instants by time: `n` points spread over the run the log shows (8/10 of its last timestamp:
/// a run may be quicker).
pub fn time_points(log: &str, n: u64) -> Vec<String> {
    let end_us = log
        .lines()
        .filter_map(|l| {
            l.strip_prefix('(')?
                .split(')')
                .next()?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .fold(0.0, f64::max)
        * 1e6
        * 0.8;
    (1..=n)
        .map(|i| format!("+{}", (end_us * i as f64 / (n + 1) as f64) as u64))
        .collect()
}

/// Every `step`-th point, starting at `offset`: the sample a run takes of a long list.
pub fn sample(points: &[String], take: usize, offset: usize) -> Vec<String> {
    if points.len() <= take || take == 0 {
        return points.to_vec();
    }
    let step = points.len() as f64 / take as f64;
    (0..take)
        .map(|i| points[((i as f64 * step) as usize + offset) % points.len()].clone())
        .collect()
}

/// The image directory of a workload's dumps.
pub fn images(w: &Workload) -> PathBuf {
    w.sim.dir.join("img")
}
