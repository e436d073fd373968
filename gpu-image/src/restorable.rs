//! Whether a node can restore a checkpoint's CUDA state: the checks a restore makes before CRIU
//! creates anything, as functions of the image directory and of what the node answered. The
//! plugin runs them in `init` with the answers its guardian got from the driver and NVML;
//! `criu-gpu check` runs them outside CRIU (`criu_gpu_host::restore_check`).

use std::path::Path;

use cuda_checkpoint_ctl::driver::DriverInfo;
use cuda_checkpoint_ctl::inventory::Inventory;

use crate::cuda::{self, CudaImage};
use crate::digest::{self, DigestError, FileDigest};
use crate::placement::{plan, Plan};
use crate::record::{self, RecordError};
use cuda_checkpoint_ctl::placement::Request;

/// The image name of CRIU's own C CUDA plugin: its checkpoints are restored too.
pub const UPSTREAM_PLUGIN: &str = "cuda_plugin";

/// What the image's inventory says of the CUDA backends (CRIU >= 4.1 lists the plugins an image
/// needs; older images list none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Listed {
    /// The image has a plugin list at all.
    pub list: bool,
    /// It names this project's CUDA backend.
    pub ours: bool,
    /// It names CRIU's C cuda_plugin.
    pub upstream: bool,
}

/// What a checkpoint holds for CUDA.
#[derive(Debug, Clone, PartialEq)]
pub enum CudaHolds {
    /// A record of this project's plugin.
    Record(Box<CudaImage>),
    /// An image of CRIU's C cuda_plugin: no record; every CUDA process found is restored.
    Upstream,
}

impl CudaHolds {
    /// For messages.
    pub fn what(&self) -> String {
        match self {
            CudaHolds::Record(i) => format!("CUDA state of {} process(es)", i.processes.len()),
            CudaHolds::Upstream => format!("CUDA state dumped by CRIU's {UPSTREAM_PLUGIN}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CudaCheckError {
    #[error(
        "the image's inventory says it holds CUDA state ({name}) but {record} is missing from the \
         image directory: it was not copied completely; copy it again from its source",
        name = cuda::INVENTORY_NAME,
        record = cuda::RECORD
    )]
    RecordMissing,
    #[error("{0}")]
    Record(#[from] RecordError),
    #[error("{0}")]
    Digest(#[from] DigestError),
    #[error(
        "the checkpoint holds {what}, but the CUDA driver cannot be used here: {reason}; install \
         the NVIDIA driver (r570 or later) or name it with CUDA_CKPT_LIBCUDA=PATH; nothing was \
         restored"
    )]
    NoDriver { what: String, reason: String },
    #[error(
        "the checkpoint holds {what}, but this machine has no NVIDIA GPU; nothing was restored"
    )]
    NoGpu { what: String },
    #[error("cannot restore the {what} here: {why}; nothing was restored")]
    Placement { what: String, why: String },
}

/// Reads what `dir` holds for CUDA, weighed against the inventory. A record the inventory does
/// not name is a leftover of an earlier dump into the same directory: ignored, with a warning.
pub fn holds(dir: &Path, listed: Listed) -> Result<Option<CudaHolds>, CudaCheckError> {
    let mut found: Option<CudaImage> =
        record::read(dir, cuda::RECORD, cuda::FORMAT, cuda::VERSION)?;
    if listed.list && !listed.ours && found.take().is_some() {
        tracing::warn!(
            "{} in the image directory is not this image's (the image's inventory does not name \
             {}): a leftover of an earlier dump into the same directory; it is ignored",
            cuda::RECORD,
            cuda::INVENTORY_NAME
        );
    }
    if listed.ours && listed.list && found.is_none() {
        return Err(CudaCheckError::RecordMissing);
    }
    Ok(match found {
        Some(img) => Some(CudaHolds::Record(Box::new(img))),
        None if listed.upstream && listed.list => Some(CudaHolds::Upstream),
        None => None,
    })
}

