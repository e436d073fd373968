//! `criu-gpu-check`: can this node restore that checkpoint's GPU state?
//!
//!     criu-gpu-check PATH
//!
//! PATH is a CRIU image directory, a directory holding `checkpoint/` (an extracted Podman or
//! CRI-O archive), or such an archive (.tar, .tar.gz, .tar.zst, read with `tar`). Runs the
//! plugin's own restore checks: driver, GPUs (by UUID, or topology for AMD), free memory,
//! `CRIU_GPU_DEVICE_MAP` and the `KFD_*` switches from the environment or
//! /etc/criu/gpu-plugin.conf. Exit status 0: it can; 1: it cannot, and why; 2: PATH unreadable.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use criu_gpu_plugin::{check, core::settings};

fn image_dir(root: &Path) -> Option<PathBuf> {
    let is_dir = |p: &Path| {
        p.join("inventory.img").exists()
            || p.join("gpu-cuda.json").exists()
            || std::fs::read_dir(p).is_ok_and(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("amdgpu-kfd-"))
            })
    };
    [root.to_path_buf(), root.join("checkpoint")]
        .into_iter()
        .find(|p| is_dir(p))
}

fn extract(archive: &Path, into: &Path) -> Result<(), String> {
    let out = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .args([
            "--wildcards",
            "--no-anchored",
            "inventory.img",
            "gpu-cuda.json",
            "amdgpu-kfd-*.img",
        ])
        .output()
        .map_err(|e| format!("running tar: {e}"))?;
    // tar reports members it did not find; only a broken archive is an error.
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !err.contains("Not found in archive") {
        return Err(format!("{}: {}", archive.display(), err.trim()));
    }
    Ok(())
}

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_max_level(tracing::Level::INFO)
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path] = args.as_slice() else {
        eprintln!("usage: criu-gpu-check CHECKPOINT_DIR_OR_ARCHIVE");
        return ExitCode::from(2);
    };
    settings::export_file_settings();
    let path = Path::new(path);
    let scratch;
    let root = if path.is_file() {
        scratch = match tempfile_dir() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("criu-gpu-check: {e}");
                return ExitCode::from(2);
            }
        };
        if let Err(e) = extract(path, &scratch) {
            eprintln!("criu-gpu-check: {e}");
            return ExitCode::from(2);
        }
        scratch.clone()
    } else {
        path.to_path_buf()
    };
    let Some(dir) = image_dir(&root).or_else(|| find_nested(&root)) else {
        eprintln!("criu-gpu-check: no CRIU images under {}", path.display());
        return ExitCode::from(2);
    };
    let held = check::describe(&dir);
    if held.is_empty() {
        println!("no GPU state in this checkpoint: nothing to check");
        return ExitCode::SUCCESS;
    }
    for line in &held {
        println!("checkpoint: {line}");
    }
    let result = check::check(&dir, !path.is_file());
    if path.is_file() {
        let _ = std::fs::remove_dir_all(&root);
    }
    match result {
        Ok(()) => {
            println!("OK: this node can restore it");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("REFUSED: {e}");
            ExitCode::from(1)
        }
    }
}

/// An extracted archive keeps the checkpoint one or two levels down.
fn find_nested(root: &Path) -> Option<PathBuf> {
    let subdirs: Vec<PathBuf> = std::fs::read_dir(root)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    subdirs.iter().find_map(|d| image_dir(d))
}

fn tempfile_dir() -> Result<PathBuf, String> {
    let d = std::env::temp_dir().join(format!("criu-gpu-check-{}", std::process::id()));
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    Ok(d)
}
