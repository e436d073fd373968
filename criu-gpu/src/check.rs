//! `criu-gpu check PATH` (and `criu-gpu-check`, its old name): the verdict on a checkpoint in
//! any format, whether this node can restore the GPU state it holds; exit status 1 when not.

use std::path::Path;

use criu_gpu_host::settings::Settings;

use crate::archive::Checkpoint;
use crate::error::Error;
use crate::{inspect, out};

/// Says the verdict on the checkpoint at `path` under this node's `settings`: its exit status.
pub fn command(path: &Path, settings: &Settings, json: bool) -> Result<u8, Error> {
    let c = Checkpoint::open(path)?;
    let gpu = criu_gpu_image::inspect::inspect(&c.images);
    let held = inspect::gpu_lines(&gpu);
    let (code, verdict) = if held.is_empty() {
        (0, None)
    } else {
        let v = inspect::verdict(&c, settings);
        (u8::from(!v.can_restore), Some(v))
    };
    if json {
        out::json(&serde_json::json!({
            "path": path,
            "gpu_state": held,
            "can_restore": verdict.as_ref().is_none_or(|v| v.can_restore),
            "reason": verdict.as_ref().and_then(|v| v.reason.clone()),
        }));
        return Ok(code);
    }
    if held.is_empty() {
        out::line("no GPU state in this checkpoint: nothing to check");
    }
    for line in &held {
        out::line(format!("checkpoint: {line}"));
    }
    match verdict.and_then(|v| v.reason) {
        None if code == 0 && !held.is_empty() => out::line("OK: this node can restore it"),
        Some(why) => out::line(format!("REFUSED: {why}")),
        None => {}
    }
    Ok(code)
}
