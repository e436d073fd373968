//! A job across machines on the simulated GPU: two nodes as namespaces (netbed), a real etcd,
//! one rank per node talking over TCP between the nodes and meeting in collectives, and
//! `criu-gpu dump|restore --nnodes 2 --node-rank R --rdzv etcd://...` run inside each node with
//! the real CRIU: dumped and restored as one, and what a failure on one node does to both.

use std::path::PathBuf;

use gpu_ckpt_tests::cluster::*;
use gpu_ckpt_tests::criu::Criu;
use gpu_ckpt_tests::*;
use std::time::Duration;

fn two_gpus() -> Sim {
    Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    })
}

fn dump_args(part: &NodeJob, r: usize, rdzv: &str, dir: &std::path::Path) -> Vec<String> {
    vec![
        "dump".into(),
        "--nnodes".into(),
        "2".into(),
        "--node-rank".into(),
        r.to_string(),
        "--rdzv".into(),
        rdzv.into(),
        "--rdzv-timeout".into(),
        "60".into(),
        part.root.to_string(),
        dir.display().to_string(),
    ]
}

fn restore_args(rdzv: &str, dir: &std::path::Path) -> Vec<String> {
    vec![
        "restore".into(),
        "--nnodes".into(),
        "2".into(),
        "--rdzv".into(),
        rdzv.into(),
        "--rdzv-timeout".into(),
        "60".into(),
        dir.display().to_string(),
    ]
}

fn text(o: &std::process::Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

#[test]
fn a_job_on_two_nodes_is_dumped_and_restored_as_one_and_goes_on() {
    let mut sim = two_gpus();
    let bed = Bed::up(&sim.dir, 2);
    let etcd = Etcd::start(&bed, &sim.dir);
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, &bed, &["--collective-ms", "5"]);
    let rdzv = rdzv(&etcd, "train");
    let dirs: Vec<PathBuf> = (0..2).map(|r| sim.dir.join(format!("part{r}"))).collect();
    let running: Vec<_> = job
        .iter()
        .enumerate()
        .map(|(r, p)| {
            let args = dump_args(p, r, &rdzv, &dirs[r]);
            (
                p.node.clone(),
                criu_gpu_on(&sim, &bed, &c, &p.node, &args, &[], &[]),
            )
        })
        .collect();
    let outs = outputs(running);
    for (r, o) in outs.iter().enumerate() {
        let t = text(o);
        assert!(o.status.success(), "node {r}: {t}");
        for want in [
            "cluster: all 2 nodes joined",
            "every rank of the job is locked",
            "cluster: every node passed post-dump",
            "GPU: locked 1 CUDA processes at once, with the job's other nodes",
            "dumped node",
        ] {
            assert!(t.contains(want), "node {r}: {want:?} missing from:\n{t}");
        }
    }
    for p in &job {
        for pid in &p.pids {
            wait_gone(*pid);
        }
    }
    // The parts name their job, generation and the other node.
    let inspect = std::process::Command::new(artifact("criu-gpu"))
        .arg("inspect")
        .arg(&dirs[1])
        .output()
        .unwrap();
    let t = text(&inspect);
    assert!(
        t.contains("node 1's part (of 2) of job train, generation 1")
            && t.contains(&format!("node 0 (n0, {})", bed.addr("n0"))),
        "{t}"
    );
    let running: Vec<_> = job
        .iter()
        .enumerate()
        .map(|(r, p)| {
            let args = restore_args(&rdzv, &dirs[r]);
            (
                p.node.clone(),
                criu_gpu_on(&sim, &bed, &c, &p.node, &args, &[], &[]),
            )
        })
        .collect();
    for (r, o) in outputs(running).iter().enumerate() {
        let t = text(o);
        assert!(o.status.success(), "node {r}: {t}");
        assert!(t.contains("cluster: every node passed post-restore"), "{t}");
    }
    for p in &job {
        assert!(p.rank.advances(5), "{}", p.rank.tail());
        p.rank.assert_healthy();
    }
}

/// The pid of the `criu dump` writing into `dir`.
fn criu_of(dir: &std::path::Path) -> Option<i32> {
    let want = dir.display().to_string();
    cuda_checkpoint_ctl::process::all_pids()
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.first().is_some_and(|a| a.ends_with(b"criu"))
                    && args.contains(&want.as_bytes())
            })
        })
}

fn log_has(path: &std::path::Path, what: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.contains(what))
}

