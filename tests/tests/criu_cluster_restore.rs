//! Restores of a job across machines on the simulated GPU (two namespace nodes, a real etcd, the
//! real CRIU; tests/src/cluster.rs): a node that comes back late, a snapshot rolled back after
//! the job went on, and the two nodes' parts swapped between the GPUs.

use gpu_ckpt_tests::cluster::*;
use gpu_ckpt_tests::*;

/// A script for CRIU's `--action-script` that sleeps `secs` at `action`.
fn sleeping_script(dir: &std::path::Path, action: &str, secs: u32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("sleep-at-{action}.sh"));
    std::fs::write(
        &path,
        format!("#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = '{action}' ] && sleep {secs}\nexit 0\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// The seconds of "restored ... in S s".
fn restore_seconds(t: &str) -> f64 {
    t.lines()
        .find_map(|l| {
            let rest = l.strip_prefix("restored ")?;
            let (_, s) = rest.split_once(" in ")?;
            s.split_once(" s")?.0.parse().ok()
        })
        .unwrap_or_else(|| panic!("no restore time in {t}"))
}

#[test]
fn a_node_restored_late_finds_its_peers_connections_held_not_reset() {
    // No collectives: a rank whose network is unlocked sends to its peer at once.
    let s = Scene::up(&[]);
    all_ok(s.dumps(&[], &[], &[]));
    s.wait_job_gone();
    // Node 1's CRIU waits 6 s before it restores anything (its sockets included), while node 0
    // restores its part and reaches post-restore: node 0 must hold its network lock until node
    // 1's sockets are back, or its packets meet no socket there and are answered with resets.
    let late = sleeping_script(&s.sim.dir, "pre-restore", 6);
    let texts = all_ok(s.restores(&[], &[&[], &["--action-script", &late]]));
    assert!(
        texts[0].contains("cluster: node 0 at post-restore, waiting for the others"),
        "{}",
        texts[0]
    );
    s.assert_goes_on();
    let held = restore_seconds(&texts[0]);
    assert!(held >= 5.0, "node 0 was held at post-restore: {held} s");
}

#[test]
fn a_node_whose_restore_starts_late_is_waited_for() {
    let s = Scene::up(&["--collective-ms", "5"]);
    all_ok(s.dumps(&[], &[], &[]));
    s.wait_job_gone();
    // Node 0's restore starts; node 1's agent comes 8 s later (within --rdzv-timeout): node 0
    // waits for it before anything of its part is restored, and shows whom it waits for.
    let first = s.restore_on(0, &[], &[]);
    std::thread::sleep(std::time::Duration::from_secs(8));
    assert!(
        !work_dir(&s.dirs[0]).join("restore.log").exists(),
        "node 0 ran CRIU before node 1 came"
    );
    let late = s.restore_on(1, &[], &[]);
    let texts = all_ok(vec![first, late]);
    assert!(
        texts[0].contains("node 1 not there") && texts[0].contains("cluster: all 2 nodes joined"),
        "{}",
        texts[0]
    );
    s.assert_goes_on();
}

#[test]
fn a_snapshot_across_nodes_is_rolled_back_after_the_job_went_on() {
    // Each rank's journal is held open, as a training log is: it grows after the snapshot.
    let s = Scene::up(&["--collective-ms", "5", "--journal", "{dir}/journal-{node}"]);
    let journal = |p: &NodeJob| {
        let path = s.sim.dir.join(format!("journal-{}.rank0", p.node));
        read_lines(&path).len()
    };
    let texts = all_ok(s.dumps(&[&["--leave-running"], &["--leave-running"]], &[], &[]));
    for t in &texts {
        assert!(t.contains("cluster: every node passed post-dump"), "{t}");
    }
    // The job goes on past the snapshot (its logs grow), then ends.
    s.assert_goes_on();
    let at_end: Vec<usize> = s.job.iter().map(journal).collect();
    for p in &s.job {
        for pid in &p.pids {
            signal(*pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
    s.wait_job_gone();
    // Without --truncate-grown the grown logs stop the restore on every node, before anything.
    for (r, o) in outputs(s.restores(&[], &[])).iter().enumerate() {
        let t = text(o);
        assert!(!o.status.success(), "node {r}: {t}");
        assert!(
            t.contains("grew from") || t.contains("another node's preflight refused"),
            "node {r}: {t}"
        );
    }
    let cut = ["--truncate-grown"];
    for t in all_ok(s.restores(&[&cut, &cut], &[])) {
        assert!(t.contains("cut ") && t.contains(" back from "), "{t}");
    }
    // The job is back at the snapshot, behind where it ended, and goes on from there.
    for (p, end) in s.job.iter().zip(&at_end) {
        let now = journal(p);
        assert!(
            now < *end,
            "{}: {now} journal lines after the rollback, {end} at the end",
            p.node
        );
    }
    s.assert_goes_on();
}

#[test]
fn the_two_nodes_parts_swap_gpus_with_a_device_map_on_each_node() {
    let s = Scene::up(&["--collective-ms", "5"]);
    let gpus = s.sim.gpu_uuids();
    let gpu_of = |p: &NodeJob| -> Vec<String> {
        let list = s.sim.ctl_json(&["--list", "--tree", &p.root.to_string()]);
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|x| x["gpus"].as_array().cloned().unwrap_or_default())
            .filter_map(|g| g["gpu"].as_str().map(str::to_owned))
            .collect()
    };
    for (r, p) in s.job.iter().enumerate() {
        assert_eq!(gpu_of(p), [gpus[r].clone()], "node {r} starts on GPU {r}");
    }
    all_ok(s.dumps(&[], &[], &[]));
    s.wait_job_gone();
    let to1 = format!("{}={}", gpus[0], gpus[1]);
    let to0 = format!("{}={}", gpus[1], gpus[0]);
    all_ok(s.restores(&[&["--device-map", &to1], &["--device-map", &to0]], &[]));
    for (r, p) in s.job.iter().enumerate() {
        assert_eq!(
            gpu_of(p),
            [gpus[1 - r].clone()],
            "node {r} is on GPU {}",
            1 - r
        );
    }
    s.assert_goes_on();
}
