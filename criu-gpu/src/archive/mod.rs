//! A checkpoint wherever it is: a CRIU image directory; a Podman, CRI-O or kubelet archive (tar,
//! plain, gzip or zstd) or the directory it was extracted into; an OCI image of such an archive
//! (layout directory or OCI archive: ours, buildah's, Podman's `--create-image`); a containerd
//! checkpoint image exported with `ctr images export`.
//!
//! Archives are read as streams: the few small files the checks need are extracted into a
//! scratch directory, every other file is only listed with its size, so a checkpoint of 80 GB
//! is never copied to be looked at.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

mod oci;
mod stream;
mod tar;

pub use self::stream::Codec;

use self::oci::{open_oci, Blobs};
use self::stream::with_tar;
use self::tar::{walk, Listing};

/// Files extracted from archives: what the restore checks and `inspect` read.
const WANTED: [&str; 8] = [
    "inventory.img",
    criu_gpu_image::cuda::RECORD,
    criu_gpu_image::timings::FILES[0],
    criu_gpu_image::timings::FILES[1],
    "config.dump",
    "spec.dump",
    "dump.log",
    "stats-dump",
];
/// Blobs of OCI images read into memory (manifests, configs, indexes); layers are larger.
const SMALL_BLOB: u64 = 4 << 20;
/// containerd's media type for the CRIU images of a checkpoint image.
pub const CONTAINERD_CRIU_TAR: &str =
    "application/vnd.containerd.container.criu.checkpoint.criu.tar";

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("no CRIU images under {0} (no inventory.img, gpu-cuda.json or amdgpu-kfd-*.img): is it a checkpoint?")]
    NoImages(String),
    #[error("{path}: {why}")]
    BadImage { path: String, why: String },
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// How the checkpoint was packaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// `criu dump -D DIR`.
    ImageDirectory,
    /// Podman `--export`, CRI-O and the kubelet checkpoint API (`checkpoint/` + metadata).
    ContainerArchive,
    /// An OCI image whose layer is a container archive (what CRI-O restores from).
    OciImage,
    /// A containerd checkpoint image (`ctr containers checkpoint`).
    ContainerdImage,
}

