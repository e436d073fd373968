//! How a move went, step by step: the times each side read from its CRIU's logs, and the
//! downtime (the job frozen on the sender until it runs on the receiver). Times are wall-clock
//! seconds since the epoch, each side's own clock: on one machine (a test bed of namespace
//! nodes) they compare exactly; across machines only as well as their clocks agree.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The receiver's outcome, sent to the sender once its CRIU ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Landed {
    pub ok: bool,
    pub host: String,
    /// The restored tree's root on the receiver.
    pub root: Option<i32>,
    /// Why nothing runs there (its CRIU's last errors).
    pub error: Option<String>,
    pub times: Landing,
    /// The lazy-pages daemon's summary of the stream.
    pub stream: Option<String>,
}

/// The receiver's steps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Landing {
    pub images_in: Option<f64>,
    /// CRIU's restore began restoring the tree.
    pub restore: Option<f64>,
    /// The late hooks began: the GPU driver's restore.
    pub late_hooks: Option<f64>,
    /// Every page was in place.
    pub all_in: Option<f64>,
    /// The tree runs.
    pub resumed: Option<f64>,
}

/// The sender's steps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Leaving {
    /// CRIU began the dump: the tree is frozen from here on.
    pub frozen: Option<f64>,
    /// The GPU driver's checkpoint ended.
    pub checkpointed: Option<f64>,
    /// The images were sent; the pages follow.
    pub images_sent: Option<f64>,
}

/// A whole move, as the sender reports it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Moved {
    pub to: String,
    pub leaving: Leaving,
    pub landed: Landed,
    /// Frozen here until running there; `None` when the move did not happen.
    pub downtime: Option<f64>,
    pub image_bytes: u64,
}

/// Now, as seconds since the epoch.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The time into its run at which a CRIU logged its first line containing `what` (its log
/// lines begin `(SS.ssssss)`); `started` (CRIU's start, wall-clock) makes it wall-clock.
pub fn logged_at(log: &Path, started: f64, what: &str) -> Option<f64> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().find(|l| l.contains(what))?;
    let stamp = line.strip_prefix('(')?.split_once(')')?.0;
    stamp.trim().parse::<f64>().ok().map(|s| started + s)
}

/// The first line of `log` containing `what`.
pub fn logged_line(log: &Path, what: &str) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().find(|l| l.contains(what)).map(str::to_owned)
}

/// `line` from `what` on.
pub fn logged_line_from(line: &str, what: &str) -> Option<String> {
    Some(line[line.find(what)?..].to_owned())
}

impl Moved {
    /// The lines an operator reads: each step after the freeze, and the downtime.
    pub fn lines(&self) -> Vec<String> {
        let Some(t0) = self.leaving.frozen else {
            return Vec::new();
        };
        let l = &self.landed.times;
        let step = |t: Option<f64>, what: &str| t.map(|t| format!("  +{:.2} s  {what}", t - t0));
        let mut out: Vec<String> = [
            step(Some(t0), "frozen here (CRIU seized the tree)"),
            step(
                self.leaving.checkpointed,
                "GPU state checkpointed into host memory",
            ),
            step(
                self.leaving.images_sent,
                "images sent; the pages follow as they are asked for",
            ),
            step(l.restore, "restoring there"),
            step(l.late_hooks, "the GPU driver's restore starts there"),
            step(l.all_in, "every page there"),
            step(l.resumed, "running there"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if let Some(s) = &self.landed.stream {
            out.push(format!("  {s}"));
        }
        out
    }
}
