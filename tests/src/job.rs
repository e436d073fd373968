//! A simulated distributed job (`cuda-sim-app --ranks N`) and `criu-gpu` run against it: what the
//! job tests share.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::criu::Criu;
use crate::*;

/// A free TCP port of this host.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("[::]:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A job of `n` ranks, started as `program ARGS` (cuda-sim-app, or a launcher in front of it).
pub struct Job {
    pub root: i32,
    /// Every process of the tree, as started.
    pub pids: Vec<i32>,
    pub ranks: Vec<App>,
    /// The log's path; rank r logs to LOG.rankR.
    pub log: PathBuf,
}

pub fn start_job(sim: &mut Sim, launcher: Option<&Path>, n: usize, extra: &[(&str, &str)]) -> Job {
    start_job_with(sim, launcher, n, extra, &["--interval-ms", "50"])
}

/// [`start_job`] with more arguments of cuda-sim-app (`--interval-ms` among them).
pub fn start_job_with(
    sim: &mut Sim,
    launcher: Option<&Path>,
    n: usize,
    extra: &[(&str, &str)],
    more: &[&str],
) -> Job {
    let log = sim.dir.join("job.log");
    let app = artifact("cuda-sim-app");
    let port = free_port().to_string();
    let ns = n.to_string();
    let args = [
        "--log",
        log.to_str().unwrap(),
        "--ranks",
        &ns,
        "--mib",
        "8",
        "--shm-mib",
        "8",
        "--store-port",
        &port,
    ];
    let mut cmd = match launcher {
        Some(l) => {
            let mut c = setsid_command(l);
            c.arg(&app);
            c
        }
        None => setsid_command(&app),
    };
    let child = cmd
        .args(args)
        .args(more)
        .envs(sim.env())
        .envs(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let root = reap_in_background(child);
    sim.adopt(root);
    let ranks: Vec<App> = (0..n)
        .map(|r| App {
            pid: 0,
            log: log.with_extension(format!("log.rank{r}")),
        })
        .collect();
    for r in &ranks {
        assert!(
            wait_until(Duration::from_secs(20), || r.steps() >= 2),
            "{}",
            r.tail()
        );
    }
    let pids = process_facts::process::tree(root);
    Job {
        root,
        pids,
        ranks,
        log,
    }
}

impl Job {
    /// `criu-gpu dump ROOT IMAGES` with `env` added.
    pub fn dump(
        &self,
        sim: &impl Machine,
        c: &Criu,
        images: &Path,
        env: &[(&str, &str)],
    ) -> Output {
        let root = self.root.to_string();
        criu_gpu(sim, c, &["dump", &root, images.to_str().unwrap()], env)
    }

    /// Waits until no process of the job is left (dumped and killed, or killed by a restore).
    pub fn gone(&self) {
        for p in &self.pids {
            wait_gone(*p);
        }
    }

    pub fn advances(&self, n: usize) {
        for r in &self.ranks {
            assert!(r.advances(n), "{}", r.tail());
            r.assert_healthy();
        }
    }
}

/// `criu-gpu ARGS -- --lib PLUGINS` with the machine's environment.
pub fn criu_gpu(sim: &impl Machine, c: &Criu, args: &[&str], env: &[(&str, &str)]) -> Output {
    criu_gpu_with(sim, c, args, &[], env)
}

/// `criu-gpu ARGS -- --lib PLUGINS CRIU_ARGS`: more options for criu itself.
pub fn criu_gpu_with(
    sim: &impl Machine,
    c: &Criu,
    args: &[&str],
    criu_args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut cmd = std::process::Command::new(artifact("criu-gpu"));
    criu_gpu_args(&mut cmd, sim, c, args, criu_args, env);
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    eprintln!("criu-gpu {args:?}:\n{}{}", stdout(&out), stderr(&out));
    out
}

/// `criu-gpu`'s arguments and environment: `ARGS --criu CRIU -- --lib PLUGINS CRIU_ARGS`, the
/// machine's environment (the plugin's libraries its own, not the test's LD_LIBRARY_PATH).
pub fn criu_gpu_args<S: AsRef<std::ffi::OsStr>>(
    cmd: &mut std::process::Command,
    sim: &impl Machine,
    c: &Criu,
    args: &[S],
    criu_args: &[&str],
    env: &[(&str, &str)],
) {
    cmd.args(args)
        .args(["--criu", c.bin.to_str().unwrap(), "--", "--lib"])
        .arg(&c.plugins)
        .args(criu_args)
        .envs(sim.env())
        .env_remove("LD_LIBRARY_PATH")
        .envs(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
}

pub fn text(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

pub fn dir_of(sim: &Sim, name: &str) -> PathBuf {
    sim.dir.join(name)
}
