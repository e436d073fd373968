//! What the plugin costs CRIU: the time spent in its hooks, and how much of it is fixed cost
//! (answering "not mine" for processes without GPU state, looking for CUDA in every process)
//! rather than GPU work. `exit` logs it; scripts/gpu/bench-plain-tree.sh reads it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use criu_gpu_image::timings::{Command, Phase, Timings};

static SPENT_NS: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);
static NOT_MINE_NS: AtomicU64 = AtomicU64::new(0);
static NOT_MINE: AtomicU64 = AtomicU64::new(0);
/// GPU work done inside calls that still answered "not mine" (the root's PAUSE_DEVICES locks
/// the tree's CUDA processes, whatever the root itself is).
static WORK_NS: AtomicU64 = AtomicU64::new(0);
static SCANNED: AtomicU64 = AtomicU64::new(0);
static SCAN_NS: AtomicU64 = AtomicU64::new(0);

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// One hook call.
pub fn hook(took: Duration, not_mine: bool) {
    SPENT_NS.fetch_add(ns(took), Ordering::Relaxed);
    CALLS.fetch_add(1, Ordering::Relaxed);
    if not_mine {
        NOT_MINE_NS.fetch_add(ns(took), Ordering::Relaxed);
        NOT_MINE.fetch_add(1, Ordering::Relaxed);
    }
}

/// GPU work (probes, locks) done for the tree.
pub fn gpu_work(took: Duration) {
    WORK_NS.fetch_add(ns(took), Ordering::Relaxed);
}

/// `processes` looked at for CUDA.
pub fn scanned(processes: usize, took: Duration) {
    SCANNED.fetch_add(processes as u64, Ordering::Relaxed);
    SCAN_NS.fetch_add(ns(took), Ordering::Relaxed);
}

/// The GPU phases of this command, in order: written as data at `exit` (timings).
static PHASES: Mutex<Vec<Phase>> = Mutex::new(Vec::new());

/// A GPU phase done: `name` as the timings file names it.
pub fn phase(name: &str, took: Duration, processes: usize, bytes: u64) {
    PHASES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Phase {
            name: name.to_owned(),
            seconds: took.as_secs_f64(),
            processes,
            bytes,
        });
}

/// This command's timings; none if it did no GPU phase.
pub fn timings(command: Command, success: bool) -> Option<Timings> {
    let phases = std::mem::take(&mut *PHASES.lock().unwrap_or_else(|e| e.into_inner()));
    (!phases.is_empty()).then(|| Timings {
        command,
        success,
        phases,
        hook_seconds: SPENT_NS.load(Ordering::Relaxed) as f64 / 1e9,
        hook_calls: CALLS.load(Ordering::Relaxed),
    })
}

pub fn summary() -> String {
    let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
    let not_mine = (ms(&NOT_MINE_NS) - ms(&WORK_NS)).max(0.0);
    format!(
        "time in the plugin: {:.3} ms over {} calls; fixed cost: {:.3} ms looking for CUDA in {} \
         processes and {not_mine:.3} ms in {} calls about processes without GPU state",
        ms(&SPENT_NS),
        CALLS.load(Ordering::Relaxed),
        ms(&SCAN_NS),
        SCANNED.load(Ordering::Relaxed),
        NOT_MINE.load(Ordering::Relaxed)
    )
}
