//! A job moved between the two nodes of a bed (`netbed`) without a disk: `criu-gpu restore DIR
//! --listen PORT` on node B (`n1`), `criu-gpu dump PID DIR --to B:PORT` on node A (`n0`), the
//! real CRIU on both sides. The job runs on node A in a pid namespace of its own (the nodes share
//! the machine's pids, and A's tasks live on until B runs them) on GPU 0; node B restores it onto
//! GPU 1 (`--device-map`), as the GPU runner moves it between two GPUs of one machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use crate::cluster::{criu_gpu_on, spawn_criu_gpu, Bed};
use crate::criu::Criu;
use crate::*;

/// The receiver's port (inside the bed's namespaces: no other test sees it).
pub const PORT: u16 = 7000;

/// The bed, the simulated GPUs, CRIU and each side's image directory.
pub struct Move {
    pub bed: Bed,
    pub c: Criu,
    pub sim: Sim,
    /// Node A's directory (its logs and the images but the pages).
    pub from: PathBuf,
    /// Node B's.
    pub into: PathBuf,
}

/// A job started on node A: the pid namespace's holder (`unshare`), the job's root (pid 1
/// inside), every process of it, and its log (a job's ranks log to LOG.rankN).
pub struct Moving {
    pub holder: i32,
    pub root: i32,
    pub pids: Vec<i32>,
    pub app: App,
}

impl Move {
    /// Two nodes and two simulated GPUs of `memory` each.
    pub fn up(memory: &str) -> Move {
        let sim = Sim::with(SimSpec {
            gpus: 2,
            memory,
            ..SimSpec::default()
        });
        let bed = Bed::up(&sim.dir, 2);
        let c = Criu::new(&sim);
        Move {
            from: sim.dir.join("from"),
            into: sim.dir.join("into"),
            bed,
            c,
            sim,
        }
    }

    /// `cuda-sim-app --log LOG ARGS` on `node`, in a pid namespace of its own, once it logged a
    /// verified step (rank 0's with `--ranks`).
    pub fn start(&mut self, node: &str, name: &str, args: &[&str]) -> Moving {
        let log = self.sim.dir.join(format!("{name}.log"));
        let child = self
            .bed
            .command(node, Path::new("/usr/bin/unshare"))
            .args(["--pid", "--fork", "setsid"])
            .arg(artifact("cuda-sim-app"))
            .args(["--log", log.to_str().unwrap()])
            .args(args)
            .envs(self.sim.env())
            .envs(NCCL_SOCKETS_ONLY.map(|(k, v)| (k.to_owned(), v.to_owned())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let holder = reap_in_background(child);
        self.sim.adopt(holder);
        let ranked = args.contains(&"--ranks");
        let app = App {
            pid: 0,
            log: if ranked {
                log.with_extension("log.rank0")
            } else {
                log.clone()
            },
        };
        assert!(
            wait_until(Duration::from_secs(120), || app.steps() >= 2),
            "{name} did not start: {}",
            app.tail()
        );
        let root = process_facts::process::children(holder)[0];
        Moving {
            holder,
            root,
            pids: process_facts::process::tree(root),
            app: App { pid: root, ..app },
        }
    }

    /// `OLD=NEW` of the simulated GPUs: each of `from` onto the matching one of `to`.
    pub fn device_map(&self, pairs: &[(usize, usize)]) -> String {
        let u = self.sim.gpu_uuids();
        pairs
            .iter()
            .map(|(a, b)| format!("{}={}", u[*a], u[*b]))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `criu-gpu restore INTO --listen PORT MORE` on node B, once it listens.
    pub fn listen(&self, more: &[&str], env: &[(&str, &str)]) -> Child {
        let mut args: Vec<String> = ["restore", "--listen", &PORT.to_string()]
            .map(str::to_owned)
            .to_vec();
        args.extend(more.iter().map(|s| s.to_string()));
        args.push(self.into.display().to_string());
        let child = criu_gpu_on(&self.sim, &self.bed, &self.c, "n1", &args, &[], env);
        assert!(
            wait_until(Duration::from_secs(20), || self.listening()),
            "node B's criu-gpu does not listen on {PORT}"
        );
        child
    }

    /// Whether node B listens on [`PORT`] (read from its /proc/net/tcp: a probe connection would
    /// be taken for the sender's).
    fn listening(&self) -> bool {
        let out = self
            .bed
            .command("n1", Path::new("/bin/cat"))
            .arg("/proc/net/tcp")
            .output()
            .unwrap();
        let port = format!(":{PORT:04X} ");
        stdout(&out).lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1).is_some_and(|a| a.ends_with(port.trim())) && f.get(3) == Some(&"0A")
        })
    }