impl Format {
    pub fn describe(self) -> &'static str {
        match self {
            Format::ImageDirectory => "CRIU image directory",
            Format::ContainerArchive => "container checkpoint archive (Podman, CRI-O, kubelet)",
            Format::OciImage => "OCI checkpoint image (CRI-O format)",
            Format::ContainerdImage => "containerd checkpoint image",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FileEntry {
    pub name: String,
    pub size: u64,
}

/// A checkpoint opened for reading.
#[derive(Debug)]
pub struct Checkpoint {
    pub format: Format,
    /// The directory holding the CRIU images (or the extracted subset of them).
    pub images: PathBuf,
    /// The directory holding the container metadata (config.dump, spec.dump, ...), if any.
    pub meta: Option<PathBuf>,
    /// The CRIU image files and their sizes, as they are in the checkpoint.
    pub image_files: Vec<FileEntry>,
    /// Other files of a container archive (root file system changes, metadata).
    pub other_files: Vec<FileEntry>,
    /// Annotations of an OCI image's manifest.
    pub annotations: BTreeMap<String, String>,
    _scratch: Option<tempfile::TempDir>,
}

impl Checkpoint {
    /// Whether `images` holds every image file (a directory given as it is), not the few taken
    /// out of an archive: only then can their digests be checked.
    pub fn complete(&self) -> bool {
        self._scratch.is_none()
    }

    /// Opens `path`: a directory, an archive, or an OCI image of either kind.
    pub fn open(path: &Path) -> Result<Checkpoint, ArchiveError> {
        let meta = std::fs::metadata(path).map_err(io_err(path))?;
        if meta.is_dir() {
            if path.join("oci-layout").exists() {
                return open_oci(Blobs::Dir(path.to_path_buf()), path);
            }
            return open_dir(path);
        }
        let scratch = scratch()?;
        let mut listing = Listing::default();
        let oci = with_tar(path, |tar| walk(tar, "", scratch.path(), &mut listing))?;
        if oci.layout {
            return open_oci(Blobs::Tar(path.to_path_buf()), path);
        }
        listing.finish(path, Format::ContainerArchive, scratch, BTreeMap::new())
    }

    /// The CRIU version that made it, from CRIU's dump log when the checkpoint carries one.
    pub fn criu_version(&self) -> Option<String> {
        let dirs = [Some(self.images.clone()), self.meta.clone()];
        dirs.iter().flatten().find_map(|d| {
            let log = std::fs::read_to_string(d.join("dump.log")).ok()?;
            log.lines().take(50).find_map(|l| {
                let v = l.split_once("Version: ")?.1;
                Some(v.split_whitespace().next()?.to_owned())
            })
        })
    }

    /// The bytes of CRIU images, and of those the process memory pages.
    pub fn image_bytes(&self) -> (u64, u64) {
        let total = self.image_files.iter().map(|f| f.size).sum();
        let pages = self
            .image_files
            .iter()
            .filter(|f| f.name.starts_with("pages-") || f.name.starts_with("amdgpu-kfd-"))
            .map(|f| f.size)
            .sum();
        (total, pages)
    }
}

/// Extracts the archive at `path` (tar, plain or compressed) into `dest`, entries outside it
/// refused by the tar reader.
pub fn extract(path: &Path, dest: &Path) -> Result<(), ArchiveError> {
    with_tar(path, |tar| {
        tar.set_preserve_permissions(true);
        tar.unpack(dest)
    })
}

fn scratch() -> Result<tempfile::TempDir, ArchiveError> {
    tempfile::Builder::new()
        .prefix("criu-gpu-")
        .tempdir()
        .map_err(io_err(&std::env::temp_dir()))
}

/// True for the names of files that make a directory a CRIU image directory.
fn is_image_marker(name: &str) -> bool {
    name == "inventory.img" || name == criu_gpu_image::cuda::RECORD || is_kfd_image(name)
}

fn is_kfd_image(name: &str) -> bool {
    name.starts_with("amdgpu-kfd-") && name.ends_with(".img")
}

fn open_dir(root: &Path) -> Result<Checkpoint, ArchiveError> {
    let has_images = |d: &Path| {
        std::fs::read_dir(d).is_ok_and(|rd| {
            rd.flatten()
                .any(|e| is_image_marker(&e.file_name().to_string_lossy()))
        })
    };
    let mut candidates = vec![root.to_path_buf(), root.join("checkpoint")];
    // An extracted archive keeps the checkpoint one level further down.
    if let Ok(rd) = std::fs::read_dir(root) {
        let mut subdirs: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        subdirs.sort();
        for d in subdirs {
            candidates.push(d.join("checkpoint"));
            candidates.push(d);
        }
    }
    let images = candidates
        .into_iter()
        .find(|d| has_images(d))
        .ok_or_else(|| ArchiveError::NoImages(root.display().to_string()))?;
    let list = |d: &Path| -> Vec<FileEntry> {
        let mut v: Vec<FileEntry> = std::fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .map(|e| FileEntry {
                        name: e.file_name().to_string_lossy().into_owned(),
                        size: e.metadata().map(|m| m.len()).unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    };
    let parent = images.parent().map(Path::to_path_buf);
    let meta = parent.filter(|p| p.join("config.dump").exists() || p.join("spec.dump").exists());
    let format = if meta.is_some() {
        Format::ContainerArchive
    } else {
        Format::ImageDirectory
    };
    Ok(Checkpoint {
        format,
        image_files: list(&images),
        other_files: meta.as_deref().map(list).unwrap_or_default(),
        meta,
        images,
        annotations: BTreeMap::new(),
        _scratch: None,
    })
}

#[cfg(test)]
mod tests;
