//! A job across machines restored where a node is now somewhere else, as a Kubernetes pod gets
//! another IP address after a reschedule: on the simulated GPU, with the real CRIU (the
//! project's, with UPDATE_INETSK: patch 0012) and a real etcd, the job (one rank per node,
//! talking over TCP between the nodes) is dumped on nodes n0 and n1 and node 0's part restored
//! on a spare node m0 with another address, node 1's in place. Nobody names the move: each node
//! finds it from the others' records in etcd, and every connection between the nodes moves on
//! both ends.

use std::path::PathBuf;
use std::process::Output;

use gpu_ckpt_tests::cluster::*;
use gpu_ckpt_tests::criu::Criu;
use gpu_ckpt_tests::*;

fn text(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

/// A job dumped on two nodes of a bed with one spare node.
struct Dumped {
    sim: Sim,
    bed: Bed,
    _etcd: Etcd,
    c: Criu,
    job: Vec<NodeJob>,
    rdzv: String,
    dirs: Vec<PathBuf>,
}

fn dumped() -> Dumped {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let bed = Bed::with_spares(&sim.dir, 2, 1);
    let etcd = Etcd::start(&bed, &sim.dir);
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, &bed, &["--collective-ms", "5"]);
    for (r, p) in job.iter().enumerate() {
        assert_eq!(
            gpus_of(&sim, p.root),
            [sim.gpu_uuids()[r].clone()],
            "node {r}"
        );
    }
    let rdzv = rdzv(&etcd, "train");
    let dirs: Vec<PathBuf> = (0..2).map(|r| sim.dir.join(format!("part{r}"))).collect();
    let running: Vec<_> = job
        .iter()
        .enumerate()
        .map(|(r, p)| {
            let args: Vec<String> = [
                "dump",
                "--nnodes",
                "2",
                "--node-rank",
                &r.to_string(),
                "--rdzv",
                &rdzv,
                &p.root.to_string(),
                &dirs[r].display().to_string(),
            ]
            .map(str::to_owned)
            .into();
            let child = criu_gpu_on(&sim, &bed, &c, &p.node, &args, &[], &[]);
            (p.node.clone(), child)
        })
        .collect();
    for (r, o) in outputs(running).iter().enumerate() {
        assert!(o.status.success(), "dump on node {r}: {}", text(o));
    }
    for p in &job {
        p.pids.iter().for_each(|pid| wait_gone(*pid));
    }
    Dumped {
        sim,
        bed,
        _etcd: etcd,
        c,
        job,
        rdzv,
        dirs,
    }
}

impl Dumped {
    /// Restores part R on `on[R]`, with `more[R]` (criu-gpu's options) and `criu`.
    fn restore(&self, on: [&str; 2], more: [&[&str]; 2], criu: &Criu) -> Vec<Output> {
        let running: Vec<_> = (0..2)
            .map(|r| {
                let mut args: Vec<String> = ["restore", "--nnodes", "2", "--rdzv", &self.rdzv]
                    .map(str::to_owned)
                    .into();
                args.extend(more[r].iter().map(|a| a.to_string()));
                args.extend([
                    "--work-dir".into(),
                    work_dir(&self.dirs[r]).display().to_string(),
                ]);
                args.push(self.dirs[r].display().to_string());
                let child = criu_gpu_on(&self.sim, &self.bed, criu, on[r], &args, &[], &[]);
                (on[r].to_owned(), child)
            })
            .collect();
        outputs(running)
    }

    fn goes_on(&self) {
        for p in &self.job {
            assert!(p.rank.advances(10), "{}", p.rank.tail());
            p.rank.assert_healthy();
        }
    }

    fn log(&self, r: usize) -> String {
        std::fs::read_to_string(work_dir(&self.dirs[r]).join("restore.log")).unwrap_or_default()
    }
}

/// The established TCP connections of the restored tree rooted at `root` (in its node's
/// namespace), as (local, remote).
fn connections(root: i32) -> Vec<(std::net::SocketAddr, std::net::SocketAddr)> {
    use process_facts::process::{self, TcpState};
    process::tcp_sockets(root)
        .into_iter()
        .filter(|s| s.state == TcpState::Established)
        .map(|s| (s.local, s.remote))
        .collect()
}

