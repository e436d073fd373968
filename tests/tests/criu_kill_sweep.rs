//! CRIU SIGKILLed at instants spread over whole dumps, `--leave-running` dumps and restores, of
//! a CUDA process, a tree of three, a job with TCP connections and a process beside an io_uring
//! loop: at CRIU's own log stages (each stage of its parasite at several short delays) and by
//! time. After every kill of a dump, every process runs its own code with its data and its GPU
//! state is back (a dump killed after it began to end the dumped tree has complete images: the
//! rest of the tree is ended and the images restore). After every kill of a restore, no
//! half-restored process is left, the images are as they were, and a second restore works.
//! Each test prints the instants it sampled and its counts; kills and survivors must be equal.
//!
//! KILL_SWEEP_POINTS=N: dump instants per workload (default 54: with the restores, over 200 kills
//! in all; 0: every instant found),
//! KILL_SWEEP_RESTORES=N: restore instants (default 6; 0: all), KILL_SWEEP_AT='A|B': these dump
//! instants only (as printed), to see one again.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gpu_ckpt_tests::job::text;
use gpu_ckpt_tests::sweep::{self, Kind, Workload};
use gpu_ckpt_tests::*;

/// The stages of CRIU's parasite, in the order a task meets them: each at every delay.
const PARASITE: &[&str] = &[
    "Set up parasite blob",
    "Putting parasite blob",
    "Putting tsock",
    "switched to daemon mode",
    "Transferring pages",
    "Dumping core (pid",
    "Waiting for",
    "exited trapping",
    "Sent msg to daemon 3 ",
    "is going to execute the syscall 15",
    "was stopped",
    "Dumping core for thread",
    "Dumping mm",
];

/// The rest of a dump, from the first seize to the end.
const DUMP: &[&str] = &[
    "Seized task",
    "hook 10",
    "locked",
    "hook 11",
    "checkpointed",
    "Lock network",
    "Dumping task (pid",
    "Turning repair on",
    "Writing image inventory",
    "Running post-dump",
    "Unlock network",
    "time in the plugin",
    "Unseizing",
];

/// A restore, from its first step to the tasks running.
const RESTORE: &[&str] = &[
    "Forking task",
    "Restoring resources",
    "Run late stage hook",
    "restored CUDA state",
    "Restore finished successfully",
    "Running post-resume",
];

const DELAYS_US: &[u64] = &[0, 40, 200, 1000];