/// Both nodes' dumps started; `interrupt` runs once node 1's ranks are locked with node 0's
/// (their checkpoint slowed down so that it is mid-dump); both dumps must fail and every rank
/// go on with its data.
fn interrupted_dump(interrupt: impl FnOnce(&Sim, &mut Etcd, &[PathBuf])) -> Vec<String> {
    let mut sim = two_gpus();
    let bed = Bed::up(&sim.dir, 2);
    let mut etcd = Etcd::start(&bed, &sim.dir);
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, &bed, &["--collective-ms", "5"]);
    let rdzv = rdzv(&etcd, "train");
    let dirs: Vec<PathBuf> = (0..2).map(|r| sim.dir.join(format!("part{r}"))).collect();
    let slow = [("CUDA_SIM_FAULT", "checkpoint=delay:3000")];
    let running: Vec<_> = job
        .iter()
        .enumerate()
        .map(|(r, p)| {
            let args = dump_args(p, r, &rdzv, &dirs[r]);
            (
                p.node.clone(),
                criu_gpu_on(&sim, &bed, &c, &p.node, &args, &[], &slow),
            )
        })
        .collect();
    let locked = "locked 1 CUDA processes at once, with the job's other nodes";
    assert!(
        wait_until(Duration::from_secs(60), || dirs
            .iter()
            .all(|d| log_has(&d.join("dump.log"), locked))),
        "both nodes locked"
    );
    interrupt(&sim, &mut etcd, &dirs);
    let outs = outputs(running);
    let texts: Vec<String> = outs.iter().map(text).collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(!o.status.success(), "node {r} must fail: {}", texts[r]);
    }
    for p in &job {
        for pid in &p.pids {
            assert!(pid_alive(*pid), "{} of {} is alive", pid, p.node);
        }
    }
    for p in &job {
        assert!(p.rank.advances(5), "{}", p.rank.tail());
        p.rank.assert_healthy();
    }
    texts
}

#[test]
fn a_nodes_criu_killed_mid_dump_leaves_every_rank_of_both_nodes_running() {
    let texts = interrupted_dump(|_, _, dirs| {
        let pid = criu_of(&dirs[1]).expect("node 1's criu");
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    });
    assert!(texts[1].contains("criu dump failed"), "{}", texts[1]);
    assert!(
        texts[0].contains("node 1: criu dump failed") || texts[0].contains("node 1 went away"),
        "node 0 names node 1: {}",
        texts[0]
    );
}

#[test]
fn etcd_stopped_mid_dump_leaves_every_rank_of_both_nodes_running() {
    let texts = interrupted_dump(|_, etcd, _| etcd.stop());
    for t in &texts {
        assert!(
            t.contains("did not all reach post-dump") || t.contains("etcd at"),
            "{t}"
        );
    }
}

#[test]
fn an_unreachable_etcd_is_refused_before_anything_is_frozen() {
    let mut sim = two_gpus();
    let bed = Bed::up(&sim.dir, 2);
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, &bed, &[]);
    let rdzv = format!("etcd://{}:1/train", bed.addr("etcd"));
    let dir = sim.dir.join("part0");
    let args = dump_args(&job[0], 0, &rdzv, &dir);
    let outs = outputs(vec![(
        "n0".into(),
        criu_gpu_on(&sim, &bed, &c, "n0", &args, &[], &[]),
    )]);
    let t = text(&outs[0]);
    assert_eq!(outs[0].status.code(), Some(1), "{t}");
    assert!(
        t.contains("cannot be reached") && t.contains("start etcd there"),
        "{t}"
    );
    assert!(!dir.join("dump.log").exists(), "criu never ran");
    for p in &job {
        assert!(p.rank.advances(3), "{}", p.rank.tail());
    }
}

#[test]
fn a_node_count_that_does_not_match_and_a_second_dump_are_refused_by_the_preflight() {
    let mut sim = two_gpus();
    let bed = Bed::up(&sim.dir, 2);
    let etcd = Etcd::start(&bed, &sim.dir);
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, &bed, &[]);
    let rdzv = rdzv(&etcd, "train");
    let d = |n: &str| sim.dir.join(n);
    // Node 0 opens the dump and waits for node 1.
    let first = criu_gpu_on(
        &sim,
        &bed,
        &c,
        "n0",
        &dump_args(&job[0], 0, &rdzv, &d("a")),
        &[],
        &[],
    );
    // It has joined once its preflight is done (a second or two here).
    std::thread::sleep(Duration::from_secs(3));
    // A second dump of the same node of the job while the first runs.
    let again = dump_args(&job[0], 0, &rdzv, &d("b"));
    let second = outputs(vec![(
        "n0".into(),
        criu_gpu_on(&sim, &bed, &c, "n0", &again, &[], &[]),
    )]);
    let t = text(&second[0]);
    assert_eq!(second[0].status.code(), Some(1), "{t}");
    assert!(
        t.contains("a dump of job train (generation 1) is running"),
        "{t}"
    );
    // Node 1 with another node count.
    let mut three = dump_args(&job[1], 1, &rdzv, &d("c"));
    three[2] = "3".into();
    let third = outputs(vec![(
        "n1".into(),
        criu_gpu_on(&sim, &bed, &c, "n1", &three, &[], &[]),
    )]);
    let t = text(&third[0]);
    assert_eq!(third[0].status.code(), Some(1), "{t}");
    assert!(t.contains("--nnodes 3") && t.contains("--nnodes 2"), "{t}");
    kill_child(first);
    for p in &job {
        assert!(p.rank.advances(3), "{}", p.rank.tail());
    }
    assert!(!d("b").join("dump.log").exists() && !d("c").join("dump.log").exists());
}
