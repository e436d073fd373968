//! Can this node restore a checkpoint? The plugin's restore checks run outside CRIU: the
//! image's plugin list, the CUDA record and the image digests, the NVIDIA driver and NVML (loaded
//! here, in the calling tool), the GPU placement, and the AMD images against this machine's KFD.

use std::path::Path;

use cuda_checkpoint_ctl::driver::Driver;
use cuda_checkpoint_ctl::inventory::Inventory;

use criu_gpu_image::amd::{self, AmdCheckError};
use criu_gpu_image::criu_image::{self, CriuImageError};
use criu_gpu_image::cuda;
use criu_gpu_image::restorable::{
    self, CudaCheckError, CudaHolds, CudaPlan, Listed, NvidiaNode, UPSTREAM_PLUGIN,
};

use crate::settings::declared::{DEVICE_MAP, DIGESTS, LIBCUDA, LIBNVML};
use crate::settings::{Settings, SettingsError};

#[derive(Debug, thiserror::Error)]
pub enum RestoreCheckError {
    #[error("{0}")]
    Image(#[from] CriuImageError),
    #[error("{0}")]
    Cuda(#[from] CudaCheckError),
    #[error("{0}")]
    Amd(#[from] AmdCheckError),
    #[error("{0}")]
    Settings(#[from] SettingsError),
}

/// What the checks found.
#[derive(Debug, Clone, Default)]
pub struct RestoreCheck {
    /// What the checkpoint holds for CUDA, and where it would go here.
    pub cuda: Option<(CudaHolds, CudaPlan)>,
    /// Each AMD image and its GPUs here.
    pub amd: Vec<amd::Matched>,
}

/// What the image's inventory lists (CRIU >= 4.1).
pub fn listed(dir: &Path) -> Result<(Listed, bool), CriuImageError> {
    let plugins = match criu_image::inventory_plugins(dir) {
        Ok(p) => p,
        // A directory of plugin records alone (a test, or images taken out of an archive).
        Err(CriuImageError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            None
        }
        Err(e) => return Err(e),
    };
    let names = plugins.clone().unwrap_or_default();
    let has = |n: &str| names.iter().any(|p| p == n);
    Ok((
        Listed {
            list: plugins.is_some(),
            ours: has(cuda::INVENTORY_NAME),
            upstream: has(UPSTREAM_PLUGIN),
        },
        has(amd::INVENTORY_NAME),
    ))
}

/// Runs every restore check against the image directory `dir` with the plugin's `settings`.
/// `complete`: it holds every image file (not the few taken out of an archive), so their digests
/// are checked too.
pub fn check(
    dir: &Path,
    complete: bool,
    settings: &Settings,
) -> Result<RestoreCheck, RestoreCheckError> {
    let (listed, amd_listed) = listed(dir)?;
    let mut out = RestoreCheck::default();
    if let Some(holds) = restorable::holds(dir, listed)? {
        let placement = settings.get(&DEVICE_MAP)?;
        let digests = settings.get(&DIGESTS)?;
        if let (CudaHolds::Record(img), true, true) = (&holds, complete, digests) {
            if let Some(checked) = restorable::verify_digests(img, dir)? {
                restorable::verify_later(dir, &checked.later, 16)?;
            }
        }
        let driver = Driver::load(settings.get(&LIBCUDA)?.as_deref()).map_err(|e| e.to_string());
        let nvml = settings.get(&LIBNVML)?;
        let inventory = Inventory::query(nvml.as_deref()).map_err(|e| e.to_string());
        let node = NvidiaNode {
            driver: driver.as_ref().map(|d| d.info()).map_err(String::as_str),
            inventory: inventory.as_ref().map_err(String::as_str),
        };
        let plan = restorable::check_node(&holds, node, &placement)?;
        out.cuda = Some((holds, plan));
    }
    let kfd = settings.kfd();
    if let Some(m) = amd::check(dir, amd_listed, kfd.as_deref(), &settings.kfd_checks()?)? {
        out.amd = m;
    }
    Ok(out)
}
