//! A job across machines on the simulated GPU: two nodes as namespaces (netbed), a real etcd,
//! one rank per node talking over TCP between the nodes and meeting in collectives, and
//! `criu-gpu dump|restore --nnodes 2 --node-rank R --rdzv etcd://...` run inside each node with
//! the real CRIU: dumped and restored as one, and what a failure on one node does to both.

use std::path::PathBuf;

use gpu_ckpt_tests::cluster::*;
use gpu_ckpt_tests::criu::Criu;
use gpu_ckpt_tests::*;

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
