//! Two nodes on one machine (`netbed`: network and UTS namespaces on a bridge of their own), a
//! real etcd on a third, a simulated job with one rank per node talking over TCP between them,
//! and `criu-gpu` run inside each node as a node's agent would run it. The nodes share only the
//! network, etcd and the simulated GPU daemon (its two GPUs split: node 0 uses GPU 0, node 1
//! GPU 1; the daemon is where collectives meet, as the network is for NCCL).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::criu::Criu;
use crate::*;

/// The bed: its nodes' names and addresses.
pub struct Bed {
    pub dir: PathBuf,
    /// (name, address) of each node: the job's, the spare ones, and last etcd's host.
    pub nodes: Vec<(String, String)>,
    pub subnet: u8,
    /// How many of `nodes` run the job (`n0`..).
    pub job_nodes: usize,
}

impl Bed {
    /// Nodes `n0`.. `nN-1` at 10.S.0.1.., and `etcd` at 10.S.0.254 (S from the pid: the
    /// addresses live only in the bed's namespaces).
    pub fn up(scratch: &Path, n: usize) -> Bed {
        Bed::with_spares(scratch, n, 0)
    }

    /// Also `spares` nodes that run nothing at first, `m0`.. at 10.S.0.101..: where a part is
    /// restored on another address (a pod rescheduled onto another host).
    pub fn with_spares(scratch: &Path, n: usize, spares: usize) -> Bed {
        let subnet = (std::process::id() % 200) as u8 + 20;
        let dir = scratch.join("bed");
        let mut nodes: Vec<(String, String)> = (0..n)
            .map(|i| (format!("n{i}"), format!("10.{subnet}.0.{}", i + 1)))
            .collect();
        nodes.extend((0..spares).map(|i| (format!("m{i}"), format!("10.{subnet}.0.{}", i + 101))));
        nodes.push(("etcd".into(), format!("10.{subnet}.0.254")));
        let specs: Vec<String> = nodes.iter().map(|(n, a)| format!("{n}={a}/24")).collect();
        let out = Command::new(artifact("netbed"))
            .arg("up")
            .arg(&dir)
            .args(&specs)
            .output()
            .unwrap();
        assert!(out.status.success(), "netbed up: {}", stderr(&out));
        Bed {
            dir,
            nodes,
            subnet,
            job_nodes: n,
        }
    }

    pub fn addr(&self, node: &str) -> &str {
        &self.nodes.iter().find(|(n, _)| n == node).unwrap().1
    }

    /// `PROGRAM ARGS` inside `node`.
    pub fn command(&self, node: &str, program: &Path) -> Command {
        let mut c = Command::new(artifact("netbed"));
        c.arg("exec")
            .arg(&self.dir)
            .arg(node)
            .arg("--")
            .arg(program);
        c
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = Command::new(artifact("netbed"))
            .arg("down")
            .arg(&self.dir)
            .status();
    }
}

/// A real etcd on the bed's `etcd` node.
pub struct Etcd {
    child: Option<Child>,
    pub endpoint: String,
}

