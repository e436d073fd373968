//! The AMD part of a checkpoint: one `amdgpu-kfd-<id>.img` per KFD file (amd-kfd's format), and
//! whether this machine's GPUs can take them (amd-kfd's topology matching, relaxed by the
//! `KFD_*_CHECK` settings as CRIU's amdgpu plugin is).

use std::path::{Path, PathBuf};

use amd_kfd::device::Kfd;
use amd_kfd::image::ImageReader;
use amd_kfd::topology::{map_gpus, Checks, Topology};

/// This backend's entry in the image's inventory.
pub const INVENTORY_NAME: &str = "criu_gpu_amd";

/// Why this machine cannot restore a checkpoint's AMD state.
#[derive(Debug, thiserror::Error)]
pub enum AmdCheckError {
    #[error(
        "the image's inventory says it holds AMD GPU state ({INVENTORY_NAME}) but no \
         amdgpu-kfd-*.img is in the image directory: copy the checkpoint again"
    )]
    ImagesMissing,
    #[error(
        "the checkpoint holds AMD GPU state but this machine has no /dev/kfd: load the amdgpu \
         driver (or restore on a machine with AMD GPUs)"
    )]
    NoKfd,
    #[error("this machine's KFD topology cannot be read: {0}")]
    Topology(String),
    #[error("{image}: {why}")]
    Image { image: String, why: String },
}

/// How one KFD image's GPUs map onto this machine's.
#[derive(Debug, Clone)]
pub struct Matched {
    pub image: String,
    pub pid: u32,
    /// (GPU id in the checkpoint, GPU id here).
    pub gpus: Vec<(u32, u32)>,
}

/// The KFD images in `dir`, sorted.
pub fn images(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| is_image(p))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn is_image(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("amdgpu-kfd-") && n.ends_with(".img"))
}

fn name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// This machine's KFD topology.
pub fn local_topology(kfd: &dyn Kfd) -> Result<Topology, AmdCheckError> {
    Topology::parse(&kfd.topology_root()).map_err(|e| AmdCheckError::Topology(e.to_string()))
}

/// Checks that every KFD image of `dir` is sound and that `kfd`'s GPUs can take it, with the
/// `KFD_*_CHECK` relaxations `checks`. `listed`: the image's inventory names the AMD
/// backend (then images must be there). `Ok(None)`: the checkpoint holds no AMD state.
pub fn check(
    dir: &Path,
    listed: bool,
    kfd: Option<&dyn Kfd>,
    checks: &Checks,
) -> Result<Option<Vec<Matched>>, AmdCheckError> {
    let found = images(dir);
    if found.is_empty() {
        return if listed {
            Err(AmdCheckError::ImagesMissing)
        } else {
            Ok(None)
        };
    }
    let kfd = kfd.ok_or(AmdCheckError::NoKfd)?;
    let local = local_topology(kfd)?;
    let mut out = Vec::new();
    for p in &found {
        let bad = |why: String| AmdCheckError::Image {
            image: p.display().to_string(),
            why,
        };
        let img = ImageReader::open(p).map_err(|e| bad(e.to_string()))?;
        let m = map_gpus(&img.meta.topology, &local, checks).map_err(|e| bad(e.to_string()))?;
        out.push(Matched {
            image: name(p),
            pid: img.meta.pid,
            gpus: m.gpus.iter().map(|(a, b)| (*a, *b)).collect(),
        });
    }
    Ok(Some(out))
}
