//! `criu-gpu dump` and `criu-gpu restore` of a distributed job with the real CRIU and the
//! simulated GPU: two ranks (cuda-sim-app --ranks) holding GPU data, a TCPStore-like listener
//! with the ranks' connections to it, a ring of TCP connections, and an unlinked shared-memory
//! file; dumped and restored on the same host, going on with their data; and what is refused
//! before anything is frozen, and what a failed dump or restore leaves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_ckpt_tests::criu::{self, Criu};
use gpu_ckpt_tests::job::*;
use gpu_ckpt_tests::*;

#[test]
fn a_job_of_two_ranks_is_dumped_and_restored_on_the_same_host_and_goes_on() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, None, 2, &NCCL_SOCKETS_ONLY);
    let images = dir_of(&sim, "img");
    let out = job.dump(&sim, &c, &images, &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for want in [
        "option: --tcp-established",
        "option: --ghost-limit",
        "option: --network-lock",
        "GPU: locked 2 CUDA process(es)",
        "GPU: checkpointed 2 CUDA process(es)",
        "dumped 3 process(es)",
    ] {
        assert!(t.contains(want), "{want:?} missing from:\n{t}");
    }
    job.gone();
    let out = criu_gpu(&sim, &c, &["restore", images.to_str().unwrap()], &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("restored CUDA state of 2 of 2") && t.contains("--tcp-established"),
        "{t}"
    );
    for p in &job.pids {
        assert!(pid_alive(*p), "process {p} of the job is back with its pid");
    }
    job.advances(5);
}

#[test]
fn a_dry_run_freezes_nothing_and_prints_the_command() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, None, 2, &NCCL_SOCKETS_ONLY);
    let images = dir_of(&sim, "img");
    let out = criu_gpu(
        &sim,
        &c,
        &[
            "dump",
            &job.root.to_string(),
            images.to_str().unwrap(),
            "--dry-run",
        ],
        &[],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("would run:") && t.contains("--tcp-established"),
        "{t}"
    );
    assert!(!images.exists(), "a dry run writes nothing");
    job.advances(3);
}

/// With stock CRIU, which fails on any ring after the GPU checkpoint (the project's CRIU dumps
/// idle rings: criu_uring.rs).
#[test]
fn an_io_uring_in_the_job_is_refused_before_anything_is_frozen_with_stock_criu() {
    let mut sim = Sim::start();
    let c = Criu {
        bin: PathBuf::from(gpu_ckpt_tests::criu::STOCK),
        ..Criu::new(&sim)
    };
    let launcher = uring_launcher(&sim.dir);
    let job = start_job(&mut sim, Some(&launcher), 2, &NCCL_SOCKETS_ONLY);
    let images = dir_of(&sim, "img");
    let out = job.dump(&sim, &c, &images, &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("problem: process") && t.contains("(uring-launcher) holds io_uring"),
        "{t}"
    );
    assert!(t.contains("nothing was done"), "{t}");
    assert!(!images.join("dump.log").exists(), "criu never ran");
    job.advances(3);
}

/// One rank under a launcher that maps the driver (and NCCL) without a context talks to no other
/// rank: NCCL's defaults are no reason to refuse it, to criu-gpu as to the plugin.
#[test]
fn a_rank_alone_under_a_launcher_that_maps_the_driver_is_not_refused() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let lib = fake_nccl(&sim.dir);
    let preload = lib.display().to_string();
    let job = start_job(&mut sim, None, 1, &[("LD_PRELOAD", &preload)]);
    let libcuda = sim
        .env()
        .into_iter()
        .find(|(k, _)| k == "CUDA_CKPT_LIBCUDA");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", job.root)).unwrap();
    assert!(
        maps.contains("libcuda") && maps.contains("libnccl"),
        "the launcher maps the driver and NCCL ({libcuda:?}):\n{maps}"
    );
    let images = dir_of(&sim, "img");
    let out = job.dump(&sim, &c, &images, &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("GPU: checkpointed 1 CUDA process(es)"), "{t}");
    job.gone();
    let out = criu_gpu(&sim, &c, &["restore", images.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.advances(3);
}

#[test]
fn a_failed_dump_leaves_every_rank_running_with_its_data() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, None, 2, &NCCL_SOCKETS_ONLY);
    let images = dir_of(&sim, "img");
    let rank1 = job.pids[job.pids.len() - 1].to_string();
    // Failing before the checkpoint changed anything, and after (the rank is then checkpointed).
    for spec in ["UNKNOWN", "UNKNOWN@after"] {
        let fault = format!("checkpoint/{rank1}={spec}");
        let out = job.dump(&sim, &c, &images, &[("CUDA_SIM_FAULT", &fault)]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{spec}: {t}");
        assert!(
            t.contains("criu dump failed") && t.contains("left running"),
            "{spec}: {t}"
        );
        job.advances(5);
    }
}

