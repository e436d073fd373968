//! Holding a process so that its threads cannot run, as operators and tools do: a debugger's
//! ptrace stop (`ptrace-hold`), a frozen cgroup (the v1 freezer, v2 `cgroup.freeze`). Each hold
//! ends when its guard is dropped, also when a test fails.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::{artifact, finish_within, wait_until};

/// A tracer holding threads of a process in a ptrace stop until dropped.
pub struct Tracer {
    child: Option<Child>,
    /// The tracer's pid, which `/proc/PID/status` shows as `TracerPid`.
    pub pid: i32,
}

impl Tracer {
    /// Holds every thread of `pid` (as gdb does), or those `which` names (`["--only", TID]`,
    /// `["--except", TID]`); returns once they are stopped.
    pub fn hold(pid: i32, which: &[&str]) -> Tracer {
        let mut child = Command::new(artifact("ptrace-hold"))
            .arg(pid.to_string())
            .args(which)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start ptrace-hold");
        let out = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
        let tracer = Tracer {
            pid: child.id() as i32,
            child: Some(child),
        };
        assert_eq!(
            line.trim(),
            "held",
            "ptrace-hold {pid} {which:?} did not hold"
        );
        tracer
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take()); // ptrace-hold detaches and exits
            let _ = finish_within(child, Duration::from_secs(5));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freezer {
    /// cgroup v1's freezer controller (`freezer.state`).
    V1,
    /// cgroup v2's `cgroup.freeze`.
    V2,
}

impl Freezer {
    /// Where this machine mounts the hierarchy, if it has it.
    pub fn root(self) -> Option<PathBuf> {
        let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
        mounts.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut right = right.split(' ');
            let (fs_type, _source, options) = (right.next()?, right.next()?, right.next()?);
            let point = left.split(' ').nth(4)?;
            let ours = match self {
                Freezer::V1 => fs_type == "cgroup" && options.split(',').any(|o| o == "freezer"),
                Freezer::V2 => fs_type == "cgroup2",
            };
            ours.then(|| PathBuf::from(point))
        })
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A cgroup of our own, frozen with a process in it; thawed and removed on drop.
pub struct Frozen {
    pub dir: PathBuf,
    root: PathBuf,
    freezer: Freezer,
}

impl Frozen {
    /// Moves `pid` into a new cgroup of `freezer`'s hierarchy and freezes it.
    pub fn freeze(pid: i32, freezer: Freezer) -> Frozen {
        let root = freezer
            .root()
            .unwrap_or_else(|| panic!("no {freezer:?} cgroup hierarchy is mounted"));
        let dir = root.join(format!(
            "gpu-ckpt-held-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let frozen = Frozen { dir, root, freezer };
        fs::write(frozen.dir.join("cgroup.procs"), pid.to_string()).unwrap();
        frozen.set(true);
        assert!(
            wait_until(Duration::from_secs(10), || frozen.is_frozen()),
            "{} did not freeze",
            frozen.dir.display()
        );
        frozen
    }

    fn set(&self, frozen: bool) {
        let (file, value) = match (self.freezer, frozen) {
            (Freezer::V1, true) => ("freezer.state", "FROZEN"),
            (Freezer::V1, false) => ("freezer.state", "THAWED"),
            (Freezer::V2, true) => ("cgroup.freeze", "1"),
            (Freezer::V2, false) => ("cgroup.freeze", "0"),
        };
        let _ = fs::write(self.dir.join(file), value);
    }

    fn is_frozen(&self) -> bool {
        let read = |f: &str| fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        match self.freezer {
            Freezer::V1 => read("freezer.state").trim() == "FROZEN",
            Freezer::V2 => read("cgroup.events").lines().any(|l| l == "frozen 1"),
        }
    }

    /// The command that thaws it, as an operator would type it.
    pub fn thaw_command(&self) -> String {
        match self.freezer {
            Freezer::V1 => format!("echo THAWED > {}", self.dir.join("freezer.state").display()),
            Freezer::V2 => format!("echo 0 > {}", self.dir.join("cgroup.freeze").display()),
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.set(false);
        let procs = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = fs::write(self.root.join("cgroup.procs"), pid);
        }
        let dir: &Path = &self.dir;
        let _ = wait_until(Duration::from_secs(5), || fs::remove_dir(dir).is_ok());
    }
}
