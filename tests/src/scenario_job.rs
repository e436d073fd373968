//! A distributed job on either machine, for the shared scenarios: on the simulation
//! `cuda-sim-app --ranks N` with NCCL's library preloaded (so that its ranks look like NCCL's);
//! on an NVIDIA machine the PyTorch DDP job scripts/gpu/ddp-job.py over NCCL, logging in the
//! same protocol (`--ok-log`). Both keep a TCP store and connections between their ranks.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::job::{free_port, start_job, Job};
use crate::nvidia::SOURCE_ENV;
use crate::scenario::Host;
use crate::{fake_nccl, reap_in_background, wait_until, App, Machine};

/// How the job's NCCL may talk between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transports {
    /// Sockets only (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, NCCL_CUMEM_ENABLE=0): restorable.
    Sockets,
    /// NCCL's defaults (P2P, shared memory, cuMem): refused before anything is frozen.
    Defaults,
}

impl Host {
    /// Ranks a job has here: two, or one on a GPU machine with one GPU (NCCL takes one rank
    /// per GPU; the simulated job's ranks share its GPUs).
    pub fn job_ranks(&self) -> usize {
        match self {
            Host::Sim(_) => 2,
            Host::Nvidia(_) => self.gpu_uuids().len().min(2),
        }
    }

    /// Starts a job of `ranks` ranks and waits for two steps of each.
    pub fn job(&mut self, ranks: usize, transports: Transports) -> Job {
        let sockets: &[(&str, &str)] = match transports {
            Transports::Sockets => &crate::NCCL_SOCKETS_ONLY,
            Transports::Defaults => &[],
        };
        match self {
            Host::Sim(sim) => {
                let lib = fake_nccl(&sim.dir).display().to_string();
                let mut env = vec![("LD_PRELOAD", lib.as_str())];
                env.extend_from_slice(sockets);
                start_job(sim, None, ranks, &env)
            }
            Host::Nvidia(_) => self.torch_job(ranks, sockets),
        }
    }

    fn torch_job(&mut self, ranks: usize, sockets: &[(&str, &str)]) -> Job {
        let log = self.path("job.log");
        let out = self.path("job");
        let script = std::env::var(SOURCE_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
            .join("scripts/gpu/ddp-job.py");
        let child = Command::new("setsid")
            .arg("python3")
            .arg(&script)
            .args(["--spawn", &ranks.to_string()])
            .arg(&out)
            .args(["--steps", "1000000", "--sleep", "0.05", "--ballast", "0.25"])
            .args(["--port", &free_port().to_string(), "--ok-log"])
            .arg(&log)
            .envs(self.env())
            .envs(sockets.iter().copied())
            // The TCPStore on epoll: libuv's io_uring is dumped only by the project's CRIU.
            .env("USE_LIBUV", "0")
            // Never NVLink multicast on the test machines.
            .env("NCCL_NVLS_ENABLE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.path("job.err")).unwrap())
            .spawn()
            .expect("start python3 ddp-job.py");
        let root = reap_in_background(child);
        self.own(root);
        let ranks: Vec<App> = (0..ranks)
            .map(|r| App {
                pid: 0,
                log: log.with_extension(format!("log.rank{r}")),
            })
            .collect();
        for r in &ranks {
            // PyTorch's import and NCCL's set-up take a while.
            let up = wait_until(Duration::from_secs(180), || r.steps() >= 2);
            let err = std::fs::read_to_string(self.path("job.err")).unwrap_or_default();
            assert!(up, "{}: {}\n{err}", r.log.display(), r.tail());
        }
        Job {
            root,
            pids: process_facts::process::tree(root),
            ranks,
            log,
        }
    }
}