fn budget(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the kills of one workload came to.
#[derive(Default)]
struct Tally {
    kills: usize,
    /// The workload ran on with its data.
    lived: usize,
    /// The dump was complete: the workload came back from its images.
    restored: usize,
    /// The instant was not reached in that run.
    missed: Vec<String>,
    /// Kills that left parasite memory in a process.
    leftovers: Vec<String>,
    lost: Vec<String>,
    /// Time in the killed dumps and restores, and in the checks after them.
    in_criu: Duration,
    in_checks: Duration,
}

#[test]
fn a_cuda_process_lives_whenever_criu_is_killed() {
    sweep_workload(Kind::Cuda);
}

#[test]
fn a_tree_of_three_lives_whenever_criu_is_killed() {
    sweep_workload(Kind::Tree);
}

#[test]
fn a_job_with_tcp_connections_lives_whenever_criu_is_killed() {
    sweep_workload(Kind::Job);
}

#[test]
fn a_process_beside_an_io_uring_loop_lives_whenever_criu_is_killed() {
    sweep_workload(Kind::Uring);
}

fn sweep_workload(kind: Kind) {
    let start = Instant::now();
    let mut w = Workload::start(kind);
    let images = sweep::images(&w);
    let out = w.dump(&images, true, None);
    assert!(out.status.success(), "{}", text(&out));
    w.lives().unwrap();
    let log = sweep::log_of(&images, "dump.log");
    let mut points = sweep::stage_points(&log, PARASITE, DELAYS_US);
    points.extend(sweep::stage_points(&log, DUMP, &[0, 200]));
    points.extend(sweep::time_points(&log, 12));
    let chosen = match std::env::var("KILL_SWEEP_AT") {
        Ok(at) => at.split('|').map(str::to_owned).collect(),
        Err(_) => sweep::sample(&points, budget("KILL_SWEEP_POINTS", 54), kind as usize),
    };
    println!(
        "{kind:?}: {} of {} dump instants (stage#occurrence+µs; +µs: time since CRIU started), \
         every other one with --leave-running: {chosen:?}",
        chosen.len(),
        points.len()
    );
    let mut t = Tally::default();
    for (i, at) in chosen.iter().enumerate() {
        // CRIU unlocks the network of tasks it leaves running only
        let leave_running = i % 2 == 1 || at.starts_with("Unlock network");
        kill_dump(&mut w, at, leave_running, &mut t);
    }
    restores(&mut w, &mut t);
    report(kind, &t, start.elapsed());
}

/// One dump killed `at`, and what it left.
fn kill_dump(w: &mut Workload, at: &str, leave_running: bool, t: &mut Tally) {
    let images = sweep::images(w);
    let mode = if leave_running {
        "--leave-running"
    } else {
        "dump"
    };
    let leftovers = w.parasite_leftovers();
    let started = Instant::now();
    let out = w.dump(&images, leave_running, Some(at));
    t.in_criu += started.elapsed();
    if !sweep::was_killed(&out) {
        t.missed.push(format!("{at} ({mode})"));
        if out.status.success() && !leave_running {
            back_from_images(w, &images, at, t);
        }
        return;
    }
    t.kills += 1;
    let started = Instant::now();
    let lives = w.lives();
    t.in_checks += started.elapsed();
    match lives {
        Ok(()) => {
            t.lived += 1;
            if w.parasite_leftovers() > leftovers {
                t.leftovers.push(format!("{at} ({mode})"));
            }
        }
        Err(_) if !leave_running && sweep::dump_committed(&images) => {
            // Killed while it ended the dumped tree: the images are complete.
            w.kill_all();
            if back_from_images(w, &images, at, t) {
                t.restored += 1;
            }
        }
        Err(e) => lose(w, t, format!("dump killed at {at} ({mode}): {e}")),
    }
}

/// The workload restored from `images`: true if it runs with its data.
fn back_from_images(w: &mut Workload, images: &Path, at: &str, t: &mut Tally) -> bool {
    for p in &w.pids {
        wait_gone(*p);
    }
    w.judge_from_now();
    let out = w.restore(images, None);
    let lives = w.lives();
    if out.status.success() && lives.is_ok() {
        return true;
    }
    lose(
        w,
        t,
        format!("restore after the dump at {at}: {lives:?} {}", text(&out)),
    );
    false
}

/// Records a loss and starts the workload again, so that the sweep goes on.
fn lose(w: &mut Workload, t: &mut Tally, what: String) {
    println!("LOST: {what}");
    t.lost.push(what);
    w.kill_all();
    *w = Workload::start(w.kind);
}

/// Restores killed at instants of a reference restore: each leaves no half-restored process
/// and the images as they were, and a second restore works.
fn restores(w: &mut Workload, t: &mut Tally) {
    let images = sweep::images(w);
    let log = dump_and_restore(w, &images, t);
    let mut points = sweep::stage_points(&log, RESTORE, &[0, 200]);
    points.extend(sweep::time_points(&log, 6));
    let chosen = sweep::sample(&points, budget("KILL_SWEEP_RESTORES", 6), w.kind as usize);
    println!("{:?}: restore instants {chosen:?}", w.kind);
    for at in &chosen {
        let out = w.dump(&images, false, None);
        assert!(out.status.success(), "{}", text(&out));
        for p in &w.pids {
            wait_gone(*p);
        }
        let before = tree_digest(&images);
        let started = Instant::now();
        let out = w.restore(&images, Some(at));
        t.in_criu += started.elapsed();
        if !sweep::was_killed(&out) {
            t.missed.push(format!("{at} (restore)"));
            continue;
        }
        t.kills += 1;
        let started = Instant::now();
        let after = after_killed_restore(w, &images, &before);
        t.in_checks += started.elapsed();
        if let Err(e) = after {
            lose(w, t, format!("restore killed at {at}: {e}"));
        } else {
            t.lived += 1;
        }
    }
}

/// A dump that ends the workload and its restore; the restore's log.
fn dump_and_restore(w: &mut Workload, images: &Path, t: &mut Tally) -> String {
    let out = w.dump(images, false, None);
    assert!(out.status.success(), "{}", text(&out));
    assert!(back_from_images(w, images, "(reference)", t));
    sweep::log_of(&w.restore_work(), "restore.log")
}

/// Nothing half-restored is left (all gone, or all running if the restore had finished), the
/// images are unchanged, and the workload restores (again) and runs with its data.
fn after_killed_restore(
    w: &Workload,
    images: &Path,
    before: &BTreeMap<String, Vec<u8>>,
) -> Result<(), String> {
    let gone = wait_until(Duration::from_secs(20), || w.alive().is_empty());
    let after = tree_digest(images);
    if &after != before {
        return Err(format!(
            "the images changed: {:?}",
            after
                .keys()
                .filter(|k| before.get(*k) != after.get(*k))
                .collect::<Vec<_>>()
        ));
    }
    if !gone {
        return w
            .lives()
            .map_err(|e| format!("processes {:?} left: {e}", w.alive()));
    }
    let out = w.restore(images, None);
    if !out.status.success() {
        return Err(format!("the second restore failed: {}", text(&out)));
    }
    w.lives()
}

/// Every file under `dir` and its bytes.
fn tree_digest(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            for (k, v) in tree_digest(&p) {
                files.insert(format!("{}/{k}", e.file_name().to_string_lossy()), v);
            }
        } else {
            let bytes = std::fs::read(&p).unwrap_or_default();
            files.insert(e.file_name().to_string_lossy().into_owned(), bytes);
        }
    }
    files
}

fn report(kind: Kind, t: &Tally, took: Duration) {
    let survivors = t.lived + t.restored;
    println!(
        "{kind:?}: {} kills, {survivors} survivors ({} ran on, {} came back from their \
         complete images), {} instant(s) not reached: {:?}; {} kill(s) left parasite memory: \
         {:?}; {:.0} s ({:.0} s in the killed runs, {:.0} s in the checks after them)",
        t.kills,
        t.lived,
        t.restored,
        t.missed.len(),
        t.missed,
        t.leftovers.len(),
        t.leftovers,
        took.as_secs_f64(),
        t.in_criu.as_secs_f64(),
        t.in_checks.as_secs_f64()
    );
    assert!(t.lost.is_empty(), "{kind:?}: lost:\n{}", t.lost.join("\n"));
    assert_eq!(t.kills, survivors);
    if std::env::var_os("KILL_SWEEP_POINTS").is_none()
        && std::env::var_os("KILL_SWEEP_AT").is_none()
    {
        assert!(
            t.kills >= 50,
            "{kind:?}: only {} kills: a CRIU without the project's patch 0011 ignores \
             CRIU_KILL_AT (run scripts/install-criu.sh, or set CRIU=)",
            t.kills
        );
    }
}