#[test]
fn a_failed_restore_leaves_the_images_retryable() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, None, 2, &NCCL_SOCKETS_ONLY);
    let images = dir_of(&sim, "img");
    let out = job.dump(&sim, &c, &images, &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.gone();
    let out = criu_gpu(
        &sim,
        &c,
        &["restore", images.to_str().unwrap()],
        &[("CUDA_SIM_FAULT", "restore=UNKNOWN")],
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("images are unchanged"), "{t}");
    job.gone();
    let out = criu_gpu(&sim, &c, &["restore", images.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.advances(5);
}

#[test]
fn a_restore_whose_listening_port_is_taken_is_refused_naming_the_holder_and_then_restores() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, None, 2, &NCCL_SOCKETS_ONLY);
    let images = dir_of(&sim, "img");
    let inodes: Vec<u64> = job
        .pids
        .iter()
        .flat_map(|p| process_facts::process::socket_inodes(*p))
        .collect();
    let store = process_facts::process::tcp_sockets(job.root)
        .into_iter()
        .find(|s| {
            inodes.contains(&s.inode)
                && s.state == process_facts::process::TcpState::Listen
                && s.local.ip().is_unspecified()
        })
        .expect("the store's listener")
        .local;
    let out = job.dump(&sim, &c, &images, &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.gone();
    let blocker = std::net::TcpListener::bind(store).unwrap();
    let out = criu_gpu(&sim, &c, &["restore", images.to_str().unwrap()], &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let me = std::process::id();
    assert!(
        t.contains(&format!("the job listened on {store}")) && t.contains(&format!("process {me}")),
        "{t}"
    );
    drop(blocker);
    let out = criu_gpu(&sim, &c, &["restore", images.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.advances(5);
}

/// The journal of rank `r` of a job started with `--journal J`.
fn journal(j: &Path, r: usize) -> PathBuf {
    PathBuf::from(format!("{}.rank{r}", j.display()))
}

/// A snapshot (`--leave-running`), the job goes on and dies: the restore names the files that
/// grew and touches nothing; with --truncate-grown it cuts them back and the job goes on from
/// the snapshot, its journal continuing line for line; a file rewritten meanwhile is refused.
#[test]
fn a_snapshot_is_rolled_back_to_after_the_job_went_on_and_died() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let j = sim.dir.join("journal");
    let job = start_job_with(
        &mut sim,
        None,
        2,
        &NCCL_SOCKETS_ONLY,
        &["--interval-ms", "50", "--journal", j.to_str().unwrap()],
    );
    let images = dir_of(&sim, "snap");
    let root = job.root.to_string();
    let out = criu_gpu(
        &sim,
        &c,
        &["dump", &root, images.to_str().unwrap(), "--leave-running"],
        &[],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("recorded the job's"), "{t}");
    // The job goes on, then dies.
    job.advances(5);
    for p in job.pids.iter().rev() {
        signal(*p, nix::sys::signal::Signal::SIGKILL);
    }
    job.gone();
    let grown: Vec<Vec<u8>> = (0..2)
        .map(|r| std::fs::read(journal(&j, r)).unwrap())
        .collect();
    // What the journals held while the job was frozen, as the dump recorded it.
    let rec = criu_gpu::job::files::FilesRecord::read(&images)
        .unwrap()
        .expect("the dump recorded the job's files");
    let at_snapshot: Vec<Vec<u8>> = (0..2)
        .map(|r| {
            let f = rec.files.iter().find(|f| f.path == journal(&j, r)).unwrap();
            assert!(f.digest.is_some(), "open for writing: hashed");
            grown[r][..f.size as usize].to_vec()
        })
        .collect();
    assert!(grown[0].len() > at_snapshot[0].len());

    let snap = images.to_str().unwrap();
    let out = criu_gpu(&sim, &c, &["restore", snap], &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    for r in 0..2 {
        let want = format!(
            "{} grew from {} to {} bytes",
            journal(&j, r).display(),
            at_snapshot[r].len(),
            grown[r].len()
        );
        assert!(t.contains(&want), "{want:?} missing from:\n{t}");
        assert_eq!(
            std::fs::read(journal(&j, r)).unwrap(),
            grown[r],
            "nothing touched"
        );
    }
    assert!(t.contains("--truncate-grown"), "{t}");

    let out = criu_gpu(&sim, &c, &["restore", snap, "--truncate-grown"], &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("cut ") && t.contains(" back from "), "{t}");
    job.advances(5);
    // Each journal goes on from the snapshot: its lines up to it, then the same steps as the
    // first run wrote after it.
    for r in 0..2 {
        let now = std::fs::read(journal(&j, r)).unwrap();
        assert!(now.starts_with(&at_snapshot[r]), "rank {r}");
        let common = now.len().min(grown[r].len());
        assert_eq!(
            now[..common],
            grown[r][..common],
            "rank {r} went on as before"
        );
    }
}

/// The numbers of the `line N` lines of `log`, in order.
fn line_numbers(log: &Path) -> Vec<u64> {
    read_lines(log)
        .iter()
        .filter_map(|l| l.strip_prefix("line ")?.parse().ok())
        .collect()
}

/// The user's case of issue 27: a GPU process and a writer appending a numbered line to the
/// job's log every 50 ms, the log opened once write-only for appending (as Python's logging,
/// `tee -a` and `>>` open one), snapshotted with --leave-running, run on, killed and restored.
/// CRIU checks no size for such a file: without criu-gpu's record the restore went through and
/// the log held the abandoned run's lines followed by the restored run's. Now the restore names
/// it; --truncate-grown cuts it back, and the log counts up once, line by line.
#[test]
fn a_log_opened_for_appending_is_rolled_back_with_its_snapshot() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let log = sim.dir.join("train.log");
    let gpu = App {
        pid: 0,
        log: sim.dir.join("gpu.log"),
    };
    let child = setsid_command(&artifact("appender"))
        .arg(&log)
        .arg("50")
        .arg(artifact("cuda-sim-app"))
        .args(["--mib", "8", "--interval-ms", "50", "--log"])
        .arg(&gpu.log)
        .envs(sim.env())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let root = reap_in_background(child);
    sim.adopt(root);
    assert!(
        wait_until(Duration::from_secs(20), || gpu.steps() >= 2
            && line_numbers(&log).len() >= 5),
        "{}",
        gpu.tail()
    );
    let pids = process_facts::process::tree(root);
    assert_eq!(pids.len(), 2, "the writer and its GPU process: {pids:?}");
    pids.iter().for_each(|p| sim.adopt(*p));

    let images = dir_of(&sim, "snap");
    let snap = images.to_str().unwrap();
    let out = criu_gpu(
        &sim,
        &c,
        &["dump", &root.to_string(), snap, "--leave-running"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let lines_then = line_numbers(&log).len();

    // The job runs on for about a second, then dies.
    assert!(
        wait_until(Duration::from_secs(20), || line_numbers(&log).len()
            >= lines_then + 20),
        "the writer went on"
    );
    for p in pids.iter().rev() {
        signal(*p, nix::sys::signal::Signal::SIGKILL);
    }
    pids.iter().for_each(|p| wait_gone(*p));
    let grown = std::fs::read(&log).unwrap();

    let out = criu_gpu(&sim, &c, &["restore", snap], &[]);
    let t = text(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a plain restore is refused: {t}"
    );
    assert_eq!(std::fs::read(&log).unwrap(), grown, "nothing touched");
    let rec = criu_gpu::job::files::FilesRecord::read(&images)
        .unwrap()
        .expect("the dump recorded the job's files");
    let recorded = rec.files.iter().find(|f| f.path == log);
    let recorded = recorded.unwrap_or_else(|| panic!("{} not recorded: {rec:?}", log.display()));
    assert!(recorded.digest.is_some(), "open for writing: hashed");
    let at_snapshot = grown[..recorded.size as usize].to_vec();
    let want = format!(
        "{} grew from {} to {} bytes",
        log.display(),
        at_snapshot.len(),
        grown.len()
    );
    assert!(t.contains(&want), "{want:?} missing from:\n{t}");
    assert!(t.contains("the job appends to it"), "{t}");

    let out = criu_gpu(&sim, &c, &["restore", snap, "--truncate-grown"], &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!("cut {} back from", log.display())),
        "{t}"
    );
    let lines_grown = grown.iter().filter(|b| **b == b'\n').count();
    assert!(
        wait_until(Duration::from_secs(20), || line_numbers(&log).len()
            >= lines_grown + 5),
        "the restored writer goes on"
    );
    assert!(std::fs::read(&log).unwrap().starts_with(&at_snapshot));
    let numbers = line_numbers(&log);
    let expected: Vec<u64> = (0..numbers.len() as u64).collect();
    assert_eq!(numbers, expected, "the log counts up once, line by line");
    assert!(gpu.advances(3), "{}", gpu.tail());
    gpu.assert_healthy();
}

#[test]
fn a_file_rewritten_since_the_snapshot_is_refused_even_with_truncate_grown() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let j = sim.dir.join("journal");
    let job = start_job_with(
        &mut sim,
        None,
        2,
        &NCCL_SOCKETS_ONLY,
        &["--interval-ms", "50", "--journal", j.to_str().unwrap()],
    );
    let images = dir_of(&sim, "snap");
    let out = job.dump(&sim, &c, &images, &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.gone();
    let rank1 = journal(&j, 1);
    let mut bytes = std::fs::read(&rank1).unwrap();
    bytes[0] ^= 1;
    bytes.extend_from_slice(b"more\n");
    std::fs::write(&rank1, &bytes).unwrap();
    let snap = images.to_str().unwrap();
    let out = criu_gpu(&sim, &c, &["restore", snap, "--truncate-grown"], &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("are not what they were"), "{t}");
    assert_eq!(std::fs::read(&rank1).unwrap(), bytes, "nothing touched");
    assert!(
        !t.contains("cut "),
        "no file is cut when the restore is refused: {t}"
    );
}

/// Stock CRIU killed after a successful dump, at post-dump, with the tasks left alive: the
/// guardian puts the GPU state back, takes the job's sockets out of the TCP repair mode CRIU
/// left them in and takes CRIU's lock of the job's connections back; the job goes on. Stock
/// CRIU: the project's (patch 0010) leaves no socket in repair mode there, which the kill
/// sweep's TCP job shows. (The ranks are held between steps for this test: a rank that is
/// inside `recv` when CRIU dies gets EPERM before the guardian can act, docs/known-limits.md.)
#[test]
fn criu_killed_at_post_dump_leaves_the_job_running_with_its_gpu_state_and_connections() {
    let mut sim = Sim::start();
    let mut c = Criu::new(&sim);
    c.bin = criu::STOCK.into();
    let hold = sim.dir.join("hold");
    let more = ["--interval-ms", "50", "--hold", hold.to_str().unwrap()];
    let job = start_job_with(&mut sim, None, 2, &NCCL_SOCKETS_ONLY, &more);
    job.advances(2);
    let held: Vec<PathBuf> = (0..2)
        .map(|r| PathBuf::from(format!("{}.rank{r}", hold.display())))
        .collect();
    for f in &held {
        std::fs::write(f, "").unwrap();
    }
    for r in &job.ranks {
        let stalled = || r.stalls_for(Duration::from_millis(300));
        assert!(wait_until(Duration::from_secs(20), stalled), "{}", r.tail());
    }
    let images = dir_of(&sim, "img");
    let script = criu::killing_script(&sim.dir, "post-dump");
    let root = job.root.to_string();
    let out = criu_gpu_with(
        &sim,
        &c,
        &["dump", &root, images.to_str().unwrap()],
        &["--action-script", &script],
        &[],
    );
    assert!(!out.status.success(), "criu was killed: {}", text(&out));
    let id = criu_gpu_image::criu_image::dump_run_id(&images)
        .unwrap()
        .expect("the inventory was written before post-dump");
    let guardian = || std::fs::read_to_string(images.join("gpu-guardian.log")).unwrap_or_default();
    let settled = || {
        guardian()
            .matches("returned to its state before the dump (running)")
            .count()
            == 2
    };
    assert!(
        wait_until(Duration::from_secs(20), settled),
        "{}",
        guardian()
    );
    let log = guardian();
    assert!(log.contains("took back CRIU's network lock"), "{log}");
    assert!(log.contains("out of the repair mode"), "{log}");
    assert!(!criu_gpu_host::netlock::is_locked(&id).unwrap());
    for f in &held {
        std::fs::remove_file(f).unwrap();
    }
    job.advances(3);
}

/// CRIU killed in a restore (at pre-restore, after the plugin's init): nothing of the job is left
/// and the same images restore again. (A restore killed while its tasks read their pages leaves
/// the job's unlinked files, made for a moment, in the way of the next: "Can't create ghost
/// regfile: File exists"; the guardian removes them, criu_image::leftover_ghosts.)
#[test]
fn a_restore_killed_late_leaves_nothing_in_the_way_of_the_next() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, None, 2, &NCCL_SOCKETS_ONLY);
    let images = dir_of(&sim, "img");
    let out = job.dump(&sim, &c, &images, &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.gone();
    let script = criu::killing_script(&sim.dir, "pre-restore");
    let snap = images.to_str().unwrap();
    let out = criu_gpu_with(
        &sim,
        &c,
        &["restore", snap],
        &["--action-script", &script],
        &[],
    );
    assert!(!out.status.success(), "criu was killed: {}", text(&out));
    job.gone();
    let out = criu_gpu(&sim, &c, &["restore", snap], &[]);
    assert!(
        out.status.success(),
        "{}\nguardian: {}",
        text(&out),
        std::fs::read_to_string(images.join("gpu-guardian.log")).unwrap_or_default()
    );
    job.advances(5);
}

/// The count a `map-writer` wrote last into `file`.
fn mapped_count(file: &Path) -> u64 {
    let text = std::fs::read(file).unwrap_or_default();
    String::from_utf8_lossy(&text)
        .strip_prefix("count ")
        .and_then(|t| t.split('\n').next()?.trim().parse().ok())
        .unwrap_or(0)
}

/// A file the job writes through a shared mapping (no fd open: CRIU records it with no open
/// flags) keeps its size and need not change its time: recorded with a digest, a rewrite after
/// the snapshot is refused by name, with or without --truncate-grown, and nothing is touched.
#[test]
fn a_file_written_through_a_shared_mapping_is_checked_by_its_contents() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let file = sim.dir.join("state.map");
    let child = setsid_command(&artifact("map-writer"))
        .arg(&file)
        .arg("50")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let root = reap_in_background(child);
    sim.adopt(root);
    assert!(wait_until(Duration::from_secs(20), || mapped_count(&file) >= 3));
    let images = dir_of(&sim, "snap");
    let snap = images.to_str().unwrap();
    let out = criu_gpu(
        &sim,
        &c,
        &["dump", &root.to_string(), snap, "--leave-running"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let at = mapped_count(&file);
    assert!(wait_until(Duration::from_secs(20), || mapped_count(&file) >= at + 10));
    signal(root, nix::sys::signal::Signal::SIGKILL);
    wait_gone(root);
    let rec = criu_gpu::job::files::FilesRecord::read(&images)
        .unwrap()
        .expect("the dump recorded the job's files");
    let recorded = rec.files.iter().find(|f| f.path == file);
    let recorded = recorded.unwrap_or_else(|| panic!("{} not recorded: {rec:?}", file.display()));
    assert!(recorded.mapped && recorded.digest.is_some(), "{recorded:?}");
    let now = std::fs::read(&file).unwrap();
    for extra in [&[][..], &["--truncate-grown"][..]] {
        let mut args = vec!["restore", snap];
        args.extend_from_slice(extra);
        let out = criu_gpu(&sim, &c, &args, &[]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {t}");
        let want = format!("{} was rewritten since the snapshot", file.display());
        assert!(t.contains(&want), "{want:?} missing from:\n{t}");
        assert_eq!(std::fs::read(&file).unwrap(), now, "nothing touched");
    }
}

/// Whether `pid` holds a lock on one of its files: a `lock:` line in its fdinfo, as CRIU reads.
fn fdinfo_locks(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .map(|d| {
            d.flatten()
                .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                .map(|info| info.lines().filter(|l| l.starts_with("lock:")).count())
                .sum()
        })
        .unwrap_or(0)
}

/// `criu-gpu dump` chooses --file-locks for every kind of lock CRIU refuses to dump without it,
/// whatever pid /proc/locks names: an flock, a POSIX and an OFD lock, a lease, a POSIX lock taken
/// by a second thread, and an flock taken by the `flock` command on a file description the job
/// inherited (the containers runner's bare process held its script's lock that way, and its
/// dump failed: "Some file locks are hold by dumping tasks!"). Each job, a locking process and
/// its GPU process, is dumped and restored, the lock held again.
#[test]
fn every_kind_of_file_lock_the_job_holds_is_dumped_and_restored() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    for kind in [
        "flock",
        "posix",
        "ofd",
        "lease",
        "posix-thread",
        "inherited-flock",
    ] {
        let gpu = App {
            pid: 0,
            log: sim.dir.join(format!("gpu-{kind}.log")),
        };
        let child = setsid_command(&artifact("lock-hold"))
            .arg(kind)
            .arg(sim.dir.join(format!("{kind}.lock")))
            .arg(artifact("cuda-sim-app"))
            .args(["--mib", "8", "--interval-ms", "50", "--log"])
            .arg(&gpu.log)
            .envs(sim.env())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let root = reap_in_background(child);
        sim.adopt(root);
        assert!(
            wait_until(Duration::from_secs(20), || gpu.steps() >= 2),
            "{kind}: {}",
            gpu.tail()
        );
        assert!(fdinfo_locks(root) > 0, "{kind}: the lock is held");
        let pids = process_facts::process::tree(root);
        pids.iter().for_each(|p| sim.adopt(*p));
        let images = dir_of(&sim, &format!("img-{kind}"));
        let out = criu_gpu(
            &sim,
            &c,
            &["dump", &root.to_string(), images.to_str().unwrap()],
            &[],
        );
        let t = text(&out);
        assert!(out.status.success(), "{kind}: {t}");
        assert!(t.contains("option: --file-locks"), "{kind}: {t}");
        pids.iter().for_each(|p| wait_gone(*p));
        let out = criu_gpu(&sim, &c, &["restore", images.to_str().unwrap()], &[]);
        assert!(out.status.success(), "{kind}: {}", text(&out));
        assert!(gpu.advances(3), "{kind}: {}", gpu.tail());
        gpu.assert_healthy();
        assert!(fdinfo_locks(root) > 0, "{kind}: the lock is held again");
        for p in pids.iter().rev() {
            signal(*p, nix::sys::signal::Signal::SIGKILL);
        }
        pids.iter().for_each(|p| wait_gone(*p));
    }
}

/// `criu-gpu restore --address-map` on one node: the job's connections (its ring on 127.0.0.1,
/// its ranks' connections to a store on `[::]`, IPv4-mapped) move to 127.0.0.2 on both ends and
/// go on there. A CRIU without UPDATE_INETSK (stock 4.2.1) is refused first, naming the fix;
/// the project's CRIU behind a wrapper script (as pack-carry.sh carries it) is known to have it.
#[test]
fn a_restore_with_an_address_map_moves_the_jobs_connections() {
    use process_facts::process::{tcp_sockets, TcpState};
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let job = start_job(&mut sim, None, 2, &NCCL_SOCKETS_ONLY);
    let images = dir_of(&sim, "img");
    let out = job.dump(&sim, &c, &images, &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.gone();
    let dir = images.to_str().unwrap();
    let work = dir_of(&sim, "work");
    let map = [
        "restore",
        dir,
        "--address-map",
        "127.0.0.1=127.0.0.2",
        "--work-dir",
        work.to_str().unwrap(),
    ];
    let stock = Criu {
        bin: criu::STOCK.into(),
        plugins: c.plugins.clone(),
    };
    let out = criu_gpu(&sim, &stock, &map, &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("lacks the UPDATE_INETSK plugin hook"), "{t}");
    let wrapper = dir_of(&sim, "criu-wrapper");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec {} \"$@\"\n", c.bin.display()),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let wrapped = Criu {
        bin: wrapper,
        plugins: c.plugins.clone(),
    };
    let out = criu_gpu(&sim, &wrapped, &map, &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.advances(5);
    let inodes: Vec<u64> = job
        .pids
        .iter()
        .flat_map(|p| process_facts::process::socket_inodes(*p))
        .collect();
    let moved: Vec<_> = tcp_sockets(job.root)
        .into_iter()
        .filter(|s| s.state == TcpState::Established && inodes.contains(&s.inode))
        .map(|s| (s.local.ip().to_string(), s.remote.ip().to_string()))
        .collect();
    assert!(!moved.is_empty());
    for (l, r) in &moved {
        assert!(
            l.ends_with("127.0.0.2") && r.ends_with("127.0.0.2"),
            "{moved:?}"
        );
    }
    let log = std::fs::read_to_string(work.join("restore.log")).unwrap();
    assert!(log.contains("criu_gpu: moved "), "{log}");
}
