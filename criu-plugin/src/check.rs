//! The pre-restore check: runs the plugin's own restore-time checks (driver, GPUs by UUID or
//! topology, free memory, image integrity) against a checkpoint, outside CRIU, so an operator
//! or an orchestrator learns before restoring whether this node can take it, and why not.

use std::path::{Path, PathBuf};

use crate::core::{record, HookError, Host, Plugin, Released, Stage, ThreadControl};
use crate::vendor::{self, cuda};

struct NoThreads;

impl ThreadControl for NoThreads {
    fn release(&self, tid: i32) -> Result<Released, String> {
        Err(format!("no thread {tid} to run outside CRIU"))
    }
    fn recapture(&self, _r: Released) -> Result<(), String> {
        Ok(())
    }
}

/// A host with the checkpoint's directory and nothing else.
struct CheckHost {
    dir: PathBuf,
}

impl Host for CheckHost {
    fn final_state(&self) -> Option<i32> {
        None
    }
    fn require_on_restore(&self, _name: &str) -> bool {
        false
    }
    fn use_interrupt_only_seizing(&self) -> bool {
        false
    }
    fn image_dir(&self) -> Option<PathBuf> {
        Some(self.dir.clone())
    }
    fn threads(&self) -> &dyn ThreadControl {
        &NoThreads
    }
}

/// What a checkpoint holds for the GPUs, one line each.
pub fn describe(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(Some(img)) = record::read::<cuda::CudaImage>(dir, cuda::RECORD, cuda::FORMAT) {
        for p in &img.processes {
            let gpus: Vec<String> = p
                .gpus
                .iter()
                .map(|u| match u.memory {
                    Some(m) => format!("{} ({:.2} GiB)", u.uuid, m as f64 / (1u64 << 30) as f64),
                    None => u.uuid.to_string(),
                })
                .collect();
            out.push(format!(
                "CUDA process {} ({}), {}: {}",
                p.ns_pid,
                p.comm,
                p.initial_state,
                if gpus.is_empty() {
                    "GPUs not recorded".into()
                } else {
                    gpus.join(", ")
                }
            ));
        }
    }
    let mut amd: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    amd.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("amdgpu-kfd-") && n.ends_with(".img"))
    });
    amd.sort();
    for p in amd {
        match amd_kfd::image::ImageReader::open(&p) {
            Ok(r) => out.push(format!(
                "ROCm process {}: {} GPU(s), {} buffer(s)",
                r.meta.pid,
                r.meta.devices.len(),
                r.meta.bos.len()
            )),
            Err(e) => out.push(format!("{e}")),
        }
    }
    out
}

/// Runs the restore checks of every backend against the image directory `dir`.
pub fn check(dir: &Path) -> Result<(), HookError> {
    let host = CheckHost {
        dir: dir.to_path_buf(),
    };
    let mut plugin = Plugin::new(Stage::Restore, Box::new(host), vendor::all());
    // The inventory is not read here: each backend decides from its own files.
    plugin.init(&|_| None)
}
