//! CRIU SIGKILLed at instants spread over whole dumps, `--leave-running` dumps and restores, of
//! a CUDA process, a tree of three, a job with TCP connections and a process beside an io_uring
//! loop: at CRIU's own log stages (each stage of its parasite at several short delays) and by
//! time. After every kill of a dump, every process runs its own code with its data and its GPU
//! state is back (a dump killed after it began to end the dumped tree has complete images: the
//! rest of the tree is ended and the images restore). After every kill of a restore, no
//! half-restored process is left (seen the moment `criu-gpu restore` returns, which says what
//! it left), the images are as they were, and a second restore works. Each test prints the
//! instants it sampled and its counts; kills and survivors must be equal.
//!
//! A run samples the instants (54 kills a workload, 216 in all, to fit CI's time). Knobs:
//! KILL_SWEEP_POINTS=N: dump instants per workload (default 48; 0: every instant found),
//! KILL_SWEEP_RESTORES=N: restore instants besides the two every run has (default 4; 0: all);
//! `KILL_SWEEP_POINTS=0 KILL_SWEEP_RESTORES=0` is the whole sweep.
//! KILL_SWEEP_AT='A|B', KILL_SWEEP_RESTORE_AT='A|B': these dump (restore) instants only, as
//! printed, to see one again (a name repeated: that many times; empty: none).

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
    "Dumped tasks now die with criu",
    "Unseizing",
];

/// A restore, from its first fork to the tasks running: CRIU's own lines (the restored tasks'
/// own steps are CRIU's waits between these, reached by time).
const RESTORE: &[&str] = &[
    "Forking task",
    "PID: real",
    "Running post-restore",
    "Unlock network",
    "was trapped",
    "is going to execute the syscall 15",
    "Run late stage hook",
    "restored CUDA state",
    "Running pre-resume",
    "Restore finished successfully",
    "Running post-resume",
];

/// Instants a run samples of each workload's (KILL_SWEEP_POINTS, KILL_SWEEP_RESTORES): with
/// ROOT_JUST_FORKED, 54 kills a workload, 216 a run, which take 4 to 6 minutes on a 2-CPU
/// machine under load (docs/known-limits.md).
const DUMP_SAMPLE: usize = 48;
const RESTORE_SAMPLE: usize = 4;

/// Restore instants in every run: CRIU killed the moment after it forked the tree's root (its
/// log line right after the fork, and 200 µs after the one before it), before the plugin's
/// guardian has read the kernel's report of that fork: the root, handed to a reaper, was once
/// left half-restored.
const ROOT_JUST_FORKED: &[&str] = &["PID: real#1+0", "Forking task#1+200"];

const DELAYS_US: &[u64] = &[0, 40, 200, 1000];

