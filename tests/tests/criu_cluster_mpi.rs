//! An Open MPI job across the two namespace nodes (tests/mpi/cuda-mpi-app.c): one rank per node,
//! its data on its node's simulated GPU, summed every step with MPI_Allreduce (host-staged) over
//! Open MPI's TCP transport between the nodes. mpirun runs on node 0 and starts its daemon
//! (orted) on node 1 through netbed's remote shell, as through ssh, so node 1's part (the
//! session rsh started: orted and its rank) is a tree of node 1, joined to node 0's part (mpirun,
//! its rsh client and its rank) only by TCP connections. Both parts are dumped and restored with
//! `criu-gpu dump|restore --nnodes 2` on each node, as a torchrun job's are, and the job goes on
//! with its GPU data.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpu_ckpt_tests::cluster::*;
use gpu_ckpt_tests::criu::Criu;
use gpu_ckpt_tests::*;

const RSH_PORT: &str = "7777";

/// The application, built with Open MPI's mpicc (scripts/install.sh installs libopenmpi-dev).
fn build_app(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("mpi/cuda-mpi-app.c");
    let out = dir.join("cuda-mpi-app");
    let st = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("mpicc (Open MPI: scripts/install.sh installs openmpi-bin and libopenmpi-dev)");
    assert!(st.success(), "mpicc {}", src.display());
    out
}

/// Open MPI's remote shell agent: `AGENT HOST CMD...` through netbed's rsh to HOST's rshd.
fn rsh_agent(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("rsh-agent");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nhost=$1\nshift\nexec {} rsh \"$host:{RSH_PORT}\" \"$@\"\n",
            artifact("netbed").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The job: one rank per node, rank r on GPU r; returns the roots of node 0's and node 1's parts
/// and the ranks' logs.
fn start_mpi_job(sim: &mut Sim, bed: &Bed) -> (Vec<i32>, Vec<App>) {
    let app = build_app(&sim.dir);
    let agent = rsh_agent(&sim.dir);
    let rshd = Command::new(artifact("netbed"))
        .arg("rshd")
        .arg(&bed.dir)
        .args(["n1", RSH_PORT])
        .envs(sim.env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(sim.dir.join("rshd.log")).unwrap())
        .spawn()
        .unwrap();
    let rshd = reap_in_background(rshd);
    sim.adopt(rshd);
    let log = sim.dir.join("mpi");
    let rank = |r: usize| -> Vec<String> {
        let l = log.display().to_string();
        let a = app.display().to_string();
        [
            "-np",
            "1",
            "-H",
            bed.addr(&format!("n{r}")),
            &a,
            &l,
            "100000",
            "50",
            &r.to_string(),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let mpirun = bed
        .command("n0", Path::new("/usr/bin/setsid"))
        .args(["mpirun", "--allow-run-as-root", "--mca", "plm_rsh_agent"])
        .arg(&agent)
        .args([
            "--mca",
            "btl",
            "tcp,self",
            "--mca",
            "btl_tcp_if_include",
            "eth0",
        ])
        .args(["--mca", "oob_tcp_if_include", "eth0"])
        // The nodes of this bed share /dev/shm (only their network is their own): Open MPI's
        // shared memory goes to files of its session directory, named after the node.
        .args(["--mca", "shmem", "mmap"])
        .args(["-x", "LD_LIBRARY_PATH", "-x", "CUDA_SIM_SOCKET"])
        .args(rank(0))
        .arg(":")
        .args(rank(1))
        .envs(sim.env())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(sim.dir.join("mpirun.log")).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mpirun = reap_in_background(mpirun);
    sim.adopt(mpirun);
    let ranks: Vec<App> = (0..2)
        .map(|r| App {
            pid: 0,
            log: log.with_extension(format!("rank{r}")),
        })
        .collect();
    for r in &ranks {
        assert!(
            wait_until(Duration::from_secs(60), || r.steps() >= 3),
            "the MPI job did not start: {} ({})",
            r.tail(),
            std::fs::read_to_string(sim.dir.join("mpirun.log")).unwrap_or_default()
        );
    }
    // Node 1's part: the session rshd started for orted.
    let session = process_facts::process::children(rshd)
        .into_iter()
        .next()
        .expect("the session of orted on node 1");
    sim.adopt(session);
    (vec![mpirun, session], ranks)
}

#[test]
fn an_open_mpi_job_on_two_nodes_is_dumped_and_restored_as_one() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let bed = Bed::up(&sim.dir, 2);
    let etcd = Etcd::start(&bed, &sim.dir);
    let c = Criu::new(&sim);
    let (roots, ranks) = start_mpi_job(&mut sim, &bed);
    let trees: Vec<Vec<i32>> = roots
        .iter()
        .map(|r| process_facts::process::tree(*r))
        .collect();
    let rdzv = rdzv(&etcd, "mpi");
    let dirs: Vec<PathBuf> = (0..2).map(|r| sim.dir.join(format!("part{r}"))).collect();
    let run = |args: &dyn Fn(usize) -> Vec<String>| {
        let children = (0..2)
            .map(|r| {
                let node = format!("n{r}");
                let child = criu_gpu_on(&sim, &bed, &c, &node, &args(r), &[], &[]);
                (node, child)
            })
            .collect();
        all_ok(children)
    };
    let texts = run(&|r| {
        let mut a: Vec<String> = ["dump", "--nnodes", "2", "--node-rank"]
            .map(str::to_owned)
            .to_vec();
        a.extend([
            r.to_string(),
            "--rdzv".into(),
            rdzv.clone(),
            roots[r].to_string(),
        ]);
        a.push(dirs[r].display().to_string());
        a
    });
    for t in &texts {
        assert!(
            t.contains("GPU: locked 1 CUDA processes at once, with the job's other nodes"),
            "{t}"
        );
    }
    for pid in trees.iter().flatten() {
        wait_gone(*pid);
    }
    let texts = run(&|r| {
        let mut a: Vec<String> = ["restore", "--nnodes", "2", "--rdzv"]
            .map(str::to_owned)
            .to_vec();
        a.extend([rdzv.clone(), dirs[r].display().to_string()]);
        a
    });
    for t in &texts {
        assert!(t.contains("cluster: every node passed post-restore"), "{t}");
    }
    // Each rank checks every step that its GPU buffer holds what the last step left there.
    for r in &ranks {
        assert!(r.advances(5), "{}", r.tail());
        assert!(
            !r.lines().iter().any(|l| l.ends_with("BAD")),
            "{}",
            r.tail()
        );
    }
}
