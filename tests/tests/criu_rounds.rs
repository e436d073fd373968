//! Ranks that wait for each other on the GPU, locked in rounds: a simulated two-rank job whose
//! every step ends in a collective (`cuda-sim-app --ranks 2 --collective-ms`), training flat out.
//! Rank 1 is held before a step (a slow host-side step) while rank 0's collective waits for it:
//! one lock of both at once then fails, as it does on r580 (docs/driver-facts.md, F18); rounds
//! lock both once rank 1 goes on. Through `criu-gpu dump` (the plugin in CRIU) and through
//! `cuda-checkpoint-ctl --suspend --tree`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_ckpt_tests::criu::Criu;
use gpu_ckpt_tests::job::*;
use gpu_ckpt_tests::*;

/// A two-rank job training flat out, every step a 5 ms collective, that looks like NCCL ranks
/// talking over sockets.
fn collective_job(sim: &mut Sim) -> (Job, PathBuf) {
    let lib = fake_nccl(&sim.dir);
    let preload = lib.display().to_string();
    let hold = sim.dir.join("hold");
    let mut env = NCCL_SOCKETS_ONLY.to_vec();
    env.push(("LD_PRELOAD", &preload));
    let job = start_job_with(
        sim,
        None,
        2,
        &env,
        &[
            "--interval-ms",
            "0",
            "--collective-ms",
            "5",
            "--hold",
            hold.to_str().unwrap(),
        ],
    );
    (job, hold)
}

/// Holds rank 1 before its next step, with rank 0 waiting in that step's collective.
fn hold_rank1(job: &Job, hold: &Path) -> PathBuf {
    let file = PathBuf::from(format!("{}.rank1", hold.display()));
    std::fs::write(&file, "").unwrap();
    // A step under way when the file appeared ends first.
    let stalled = |app: &App| {
        wait_until(Duration::from_secs(20), || {
            app.stalls_for(Duration::from_millis(300))
        })
    };
    assert!(
        stalled(&job.ranks[1]),
        "rank 1 is held: {}",
        job.ranks[1].tail()
    );
    assert!(
        stalled(&job.ranks[0]),
        "rank 0 waits for rank 1 in a collective: {}",
        job.ranks[0].tail()
    );
    file
}

/// Lets rank 1 go on after `after`, from another thread.
fn release_after(file: PathBuf, after: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        std::fs::remove_file(file).unwrap();
    })
}

fn log_text(images: &Path) -> String {
    std::fs::read_to_string(images.join("dump.log")).unwrap_or_default()
}

#[test]
fn one_lock_of_ranks_that_wait_for_each_other_fails_and_rounds_lock_them() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let c = Criu::new(&sim);
    let (job, hold) = collective_job(&mut sim);
    job.advances(20);

    // The old way: both locked at once, once. Rank 1 locks at once (it is between steps), rank
    // 0's collective never finishes.
    let held = hold_rank1(&job, &hold);
    let once = dir_of(&sim, "once");
    let out = job.dump(
        &sim,
        &c,
        &once,
        &[
            ("CRIU_GPU_LOCK_ROUNDS", "0"),
            ("CRIU_GPU_LOCK_TIMEOUT_MS", "1000"),
        ],
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let pid0 = job.pids[1];
    assert!(
        t.contains(&format!("GPU work in process {pid0} ")) && t.contains("did not finish"),
        "{t}"
    );
    std::fs::remove_file(&held).unwrap();
    job.advances(20);

    // Rounds: the first ones fail while rank 1 is held; once it goes on, a round locks both.
    let held = hold_rank1(&job, &hold);
    let go_on = release_after(held, Duration::from_millis(800));
    let images = dir_of(&sim, "rounds");
    let out = job.dump(&sim, &c, &images, &[]);
    go_on.join().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}\n{}", log_text(&images));
    let log = log_text(&images);
    let line = log
        .lines()
        .find(|l| l.contains("locked 2 CUDA processes at once after"))
        .unwrap_or_else(|| panic!("no rounds line in:\n{log}"));
    let rounds: u32 = line
        .split("after ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(rounds >= 2, "the held rank failed the first round: {line}");
    job.gone();
    let out = criu_gpu(&sim, &c, &["restore", images.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    job.advances(20);
}

#[test]
fn the_ctl_suspends_ranks_that_wait_for_each_other_in_rounds() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let (job, hold) = collective_job(&mut sim);
    job.advances(20);
    let tree = job.root.to_string();

    let held = hold_rank1(&job, &hold);
    let out = sim.ctl(&[
        "--suspend",
        "--tree",
        &tree,
        "--lock-rounds",
        "off",
        "--timeout",
        "1000",
    ]);
    let t = format!("{}{}", stdout(&out), stderr(&out));
    assert_ne!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("did not finish within 1000 ms"), "{t}");
    for p in &job.pids[1..] {
        assert_eq!(sim.state(*p), "running", "{t}");
    }
    std::fs::remove_file(&held).unwrap();
    job.advances(20);

    let held = hold_rank1(&job, &hold);
    let go_on = release_after(held, Duration::from_millis(800));
    let out = sim.ctl_env(&["--suspend", "--tree", &tree, "-v"], &[]);
    go_on.join().unwrap();
    let t = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("locked 2 CUDA processes at once after"), "{t}");
    for p in &job.pids[1..] {
        assert_eq!(sim.state(*p), "checkpointed", "{t}");
    }
    let out = sim.ctl(&["--resume", "--tree", &tree]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    job.advances(20);
}
