//! Live migration without a disk on the simulated GPU, with the real CRIU (the project's, patch
//! 0014): `criu-gpu dump PID DIR --to B:PORT` on node A, `criu-gpu restore DIR --listen PORT`
//! on node B (two namespace nodes of one machine), the pages streamed while B restores. A move
//! that fails anywhere leaves the job running on A and nothing of it on B.

use gpu_ckpt_tests::migrate::*;
use gpu_ckpt_tests::*;
use std::process::Child;
use std::time::Duration;

/// The lazy-pages daemon pauses 50 ms after each answer (CRIU fault injection 141): a stream
/// that lasts seconds, to act in the middle of.
const SLOW_STREAM: (&str, &str) = ("CRIU_FAULT", "141");

#[test]
fn a_gpu_process_moves_to_node_b_and_its_gpu_while_its_pages_stream() {
    let mut m = Move::up("1GiB");
    let job = m.start(
        "n0",
        "app",
        &["--mib", "192", "--device", "0", "--interval-ms", "50"],
    );
    let map = m.device_map(&[(0, 1)]);
    let b = m.listen(&["--device-map", &map], &[SLOW_STREAM]);
    let a = m.send(job.root, &[], &[]);
    let (a, b) = m.outcome(b, a);
    let (ta, tb) = (cluster::text(&a), cluster::text(&b));
    assert!(a.status.success(), "{ta}");
    assert!(b.status.success(), "{tb}");
    // Node A's tasks ended once B ran the job; B's root is another process.
    for p in &job.pids {
        wait_gone(*p);
    }
    let root = landed_root(&ta);
    m.sim.adopt(root);
    assert!(!job.pids.contains(&root), "{ta}");
    // The data came through: the moved process verifies its device data every step.
    assert!(job.app.advances(3), "{}", job.app.tail());
    job.app.assert_healthy();
    // On GPU 1 now, nothing left on GPU 0.
    assert!(m.used(1) >= 192 << 20, "{:?}", m.sim.gpus());
    assert_eq!(m.used(0), 0, "{:?}", m.sim.gpus());
    // The GPU driver's restore began while pages still arrived, and read its data through
    // faults served before the stream's own requests.
    let at = |what: &str| -> f64 {
        ta.lines()
            .find(|l| l.contains(what))
            .and_then(|l| l.trim().strip_prefix('+')?.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {what:?} step in:\n{ta}"))
    };
    assert!(
        at("the GPU driver's restore starts there") < at("every page there"),
        "{ta}"
    );
    let faults: u64 = tb
        .lines()
        .find_map(|l| l.split_once("GB/s); ")?.1.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no stream summary in:\n{tb}"));
    assert!(faults > 0, "{tb}");
    assert!(ta.contains("downtime"), "{ta}");
    // No pages image on either side: the pages went over the network only.
    for dir in [&m.from, &m.into] {
        let pages: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
            .filter(|e| e.metadata().is_ok_and(|md| md.len() > 1 << 20))
            .collect();
        assert!(pages.is_empty(), "{}: {pages:?}", dir.display());
    }
}

#[test]
fn a_connection_cut_mid_stream_leaves_the_job_on_a_and_nothing_on_b() {
    let (m, job, b, a) = a_slow_move_under_way();
    m.cable(false);
    let (a, b) = m.outcome(b, a);
    m.cable(true);
    let tb = cluster::text(&b);
    assert!(
        tb.contains("nothing of the job was left on this node"),
        "{tb}"
    );
    assert_left_on_a(&m, &job, &a, &b);
}

#[test]
fn b_without_room_on_its_gpu_refuses_before_a_freezes_anything() {
    let mut m = Move::up("256MiB");
    let job = m.start(
        "n0",
        "app",
        &["--mib", "128", "--device", "0", "--interval-ms", "50"],
    );
    // GPU 1 is busy with another process: the job's 128 MiB do not fit beside it.
    let hog = m.sim.app("hog", &["--mib", "160", "--device", "1"]);
    let map = m.device_map(&[(0, 1)]);
    let b = m.listen(&["--device-map", &map], &[]);
    let before = job.app.steps();
    let a = m.send(job.root, &[], &[]);
    let (a, b) = m.outcome(b, a);
    let (ta, tb) = (cluster::text(&a), cluster::text(&b));
    assert!(!a.status.success(), "{ta}");
    assert!(!b.status.success(), "{tb}");
    assert!(
        ta.contains("refused the job before anything was frozen")
            && ta.contains("does not fit on this node's GPUs"),
        "{ta}"
    );
    // CRIU never ran on A: no dump log, nothing frozen; the job went on all along.
    assert!(!m.from.join("dump.log").exists(), "{ta}");
    assert!(!ta.contains("running: "), "{ta}");
    assert!(job.app.advances(3), "{}", job.app.tail());
    assert!(job.app.steps() > before);
    job.app.assert_healthy();
    hog.assert_healthy();
    assert_eq!(m.strangers(&job), Vec::<i32>::new());
}

#[test]
fn b_s_criu_killed_mid_stream_a_resumes_and_b_keeps_nothing() {
    let (m, job, b, a) = a_slow_move_under_way();
    let criu = m.receiver_criu().expect("node B's criu restore runs");
    signal(criu, nix::sys::signal::Signal::SIGKILL);
    let (a, b) = m.outcome(b, a);
    assert_left_on_a(&m, &job, &a, &b);
}

/// A process of 128 MiB on node A's GPU 0 moving to GPU 1 of node B, its pages streaming
/// slowly (SLOW_STREAM): returns once B has the first of them in place.
fn a_slow_move_under_way() -> (Move, Moving, std::process::Child, std::process::Child) {
    let mut m = Move::up("1GiB");
    let job = m.start(
        "n0",
        "app",
        &["--mib", "128", "--device", "0", "--interval-ms", "50"],
    );
    let map = m.device_map(&[(0, 1)]);
    let b = m.listen(&["--device-map", &map], &[SLOW_STREAM]);
    let a = m.send(job.root, &[], &[]);
    assert!(
        wait_until(Duration::from_secs(60), || m
            .receiver_logged("GiB in place")),
        "the stream did not start"
    );
    (m, job, b, a)
}

/// A failed move: both sides say so, the job runs on at A (the same processes, its data whole),
/// and nothing of it is on B, nor on B's GPU.
fn assert_left_on_a(m: &Move, job: &Moving, a: &std::process::Output, b: &std::process::Output) {
    let (ta, tb) = (cluster::text(a), cluster::text(b));
    assert!(!a.status.success(), "{ta}");
    assert!(!b.status.success(), "{tb}");
    assert!(ta.contains("it runs on here"), "{ta}");
    for p in &job.pids {
        assert!(pid_alive(*p), "{p} is gone: {ta}");
    }
    assert!(job.app.advances(3), "{}", job.app.tail());
    job.app.assert_healthy();
    assert_eq!(m.strangers(job), Vec::<i32>::new());
    assert!(
        wait_until(Duration::from_secs(10), || m.used(1) == 0),
        "{:?}",
        m.sim.gpus()
    );
}

/// Node B's lazy-pages daemon killed once B's restore holds the job's tasks (traced, their late
/// hooks run) and the pages still stream: B's restore fails and kills what it restored, and the
/// job runs on at A, its connections too. The job's root, init of its pid namespace, has
/// threads of its own, as a torch launcher has: its last thread ends only once every other task
/// and thread of the namespace is reaped, and B's CRIU, waiting for that thread before reaping
/// the others, waited for ever (until criu-gpu's bound on it, 10 minutes, as a torch DDP job's
/// failed move did). A's CRIU resumed the tasks but kept their connections locked.
#[test]
fn b_s_lazy_pages_daemon_killed_with_the_tasks_in_hand_b_gives_up_at_once() {
    let mut m = Move::up("1GiB");
    let job = m.start(
        "n0",
        "job",
        &two_ranks(&["--mib", "16", "--parent-threads", "2"]),
    );
    let map = m.device_map(&[(0, 1), (1, 0)]);
    let b = m.listen(&["--device-map", &map], &[SLOW_STREAM]);
    let a = m.send(job.root, &[], &[]);
    let restore_log = m.into.join("restore.log");
    assert!(
        wait_until(Duration::from_secs(60), || std::fs::read_to_string(
            &restore_log
        )
        .is_ok_and(|t| t.contains("Run late stage hook"))),
        "node B's restore did not take the tasks in hand"
    );
    assert!(!m.receiver_logged("task(s) in place"), "the stream ended");
    let daemon = m
        .receiver_lazy_pages()
        .expect("node B's lazy-pages daemon runs");
    let killed = std::time::Instant::now();
    signal(daemon, nix::sys::signal::Signal::SIGKILL);
    let (a, b) = m.outcome(b, a);
    let (ta, tb) = (cluster::text(&a), cluster::text(&b));
    assert!(
        killed.elapsed() < Duration::from_secs(60),
        "{:?} for both sides to give up:\n{ta}\n{tb}",
        killed.elapsed()
    );
    assert!(!a.status.success(), "{ta}");
    assert!(!b.status.success(), "{tb}");
    assert!(ta.contains("it runs on here"), "{ta}");
    for p in &job.pids {
        assert!(pid_alive(*p), "{p} is gone: {ta}");
    }
    // Each step goes through the ranks' connections: they are not locked any more.
    for r in 0..2 {
        let rank = rank_log(&job, r);
        assert!(rank.advances(3), "rank {r}: {}", rank.tail());
        rank.assert_healthy();
    }
    assert_eq!(m.strangers(&job), Vec::<i32>::new());
}

#[test]
fn a_two_rank_job_moves_and_ends_as_an_uninterrupted_run_does() {
    const STEPS: u64 = 60;
    let mut m = Move::up("1GiB");
    let args = |steps: &str| -> Vec<String> {
        [
            "--ranks",
            "2",
            "--mib",
            "16",
            "--shm-mib",
            "4",
            "--device",
            "0",
        ]
        .into_iter()
        .chain(["--interval-ms", "50", "--steps", steps])
        .map(str::to_owned)
        .collect()
    };
    let steps = STEPS.to_string();
    let a: Vec<String> = args(&steps);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    // The same job, never moved, on node B first: what the moved one must end with.
    let reference = m.start("n1", "reference", &a);
    let ref_log = reference.app.log.clone();
    assert!(
        wait_until(Duration::from_secs(90), || fnv_at(&ref_log, STEPS)
            .is_some()),
        "{}",
        reference.app.tail()
    );
    let unmoved1 = ref_log.with_extension("rank1");
    assert!(
        wait_until(Duration::from_secs(30), || fnv_at(&unmoved1, STEPS)
            .is_some()),
        "{}",
        reference.app.tail()
    );
    let job = m.start("n0", "job", &a);
    // Rank 0 on GPU 0 and rank 1 on GPU 1 of node A; on node B the other way round.
    let map = m.device_map(&[(0, 1), (1, 0)]);
    let b = m.listen(&["--device-map", &map], &[]);
    let s = m.send(job.root, &[], &[]);
    let (s, b) = m.outcome(b, s);
    assert!(s.status.success(), "{}", cluster::text(&s));
    assert!(b.status.success(), "{}", cluster::text(&b));
    for p in &job.pids {
        wait_gone(*p);
    }
    m.sim.adopt(landed_root(&cluster::text(&s)));
    for r in 0..2 {
        let moved = job.app.log.with_extension(format!("rank{r}"));
        let unmoved = ref_log.with_extension(format!("rank{r}"));
        assert!(
            wait_until(Duration::from_secs(90), || fnv_at(&moved, STEPS).is_some()),
            "rank {r}: {:?}",
            read_lines(&moved).last()
        );
        assert_eq!(fnv_at(&moved, STEPS), fnv_at(&unmoved, STEPS), "rank {r}");
        App { pid: 0, log: moved }.assert_healthy();
    }
}

/// A lazy dump holds the pages of every task it dumped in pipes until they are sent: with CRIU's
/// pipes at `fs.pipe-max-size` (1 MiB, CRIU without CAP_SYS_RESOURCE), rank 0's 600 MiB (its
/// 300 MiB of device memory and the copy it checks them against) are 1200 fds. The connections
/// of rank 1, dumped after it, are locked through libnftables, whose select() on its netlink
/// socket aborted CRIU once that socket's fd passed FD_SETSIZE (1024): a torch DDP job (hundreds
/// of MiB per process) could not move.
#[test]
fn a_job_whose_pages_fill_more_than_1024_fds_of_pipes_moves() {
    let mut m = Move::up("1GiB");
    let job = m.start("n0", "job", &two_ranks(&["--mib", "300"]));
    let map = m.device_map(&[(0, 1), (1, 0)]);
    let b = m.listen(&["--device-map", &map], &[]);
    let a = m.send_without_sys_resource(job.root);
    assert_both_ranks_moved(&mut m, &job, a, b);
}

/// A job whose heap is fragmented as torch's allocators leave one: every other page of 64 MiB
/// written in each rank, 8192 runs of pages. The stream asks node A's page server for each run
/// it reads; while that page server waits to send its answers it reads no request, and the
/// lazy-pages daemon's requests, unbounded in number, filled the connection until its
/// non-blocking send failed ("Can't send PSI 7 to server: Resource temporarily unavailable"):
/// the move failed, as a torch DDP job's did now and then.
#[test]
fn a_job_with_a_fragmented_heap_moves() {
    let mut m = Move::up("1GiB");
    let job = m.start(
        "n0",
        "job",
        &two_ranks(&["--mib", "16", "--sparse-mib", "64"]),
    );
    let map = m.device_map(&[(0, 1), (1, 0)]);
    let b = m.listen(&["--device-map", &map], &[]);
    let a = m.send(job.root, &[], &[]);
    assert_both_ranks_moved(&mut m, &job, a, b);
}

/// `--ranks 2 MORE` on GPUs 0 and 1, a step every 50 ms.
fn two_ranks<'a>(more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--ranks", "2", "--device", "0", "--interval-ms", "50"];
    args.extend_from_slice(more);
    args
}

/// The move of a two-rank job succeeded: node A's tasks are gone, and both ranks go on on node
/// B (each step checks the rank's data, connections and shared file; a step of hundreds of MiB
/// takes seconds on a loaded machine).
fn assert_both_ranks_moved(m: &mut Move, job: &Moving, a: Child, b: Child) {
    let (a, b) = m.outcome(b, a);
    let (ta, tb) = (cluster::text(&a), cluster::text(&b));
    assert!(a.status.success(), "{ta}");
    assert!(b.status.success(), "{tb}");
    for p in &job.pids {
        wait_gone(*p);
    }
    m.sim.adopt(landed_root(&ta));
    for r in 0..2 {
        let rank = rank_log(job, r);
        let moved_at = rank.steps();
        assert!(
            wait_until(Duration::from_secs(90), || rank.steps() >= moved_at + 3),
            "rank {r}: {}",
            rank.tail()
        );
        rank.assert_healthy();
    }
}

/// Rank `r`'s log of a job started with `--ranks`.
fn rank_log(job: &Moving, r: usize) -> App {
    App {
        pid: 0,
        log: job.app.log.with_extension(format!("rank{r}")),
    }
}