/// The instants named in a replay knob ('A|B'; empty: none).
fn chosen_at(at: &str) -> Vec<String> {
    at.split('|')
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

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
    /// Time in the restore kills, from the first dump to the last check.
    in_restores: Duration,
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
        Ok(at) => chosen_at(&at),
        Err(_) => sweep::sample(
            &points,
            budget("KILL_SWEEP_POINTS", DUMP_SAMPLE),
            kind as usize,
        ),
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
    let started = Instant::now();
    restores(&mut w, &mut t);
    t.in_restores = started.elapsed();
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
            // Killed while it ended the dumped tree: the images are complete, and the kernel
            // ends the rest of the tree with CRIU (patch 0010): none of it may run on.
            if !wait_until(Duration::from_secs(10), || w.alive().is_empty()) {
                let alive = w.alive();
                lose(
                    w,
                    t,
                    format!("dump killed at {at}: {alive:?} ran on while CRIU ended the tree"),
                );
                return;
            }
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
    let chosen = match std::env::var("KILL_SWEEP_RESTORE_AT") {
        Ok(at) => chosen_at(&at),
        Err(_) => {
            let mut chosen = sweep::sample(
                &points,
                budget("KILL_SWEEP_RESTORES", RESTORE_SAMPLE),
                w.kind as usize,
            );
            chosen.extend(ROOT_JUST_FORKED.iter().map(|a| a.to_string()));
            chosen
        }
    };
    println!("{:?}: restore instants {chosen:?}", w.kind);
    for at in &chosen {
        let out = w.dump(&images, false, None);
        assert!(out.status.success(), "{}", text(&out));
        for p in &w.pids {
            wait_gone(*p);
        }
        let before = Before {
            images: tree_digest(&images),
            lines: w.lines_logged(),
        };
        let started = Instant::now();
        let out = w.restore(&images, Some(at));
        t.in_criu += started.elapsed();
        if !sweep::was_killed(&out) {
            t.missed.push(format!("{at} (restore)"));
            continue;
        }
        t.kills += 1;
        let started = Instant::now();
        let after = after_killed_restore(w, &images, &before, &out);
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

/// What a killed restore must leave as it was.
struct Before {
    images: BTreeMap<String, Vec<u8>>,
    /// Lines the workload had logged: a process of a restore killed before it let the tasks go
    /// never runs the job's code.
    lines: usize,
}

/// Nothing half-restored is left or ran, seen the moment `criu-gpu restore` returns (it waits
/// for the plugin's guardian): nothing of the workload runs, nothing of it logged a line since
/// the restore began, and criu-gpu says so; or (CRIU killed once it had let the tasks go) the
/// whole workload runs with its data and criu-gpu names each of its processes. The images are
/// unchanged, and the workload restores (again).
fn after_killed_restore(
    w: &Workload,
    images: &Path,
    before: &Before,
    out: &std::process::Output,
) -> Result<(), String> {
    let left = w.alive();
    let after = tree_digest(images);
    if after != before.images {
        return Err(format!(
            "the images changed: {:?}",
            after
                .keys()
                .filter(|k| before.images.get(*k) != after.get(*k))
                .collect::<Vec<_>>()
        ));
    }
    let said = text(out);
    if !left.is_empty() {
        if let Some(p) = left.iter().find(|p| !said.contains(&format!(" {p} ("))) {
            return Err(format!(
                "process {p} was left running, and criu-gpu did not name it: {said}"
            ));
        }
        return w
            .lives()
            .map_err(|e| format!("processes {left:?} left half-restored: {e}"));
    }
    if w.lines_logged() != before.lines {
        return Err(format!(
            "a process of the killed restore ran the job's code before it was ended ({} lines \
             logged)",
            w.lines_logged().abs_diff(before.lines)
        ));
    }
    if !said.contains("nothing of the job was left running") {
        return Err(format!("nothing was left, but criu-gpu said: {said}"));
    }
    // criu-gpu ends what a killed CRIU left that cannot go on without it; the job's own
    // processes are the guardian's to kill, also where CRIU ran plain, without criu-gpu.
    let ended = said
        .lines()
        .find(|l| l.starts_with("ended what the failed CRIU had left"))
        .unwrap_or_default();
    if let Some(p) = w.pids.iter().find(|p| ended.contains(&format!(" {p} ("))) {
        return Err(format!(
            "the guardian left process {p} of the killed restore, which criu-gpu ended: {ended}"
        ));
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
         {:?}; {:.0} s ({:.0} s in the killed runs, {:.0} s in the checks after them; {:.0} s \
         for the restore kills, their dumps and second restores included)",
        t.kills,
        t.lived,
        t.restored,
        t.missed.len(),
        t.missed,
        t.leftovers.len(),
        t.leftovers,
        took.as_secs_f64(),
        t.in_criu.as_secs_f64(),
        t.in_checks.as_secs_f64(),
        t.in_restores.as_secs_f64()
    );
    assert!(t.lost.is_empty(), "{kind:?}: lost:\n{}", t.lost.join("\n"));
    assert_eq!(t.kills, survivors);
    let knobs = [
        "KILL_SWEEP_POINTS",
        "KILL_SWEEP_AT",
        "KILL_SWEEP_RESTORES",
        "KILL_SWEEP_RESTORE_AT",
    ];
    if knobs.iter().all(|k| std::env::var_os(k).is_none()) {
        assert!(
            t.kills >= 50,
            "{kind:?}: only {} kills: a CRIU without the project's patch 0011 ignores \
             CRIU_KILL_AT (run scripts/install-criu.sh, or set CRIU=)",
            t.kills
        );
    }
}