impl Etcd {
    pub fn start(bed: &Bed, scratch: &Path) -> Etcd {
        let ip = bed.addr("etcd").to_owned();
        let data = scratch.join("etcd-data");
        let url = format!("http://{ip}:2379");
        let child = bed
            .command("etcd", Path::new("/usr/bin/etcd"))
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &format!("http://{ip}:2380")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(scratch.join("etcd.log")).unwrap())
            .spawn()
            .expect("etcd (Debian's etcd-server; scripts/install.sh installs it)");
        let e = Etcd {
            child: Some(child),
            endpoint: format!("{ip}:2379"),
        };
        let probe = format!("echo > /dev/tcp/{ip}/2379");
        let health = || {
            bed.command("n0", Path::new("/bin/bash"))
                .args(["-c", &probe])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        assert!(
            wait_until(Duration::from_secs(20), health),
            "etcd did not come up"
        );
        e
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One node's part of a job: its root (the launcher) and its rank's log.
pub struct NodeJob {
    pub node: String,
    pub root: i32,
    pub pids: Vec<i32>,
    pub rank: App,
}

/// The job: one rank per node, node 0's store at its address (in `more`, `{node}` is the node's
/// name and `{dir}` the scratch directory).
pub fn start_job(sim: &mut Sim, bed: &Bed, more: &[&str]) -> Vec<NodeJob> {
    start_job_wrapped(sim, bed, more, |_| Vec::new())
}

/// The same, each node's launcher started through `wrap(rank)` (a program and its arguments
/// that end by exec'ing the rest of their command line; empty: none).
pub fn start_job_wrapped(
    sim: &mut Sim,
    bed: &Bed,
    more: &[&str],
    wrap: impl Fn(usize) -> Vec<String>,
) -> Vec<NodeJob> {
    let n = bed.job_nodes;
    let master = format!("{}:{}", bed.addr("n0"), 29400 + bed.subnet as u16);
    let mut parts = Vec::new();
    for r in 0..n {
        let node = format!("n{r}");
        let log = sim.dir.join(format!("job-{node}.log"));
        let (nn, rr) = (n.to_string(), r.to_string());
        let child = bed
            .command(&node, Path::new("/usr/bin/setsid"))
            .args(wrap(r))
            .arg(artifact("cuda-sim-app"))
            .args(["--log", log.to_str().unwrap(), "--ranks", "1", "--mib", "8"])
            .args(["--shm-mib", "4", "--nnodes", &nn, "--node-rank", &rr])
            .args(["--master", &master, "--device", &rr, "--interval-ms", "50"])
            .args(more.iter().map(|a| {
                a.replace("{node}", &node)
                    .replace("{dir}", &sim.dir.display().to_string())
            }))
            .envs(sim.env())
            .envs(
                NCCL_SOCKETS_ONLY
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let root = reap_in_background(child);
        sim.adopt(root);
        parts.push(NodeJob {
            node,
            root,
            pids: Vec::new(),
            rank: App {
                pid: 0,
                log: log.with_extension("log.rank0"),
            },
        });
    }
    for p in &mut parts {
        let r = &p.rank;
        assert!(
            wait_until(Duration::from_secs(30), || r.steps() >= 2),
            "{}",
            r.tail()
        );
        p.pids = process_facts::process::tree(p.root);
    }
    parts
}

/// `criu-gpu ARGS` inside `node`, started (all nodes run theirs at once).
pub fn criu_gpu_on(
    sim: &Sim,
    bed: &Bed,
    c: &Criu,
    node: &str,
    args: &[String],
    criu_args: &[&str],
    env: &[(&str, &str)],
) -> Child {
    spawn_criu_gpu(
        bed.command(node, &artifact("criu-gpu")),
        sim,
        c,
        args,
        criu_args,
        env,
    )
}

/// `criu-gpu ARGS` as `cmd` runs it (criu-gpu itself inside a node, or a program that execs it
/// there), with this CRIU and the simulated GPU, started.
pub fn spawn_criu_gpu(
    mut cmd: Command,
    sim: &Sim,
    c: &Criu,
    args: &[String],
    criu_args: &[&str],
    env: &[(&str, &str)],
) -> Child {
    crate::job::criu_gpu_args(&mut cmd, sim, c, args, criu_args, env);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for each node's `criu-gpu` (at most 3 minutes) and prints what it said.
pub fn outputs(children: Vec<(String, Child)>) -> Vec<Output> {
    children
        .into_iter()
        .map(|(node, c)| {
            let out = finish_within(c, Duration::from_secs(180)).expect("criu-gpu ended");
            eprintln!("criu-gpu on {node}:\n{}{}", stdout(&out), stderr(&out));
            out
        })
        .collect()
}

/// The rendezvous argument of job `name`.
pub fn rdzv(etcd: &Etcd, name: &str) -> String {
    format!("etcd://{}/{name}", etcd.endpoint)
}

/// Two nodes, etcd and a job of one rank per node, ready to be dumped and restored: what the
/// tests across machines share.
pub struct Scene {
    pub job: Vec<NodeJob>,
    pub etcd: Etcd,
    pub bed: Bed,
    pub c: Criu,
    pub sim: Sim,
    pub rdzv: String,
    /// Each node's image directory.
    pub dirs: Vec<PathBuf>,
}

impl Scene {
    /// The bed, etcd and the job (`more`: the job's options) on a simulated GPU of two GPUs.
    pub fn up(more: &[&str]) -> Scene {
        let mut sim = Sim::with(SimSpec {
            gpus: 2,
            ..SimSpec::default()
        });
        let bed = Bed::up(&sim.dir, 2);
        let etcd = Etcd::start(&bed, &sim.dir);
        let c = Criu::new(&sim);
        let job = start_job(&mut sim, &bed, more);
        let rdzv = rdzv(&etcd, "train");
        let dirs = (0..2).map(|r| sim.dir.join(format!("part{r}"))).collect();
        Scene {
            job,
            etcd,
            bed,
            c,
            sim,
            rdzv,
            dirs,
        }
    }

    /// `criu-gpu dump --nnodes 2 --node-rank R ...` started on every node; `more[r]`: node r's
    /// further options, `criu[r]` its CRIU options, `env[r]` its further environment.
    pub fn dumps(
        &self,
        more: &[&[&str]],
        criu: &[&[&str]],
        env: &[&[(&str, &str)]],
    ) -> Vec<(String, Child)> {
        self.job
            .iter()
            .enumerate()
            .map(|(r, p)| {
                let mut args: Vec<String> = ["dump", "--nnodes", "2", "--node-rank"]
                    .map(str::to_owned)
                    .to_vec();
                args.push(r.to_string());
                args.extend(self.rdzv_args());
                args.extend(
                    more.get(r)
                        .unwrap_or(&&[][..])
                        .iter()
                        .map(|s| s.to_string()),
                );
                args.push(p.root.to_string());
                args.push(self.dirs[r].display().to_string());
                let criu = criu.get(r).copied().unwrap_or(&[]);
                let env = env.get(r).copied().unwrap_or(&[]);
                let child = criu_gpu_on(&self.sim, &self.bed, &self.c, &p.node, &args, criu, env);
                (p.node.clone(), child)
            })
            .collect()
    }

    /// `criu-gpu restore --nnodes 2 ...` started on every node (as `dumps`).
    pub fn restores(&self, more: &[&[&str]], criu: &[&[&str]]) -> Vec<(String, Child)> {
        (0..self.job.len())
            .map(|r| {
                let more = more.get(r).copied().unwrap_or(&[]);
                self.restore_on(r, more, criu.get(r).copied().unwrap_or(&[]))
            })
            .collect()
    }

    /// `criu-gpu restore --nnodes 2 ... DIR` started on node `r` alone, of its part in `dirs[r]`.
    pub fn restore_on(&self, r: usize, more: &[&str], criu: &[&str]) -> (String, Child) {
        let node = &self.job[r].node;
        let mut args: Vec<String> = ["restore", "--nnodes", "2"].map(str::to_owned).to_vec();
        args.extend(self.rdzv_args());
        args.extend(more.iter().map(|s| s.to_string()));
        args.extend([
            "--work-dir".into(),
            work_dir(&self.dirs[r]).display().to_string(),
        ]);
        args.push(self.dirs[r].display().to_string());
        let child = criu_gpu_on(&self.sim, &self.bed, &self.c, node, &args, criu, &[]);
        (node.clone(), child)
    }

    fn rdzv_args(&self) -> Vec<String> {
        vec![
            "--rdzv".into(),
            self.rdzv.clone(),
            "--rdzv-timeout".into(),
            "60".into(),
        ]
    }

    /// Every process of the job has ended (after a dump that ends them).
    pub fn wait_job_gone(&self) {
        for p in &self.job {
            for pid in &p.pids {
                wait_gone(*pid);
            }
        }
    }

    /// Every rank goes on with its data.
    pub fn assert_goes_on(&self) {
        for p in &self.job {
            assert!(p.rank.advances(5), "{}: {}", p.node, p.rank.tail());
            p.rank.assert_healthy();
        }
    }
}

/// What a `criu-gpu` said, stdout and stderr together.
pub fn text(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

/// Every node's `criu-gpu` succeeded (each output returned, for further checks).
pub fn all_ok(running: Vec<(String, Child)>) -> Vec<String> {
    outputs(running)
        .iter()
        .enumerate()
        .map(|(r, o)| {
            let t = text(o);
            assert!(o.status.success(), "node {r}: {t}");
            t
        })
        .collect()
}

/// Where the tests' `criu-gpu restore` of the part in `images` writes (its `--work-dir`: CRIU's
/// restore.log and pid file), beside the images, which a restore leaves as they were.
pub fn work_dir(images: &std::path::Path) -> std::path::PathBuf {
    images.with_extension("work")
}
