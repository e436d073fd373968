//! What a job across machines refuses, by name, before anything is frozen or restored (two
//! namespace nodes, a real etcd, the real CRIU, the simulated GPU; tests/src/cluster.rs): a node
//! whose ranks cannot be checkpointed, and parts of another snapshot or another job.

use gpu_ckpt_tests::cluster::*;
use gpu_ckpt_tests::criu::Criu;
use gpu_ckpt_tests::*;

#[test]
fn a_node_whose_ranks_cannot_be_checkpointed_stops_every_node_before_any_lock() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let bed = Bed::up(&sim.dir, 2);
    let etcd = Etcd::start(&bed, &sim.dir);
    let c = Criu::new(&sim);
    // Node 1's part is started by a launcher script that holds a deleted 2 GiB file (sparse: it
    // costs nothing here), which CRIU would copy into the images whole: its preflight refuses it.
    let big = sim.dir.join("deleted-on-n1");
    // (Not exec'ing the job: cuda-sim-app closes the fds it inherits, as some launchers do.)
    let hold = r#"exec 7<>"$0" && truncate -s 2G "$0" && rm "$0" && "$@"; exit $?"#;
    let wrap = |r: usize| match r {
        1 => vec![
            "/bin/bash".into(),
            "-c".into(),
            hold.into(),
            big.display().to_string(),
        ],
        _ => Vec::new(),
    };
    let job = start_job_wrapped(&mut sim, &bed, &["--collective-ms", "5"], wrap);
    let rdzv = rdzv(&etcd, "train");
    let dirs: Vec<_> = (0..2).map(|r| sim.dir.join(format!("part{r}"))).collect();
    let running = (0..2)
        .map(|r| {
            let args: Vec<String> = [
                "dump",
                "--nnodes",
                "2",
                "--node-rank",
                &r.to_string(),
                "--rdzv",
                &rdzv,
                "--rdzv-timeout",
                "60",
                &job[r].root.to_string(),
                &dirs[r].display().to_string(),
            ]
            .map(str::to_owned)
            .to_vec();
            let node = job[r].node.clone();
            let child = criu_gpu_on(&sim, &bed, &c, &node, &args, &[], &[]);
            (node, child)
        })
        .collect();
    let outs = outputs(running);
    let texts: Vec<String> = outs.iter().map(text).collect();
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(o.status.code(), Some(1), "node {r}: {}", texts[r]);
        assert!(
            !dirs[r].join("dump.log").exists(),
            "node {r}: CRIU never ran"
        );
    }
    assert!(
        texts[1].contains("holds the unlinked file") && texts[1].contains("deleted-on-n1"),
        "node 1 names its reason: {}",
        texts[1]
    );
    // Node 0 learns it from node 1's preflight or from its abort, whichever it sees first.
    assert!(
        (texts[0].contains("another node's preflight refused the job (node 1 (n1)")
            || texts[0].contains("node 1: its preflight refused the job"))
            && texts[0].contains("holds the unlinked file")
            && texts[0].contains("fix: close it"),
        "node 0 names node 1, its reason and the fix: {}",
        texts[0]
    );
    for p in &job {
        assert!(p.rank.advances(3), "{}: {}", p.node, p.rank.tail());
        p.rank.assert_healthy();
    }
}

#[test]
fn a_part_of_another_snapshot_or_another_job_is_refused_by_name() {
    let mut s = Scene::up(&["--collective-ms", "5"]);
    let snap: &[&str] = &["--leave-running"];
    // Two snapshots of the job: generations 1 and 2.
    all_ok(s.dumps(&[snap, snap], &[], &[]));
    let first = s.dirs.clone();
    s.dirs = (0..2)
        .map(|r| s.sim.dir.join(format!("second{r}")))
        .collect();
    for t in all_ok(s.dumps(&[snap, snap], &[], &[])) {
        assert!(t.contains("of job train (generation 2"), "{t}");
    }
    for p in &s.job {
        for pid in &p.pids {
            signal(*pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
    s.wait_job_gone();
    let parts: Vec<_> = first.iter().chain(&s.dirs).cloned().collect();
    let before: Vec<_> = parts.iter().map(|d| listing(d)).collect();
    // Node 1 brings the first snapshot's part, node 0 the second's: both refuse, naming both.
    let second = s.dirs.clone();
    s.dirs[1] = first[1].clone();
    for (r, o) in outputs(s.restores(&[], &[])).iter().enumerate() {
        let t = text(o);
        assert_eq!(o.status.code(), Some(1), "node {r}: {t}");
        assert!(
            t.contains("of generation 1") && t.contains("of generation 2"),
            "node {r}: {t}"
        );
        assert!(t.contains("restore parts of one dump on every node"), "{t}");
    }
    // A restore of another job: each node refuses its part by name, before it joins.
    s.dirs = second;
    let train = s.rdzv.clone();
    s.rdzv = rdzv(&s.etcd, "other");
    for (r, o) in outputs(s.restores(&[], &[])).iter().enumerate() {
        let t = text(o);
        assert_eq!(o.status.code(), Some(1), "node {r}: {t}");
        assert!(
            t.contains(&format!(
                "is node {r}'s part (of 2) of job train, generation 2"
            )) && t.contains("this restore is of job other"),
            "node {r}: {t}"
        );
    }
    for (d, was) in parts.iter().zip(&before) {
        assert_eq!(
            &listing(d),
            was,
            "{}: the refused restores left it as it was",
            d.display()
        );
    }
    // The right parts, of one snapshot of this job, restore; the job goes on.
    s.rdzv = train;
    all_ok(s.restores(&[], &[]));
    s.assert_goes_on();
}

/// Each file of `dir`: its name, length and modification time.
fn listing(dir: &std::path::Path) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, m.len(), m.modified().unwrap())
        })
        .collect();
    files.sort();
    files
}