    /// `criu-gpu dump ROOT FROM --to B:PORT MORE` on node A.
    pub fn send(&self, root: i32, more: &[&str], env: &[(&str, &str)]) -> Child {
        let args = self.send_args(root, more);
        criu_gpu_on(&self.sim, &self.bed, &self.c, "n0", &args, &[], env)
    }

    /// [`Move::send`] by a criu-gpu, and so a CRIU, without CAP_SYS_RESOURCE (as in a container
    /// with Docker's default capabilities): CRIU's pipes stay at `fs.pipe-max-size` (1 MiB), so
    /// a lazy dump holds a pipe, two fds, for each MiB of the pages it has yet to send.
    pub fn send_without_sys_resource(&self, root: i32) -> Child {
        let mut setpriv = self.bed.command("n0", Path::new("/usr/bin/setpriv"));
        setpriv
            .args(["--bounding-set", "-sys_resource"])
            .arg(artifact("criu-gpu"));
        let args = self.send_args(root, &[]);
        spawn_criu_gpu(setpriv, &self.sim, &self.c, &args, &[], &[])
    }

    fn send_args(&self, root: i32, more: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "dump".into(),
            "--to".into(),
            format!("{}:{PORT}", self.bed.addr("n1")),
        ];
        args.extend(more.iter().map(|s| s.to_string()));
        args.push(root.to_string());
        args.push(self.from.display().to_string());
        args
    }

    /// Both sides' outputs (at most 3 minutes each), printed.
    pub fn outcome(&self, receiver: Child, sender: Child) -> (Output, Output) {
        let mut o = crate::cluster::outputs(vec![
            ("node A (sender)".into(), sender),
            ("node B (receiver)".into(), receiver),
        ]);
        let b = o.pop().unwrap();
        (o.pop().unwrap(), b)
    }

    /// Processes of the machine running `cuda-sim-app` with the job's log that are not the
    /// job's: what a restore left on node B.
    pub fn strangers(&self, job: &Moving) -> Vec<i32> {
        let want = job.app.log.display().to_string();
        let want = want.split(".rank").next().unwrap_or(&want).to_owned();
        process_facts::process::all_pids()
            .into_iter()
            .filter(|p| !job.pids.contains(p) && *p != job.holder)
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&want))
            })
            .filter(|p| !process_facts::process::is_zombie(*p))
            .collect()
    }

    /// GPU memory in use on simulated GPU `i`.
    pub fn used(&self, i: usize) -> u64 {
        self.sim.gpus()[i].1
    }

    /// Node B's restore progressed this far: its lazy-pages daemon logged a line with `what`.
    pub fn receiver_logged(&self, what: &str) -> bool {
        std::fs::read_to_string(self.into.join("lazy.log")).is_ok_and(|t| t.contains(what))
    }

    /// The pid of node B's `criu restore`.
    pub fn receiver_criu(&self) -> Option<i32> {
        self.receiver_running("restore")
    }

    /// The pid of node B's `criu lazy-pages` (the daemon that asks node A for the pages).
    pub fn receiver_lazy_pages(&self) -> Option<i32> {
        self.receiver_running("lazy-pages")
    }

    /// The pid of node B's `criu MODE -D INTO`.
    fn receiver_running(&self, mode: &str) -> Option<i32> {
        let dir = self.into.display().to_string();
        process_facts::process::all_pids().into_iter().find(|p| {
            let Ok(c) = std::fs::read_to_string(format!("/proc/{p}/cmdline")) else {
                return false;
            };
            let args: Vec<&str> = c.split('\0').collect();
            args.first().is_some_and(|a| a.ends_with("criu"))
                && args.get(1) == Some(&mode)
                && args.windows(2).any(|w| w == ["-D", dir.as_str()])
        })
    }

    /// `netbed link n1 up|down`: node B's cable.
    pub fn cable(&self, up: bool) {
        let out = std::process::Command::new(artifact("netbed"))
            .args(["link"])
            .arg(&self.bed.dir)
            .args(["n1", if up { "up" } else { "down" }])
            .output()
            .unwrap();
        assert!(out.status.success(), "netbed link: {}", stderr(&out));
    }
}

/// The moved root's pid on node B, as the sender said it.
pub fn landed_root(sender: &str) -> i32 {
    sender
        .lines()
        .find_map(|l| {
            l.split_once("its root is pid ")?
                .1
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no root pid in:\n{sender}"))
}

/// The fnv of `step` in a log (`step=N pid=P words=W fnv=HASH ok`).
pub fn fnv_at(log: &Path, step: u64) -> Option<String> {
    let want = format!("step={step} ");
    read_lines(log).into_iter().find_map(|l| {
        l.strip_prefix(&want)?
            .split_whitespace()
            .find_map(|w| w.strip_prefix("fnv=").map(str::to_owned))
    })
}
