//! A job across machines on the simulated GPU: two nodes as namespaces (netbed), a real etcd,
//! one rank per node talking over TCP between the nodes and meeting in collectives, and
//! `criu-gpu dump|restore --nnodes 2 --node-rank R --rdzv etcd://...` run inside each node with
//! the real CRIU: dumped and restored as one, and what a failure on one node does to both.

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

#[test]
fn a_job_on_two_nodes_is_dumped_and_restored_as_one_and_goes_on() {
    let s = Scene::up(&["--collective-ms", "5"]);
    let texts = all_ok(s.dumps(&[], &[], &[]));
    for (r, t) in texts.iter().enumerate() {
        for want in [
            "cluster: all 2 nodes joined",
            "every rank of the job is locked",
            "cluster: every node passed post-dump",
            "GPU: locked 1 CUDA processes at once, with the job's other nodes",
            "dumped node",
        ] {
            assert!(t.contains(want), "node {r}: {want:?} missing from:\n{t}");
        }
        // Each node's progress shows both nodes' phases while it waits (which ones depends on
        // who comes first).
        assert!(
            t.lines()
                .any(|l| l.starts_with("cluster: phases: node 0 lock round")
                    && l.contains("| node 1 lock round")),
            "node {r}: no phases line of the lock rounds in:\n{t}"
        );
    }
    s.wait_job_gone();
    // The parts name their job, generation and the other node.
    let inspect = std::process::Command::new(artifact("criu-gpu"))
        .arg("inspect")
        .arg(&s.dirs[1])
        .envs(s.sim.env())
        .output()
        .unwrap();
    let t = text(&inspect);
    assert!(
        t.contains("node 1's part (of 2) of job train, generation 1")
            && t.contains(&format!("node 0 (n0, {})", s.bed.addr("n0"))),
        "{t}"
    );
    for t in all_ok(s.restores(&[], &[])) {
        assert!(t.contains("cluster: every node passed post-restore"), "{t}");
    }
    s.assert_goes_on();
}

/// The pid of the `criu dump` writing into `dir`.
fn criu_of(dir: &std::path::Path) -> Option<i32> {
    let want = dir.display().to_string();
    process_facts::process::all_pids().into_iter().find(|p| {
        std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
            let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"criu")) && args.contains(&want.as_bytes())
        })
    })
}

fn log_has(path: &std::path::Path, what: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.contains(what))
}

/// Both nodes' dumps started, node 1's ranks locked with node 0's (their checkpoint slowed down
/// so that it is mid-dump), then `interrupt`; both dumps must fail. The scene and what each
/// node's `criu-gpu` said.
fn interrupted_dump(interrupt: impl FnOnce(&mut Scene)) -> (Scene, Vec<String>) {
    let locked = "locked 1 CUDA processes at once, with the job's other nodes";
    let slow: &[(&str, &str)] = &[("CUDA_SIM_FAULT", "checkpoint=delay:3000")];
    interrupted_at(locked, &[slow, slow], interrupt)
}

/// Both nodes' dumps started (`env`: each node's further environment); `interrupt` once both
/// dump logs show `when`; both dumps must fail.
fn interrupted_at(
    when: &str,
    env: &[&[(&str, &str)]],
    interrupt: impl FnOnce(&mut Scene),
) -> (Scene, Vec<String>) {
    let mut s = Scene::up(&["--collective-ms", "5"]);
    let running = s.dumps(&[], &[], env);
    assert!(
        wait_until(Duration::from_secs(60), || s
            .dirs
            .iter()
            .all(|d| log_has(&d.join("dump.log"), when))),
        "both dump logs show {when:?}"
    );
    interrupt(&mut s);
    let outs = outputs(running);
    let texts: Vec<String> = outs.iter().map(text).collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(!o.status.success(), "node {r} must fail: {}", texts[r]);
    }
    (s, texts)
}

/// After a failed dump every rank of both nodes is alive and goes on with its data.
fn all_go_on(s: &Scene) {
    for p in &s.job {
        for pid in &p.pids {
            assert!(pid_alive(*pid), "{} of {} is alive", pid, p.node);
        }
    }
    s.assert_goes_on();
}

#[test]
fn a_nodes_criu_killed_mid_dump_leaves_every_rank_of_both_nodes_running() {
    let (s, texts) = interrupted_dump(|s| {
        let pid = criu_of(&s.dirs[1]).expect("node 1's criu");
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    });
    all_go_on(&s);
    assert!(texts[1].contains("criu dump failed"), "{}", texts[1]);
    assert!(
        texts[0].contains("node 1: criu dump failed") || texts[0].contains("node 1 went away"),
        "node 0 names node 1: {}",
        texts[0]
    );
}

#[test]
fn etcd_stopped_mid_dump_leaves_every_rank_of_both_nodes_running() {
    let (s, texts) = interrupted_dump(|s| s.etcd.stop());
    all_go_on(&s);
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

#[test]
fn a_rank_killed_mid_dump_fails_both_dumps_and_leaves_no_gpu_locked() {
    // Node 1's rank dies as its lock rounds begin (its lock slowed, within the round's limit, so
    // that this is well before CRIU seizes the tasks: a rank killed once seized dies with its
    // state already in the dump, and the dump is whole).
    let slow: &[(&str, &str)] = &[("CUDA_SIM_FAULT", "lock=delay:150")];
    let (s, texts) = interrupted_at("Dumping processes", &[&[], slow], |s| {
        let n1 = &s.job[1];
        let rank = n1
            .pids
            .iter()
            .find(|p| **p != n1.root)
            .expect("node 1's rank");
        signal(*rank, nix::sys::signal::Signal::SIGKILL);
    });
    // Node 1 names its rank's end (or CRIU's failure on it); node 0's rank, its ring peer
    // gone, ends by itself as an NCCL rank would, or is put back and runs.
    assert!(
        texts[1].contains("ended during the dump") || texts[1].contains("criu dump failed"),
        "{}",
        texts[1]
    );
    // A part without its rank is never voted complete (CRIU dumps the tree as it finds it: a
    // rank gone before the seize is simply not in it).
    assert!(!texts[1].contains("node 1 at post-dump"), "{}", texts[1]);
    // No process of the job is left locked or checkpointed on either GPU: node 0's rank was put
    // back and runs (until it finds its peer gone, as NCCL's would).
    for n in &s.job {
        let list = s.sim.ctl_json(&["--list", "--tree", &n.root.to_string()]);
        for p in list["processes"].as_array().unwrap() {
            let st = p["state"].as_str().unwrap_or_default();
            assert!(st != "locked" && st != "checkpointed", "{}: {p}", n.node);
        }
    }
    let n0 = &s.job[0];
    let rank0 = *n0.pids.iter().find(|p| **p != n0.root).unwrap();
    if pid_alive(rank0) {
        let st = s.sim.state(rank0);
        assert!(st == "running" || !pid_alive(rank0), "node 0's rank: {st}");
    }
}