fn restored_root(o: &Output) -> i32 {
    let t = text(o);
    t.split("its root is pid ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or_else(|| panic!("no restored root in: {t}"))
}

#[test]
fn a_part_restored_on_a_node_with_another_address_goes_on() {
    let d = dumped();
    let (old, new, peer) = (d.bed.addr("n0"), d.bed.addr("m0"), d.bed.addr("n1"));
    let outs = d.restore(["m0", "n1"], [&[], &[]], &d.c);
    let moved = format!("the job's connections move with its nodes: {old}={new}");
    for (r, o) in outs.iter().enumerate() {
        let t = text(o);
        assert!(o.status.success(), "node {r}: {t}");
        assert!(t.contains(&moved), "node {r}: {moved:?} missing from:\n{t}");
        assert!(t.contains("cluster: every node passed post-restore"), "{t}");
        // CRIU called the plugin's UPDATE_INETSK, which moved the sockets' ends.
        let log = d.log(r);
        assert!(log.contains("criu_gpu: moved "), "node {r}: {log}");
        // CRIU's restore locked the moved connections in the node's namespace (patch 0013):
        // there was no lock to add them to (criu-gpu took the dump's back after the dump).
        assert!(
            log.contains("here: it is made for the connections being restored"),
            "node {r}: {log}"
        );
    }
    d.goes_on();
    // Node 0's part talks to node 1 from its new address; node 1's part to node 0's new one.
    let (a, b) = (restored_root(&outs[0]), restored_root(&outs[1]));
    let here = connections(a);
    assert!(
        here.iter()
            .any(|(l, r)| l.ip().to_string() == new && r.ip().to_string() == peer),
        "{here:?}"
    );
    assert!(
        here.iter().all(|(l, _)| l.ip().to_string() != old),
        "{here:?}"
    );
    let there = connections(b);
    assert!(
        there.iter().any(|(_, r)| r.ip().to_string() == new),
        "{there:?}"
    );
    assert!(
        there.iter().all(|(_, r)| r.ip().to_string() != old),
        "{there:?}"
    );
}

/// The GPUs the CUDA processes of the tree at `root` use, as NVML lists them.
fn gpus_of(sim: &Sim, root: i32) -> Vec<String> {
    let v = sim.ctl_json(&["--list", "--tree", &root.to_string()]);
    v["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["gpus"].as_array().cloned().unwrap_or_default())
        .filter_map(|g| g["gpu"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn the_parts_swap_gpus_as_node_0_moves() {
    let d = dumped();
    let gpus = d.sim.gpu_uuids();
    let swap = format!("{0}={1},{1}={0}", gpus[0], gpus[1]);
    let map: &[&str] = &["--device-map", &swap];
    let outs = d.restore(["m0", "n1"], [map, map], &d.c);
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "node {r}: {}", text(o));
        assert!(d.log(r).contains("criu_gpu: moved "), "node {r}");
        // Node 0's rank ran on GPU 0, node 1's on GPU 1: now the other way round.
        let root = restored_root(o);
        assert_eq!(gpus_of(&d.sim, root), [gpus[1 - r].clone()], "node {r}");
    }
    d.goes_on();
}

/// A CRIU without the hook (stock 4.2.1) cannot move the connections: every node refuses
/// before CRIU starts, and the same parts then restore with the project's CRIU.
#[test]
fn a_criu_that_cannot_move_connections_is_refused_on_every_node_first() {
    let d = dumped();
    let stock = Criu {
        bin: criu::STOCK.into(),
        plugins: d.c.plugins.clone(),
    };
    let outs = d.restore(["m0", "n1"], [&[], &[]], &stock);
    for (r, o) in outs.iter().enumerate() {
        let t = text(o);
        assert_eq!(o.status.code(), Some(1), "node {r}: {t}");
        assert!(
            t.contains("cannot move them: it lacks the UPDATE_INETSK plugin hook")
                || t.contains("stopped it: node"),
            "node {r}: {t}"
        );
        assert!(
            !work_dir(&d.dirs[r]).join("restore.log").exists(),
            "node {r}: criu ran"
        );
    }
    let outs = d.restore(["m0", "n1"], [&[], &[]], &d.c);
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "node {r}: {}", text(o));
    }
    d.goes_on();
}