/// What `verify_digests` checked, and what it left for later.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// Bytes whose contents were hashed.
    pub bytes: u64,
    /// Large pages images whose sizes are right and whose contents are to be checked while the
    /// restore reads them ([`digest::split`]).
    pub later: Vec<FileDigest>,
}

/// Checks the image files against the digests the dump recorded: every file's size, and the
/// contents of all but the large pages images. `None` when nothing was checked. (Whether to
/// check at all is the caller's setting, `CRIU_GPU_DIGESTS`.)
pub fn verify_digests(img: &CudaImage, dir: &Path) -> Result<Option<Checked>, CudaCheckError> {
    if img.digests.is_empty() {
        tracing::warn!(
            "the record holds no digests of the image files (the dump could not take them): the \
             images are not checked"
        );
        return Ok(None);
    }
    digest::verify_sizes(dir, &img.digests)?;
    let (now, later) = digest::split(&img.digests);
    digest::verify_contents(dir, &now, 16)?;
    Ok(Some(Checked {
        bytes: now.iter().map(|d| d.size).sum(),
        later,
    }))
}

/// The contents of the files `verify_digests` left for later, hashed with at most `threads`.
pub fn verify_later(
    dir: &Path,
    later: &[FileDigest],
    threads: usize,
) -> Result<(), CudaCheckError> {
    Ok(digest::verify_contents(dir, later, threads)?)
}

/// What a node answered about its NVIDIA GPUs.
#[derive(Debug, Clone, Copy)]
pub struct NvidiaNode<'a> {
    /// The driver library, or why it cannot be used.
    pub driver: Result<&'a DriverInfo, &'a str>,
    /// NVML's inventory, or why there is none.
    pub inventory: Result<&'a Inventory, &'a str>,
}

/// Where each GPU's state goes, once the node is known to have a driver and GPUs that fit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaPlan {
    pub plan: Plan,
    /// Lines for the log: where each GPU's state goes.
    pub notes: Vec<String>,
    /// What was not checked, or differs from the dumping machine.
    pub warnings: Vec<String>,
}

/// Checks the node against what the checkpoint holds and works out the GPU map.
pub fn check_node(
    holds: &CudaHolds,
    node: NvidiaNode<'_>,
    placement: &Request,
) -> Result<CudaPlan, CudaCheckError> {
    let what = holds.what();
    if let Err(reason) = node.driver {
        return Err(CudaCheckError::NoDriver {
            what,
            reason: reason.to_owned(),
        });
    }
    let mut warnings = Vec::new();
    let inventory = match node.inventory {
        Ok(inv) if inv.gpus.is_empty() => return Err(CudaCheckError::NoGpu { what }),
        Ok(inv) => Some(inv),
        // NVML's words for a machine whose kernel driver is not there: no GPU to restore on.
        Err(e) if e.contains("driver is not loaded") => {
            return Err(CudaCheckError::NoGpu { what });
        }
        Err(e) => {
            warnings.push(format!(
                "NVML is not available ({e}): GPUs and free memory are not checked before \
                 restoring"
            ));
            None
        }
    };
    let CudaHolds::Record(img) = holds else {
        return Ok(CudaPlan {
            warnings,
            ..CudaPlan::default()
        });
    };
    let p = plan(img, inventory, placement).map_err(|why| CudaCheckError::Placement {
        what: what.clone(),
        why,
    })?;
    let mut notes = p.notes.clone();
    if !p.map.is_empty() {
        notes.push(format!("GPUs remapped: {}", p.map));
    }
    if let (Some(then), Some(now)) = (&img.driver_version, inventory.map(|i| &i.driver_version)) {
        if then != now {
            warnings.push(format!(
                "dumped with NVIDIA driver {then}, restoring with {now}"
            ));
        }
    }
    Ok(CudaPlan {
        plan: p,
        notes,
        warnings,
    })
}
