//! A checkpoint wherever it is: a CRIU image directory; a Podman, CRI-O or kubelet archive (tar,
//! plain, gzip or zstd) or the directory it was extracted into; an OCI image of such an archive
//! (layout directory or OCI archive: ours, buildah's, Podman's `--create-image`); a containerd
//! checkpoint image exported with `ctr images export`.
//!
//! Archives are read as streams: the few small files the checks need are extracted into a
//! scratch directory, every other file is only listed with its size, so a checkpoint of 80 GB
//! is never copied to be looked at.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

mod stream;
use stream::{with_tar, Forward, Source, Tar};

/// Files extracted from archives: what the restore checks and `inspect` read.
const WANTED: [&str; 6] = [
    "inventory.img",
    "gpu-cuda.json",
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
    #[error("{path} is {codec}-compressed and `{tool}` is not installed: apt-get install {tool}")]
    NoDecompressor {
        path: String,
        codec: &'static str,
        tool: &'static str,
    },
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

fn scratch() -> Result<tempfile::TempDir, ArchiveError> {
    tempfile::Builder::new()
        .prefix("criu-gpu-")
        .tempdir()
        .map_err(io_err(&std::env::temp_dir()))
}

/// True for the names of files that make a directory a CRIU image directory.
fn is_image_marker(name: &str) -> bool {
    name == "inventory.img" || name == "gpu-cuda.json" || is_kfd_image(name)
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

/// Entries of one archive: every file's path and size, and the wanted ones extracted.
#[derive(Default)]
struct Listing {
    files: Vec<(String, u64)>,
}

impl Listing {
    /// Sorts the listing into CRIU images and other files; the images are where the markers are.
    fn finish(
        self,
        source: &Path,
        format: Format,
        scratch: tempfile::TempDir,
        annotations: BTreeMap<String, String>,
    ) -> Result<Checkpoint, ArchiveError> {
        let dir_of = |p: &str| {
            p.rsplit_once('/')
                .map_or(String::new(), |(d, _)| d.to_owned())
        };
        let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
        let image_dir = self
            .files
            .iter()
            .find(|(p, _)| base(p) == "inventory.img")
            .or_else(|| self.files.iter().find(|(p, _)| is_image_marker(&base(p))))
            .map(|(p, _)| dir_of(p))
            .ok_or_else(|| ArchiveError::NoImages(source.display().to_string()))?;
        let mut image_files = Vec::new();
        let mut other_files = Vec::new();
        for (p, size) in &self.files {
            let entry = FileEntry {
                name: if dir_of(p) == image_dir {
                    base(p)
                } else {
                    p.clone()
                },
                size: *size,
            };
            if dir_of(p) == image_dir {
                image_files.push(entry);
            } else {
                other_files.push(entry);
            }
        }
        image_files.sort_by(|a, b| a.name.cmp(&b.name));
        let images = scratch.path().join(&image_dir);
        std::fs::create_dir_all(&images).map_err(io_err(&images))?;
        let meta_dir = self
            .files
            .iter()
            .find(|(p, _)| base(p) == "config.dump" || base(p) == "spec.dump")
            .map(|(p, _)| scratch.path().join(dir_of(p)));
        Ok(Checkpoint {
            format: if format == Format::ContainerArchive && meta_dir.is_none() {
                Format::ImageDirectory
            } else {
                format
            },
            images,
            meta: meta_dir,
            image_files,
            other_files,
            annotations,
            _scratch: Some(scratch),
        })
    }
}

/// What a walk over a tar found besides files.
#[derive(Default)]
struct Walked {
    /// The tar is an OCI image layout (`oci-layout` at its root).
    layout: bool,
}

/// Lists every file of a tar stream, extracting the wanted ones under `into`.
fn walk(tar: &mut Tar<'_>, prefix: &str, into: &Path, listing: &mut Listing) -> io::Result<Walked> {
    let mut walked = Walked::default();
    for entry in tar.entries_with_seek()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path()?.into_owned();
        let Some(rel) = safe_relative(&path) else {
            continue;
        };
        if rel == "oci-layout" {
            walked.layout = true;
        }
        let name = rel.rsplit('/').next().unwrap_or(&rel).to_owned();
        let full = format!("{prefix}{rel}");
        listing.files.push((full.clone(), entry.header().size()?));
        if WANTED.contains(&name.as_str()) || is_kfd_image(&name) {
            let dest = into.join(&full);
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)?;
            }
            entry.unpack(&dest)?;
        }
    }
    Ok(walked)
}

/// `path` as a relative path without `..`, or None (such entries are never extracted).
fn safe_relative(path: &Path) -> Option<String> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// Where an OCI image's blobs are.
enum Blobs {
    Dir(PathBuf),
    Tar(PathBuf),
}

impl Blobs {
    /// The small blobs and index.json, by name (`index.json`, `sha256:<hex>`).
    fn small(&self) -> Result<BTreeMap<String, Vec<u8>>, ArchiveError> {
        let mut out = BTreeMap::new();
        match self {
            Blobs::Dir(d) => {
                let index = d.join("index.json");
                out.insert(
                    "index.json".into(),
                    std::fs::read(&index).map_err(io_err(&index))?,
                );
                let blobs = d.join("blobs/sha256");
                for e in std::fs::read_dir(&blobs).map_err(io_err(&blobs))?.flatten() {
                    if e.metadata().is_ok_and(|m| m.len() <= SMALL_BLOB) {
                        let name = format!("sha256:{}", e.file_name().to_string_lossy());
                        out.insert(name, std::fs::read(e.path()).map_err(io_err(&e.path()))?);
                    }
                }
            }
            Blobs::Tar(p) => with_tar(p, |tar| {
                for entry in tar.entries_with_seek()? {
                    let mut entry = entry?;
                    let path = entry.path()?.into_owned();
                    let Some(rel) = safe_relative(&path) else {
                        continue;
                    };
                    let name = match rel.strip_prefix("blobs/sha256/") {
                        Some(hex) => format!("sha256:{hex}"),
                        None if rel == "index.json" => rel,
                        None => continue,
                    };
                    if entry.header().size()? <= SMALL_BLOB {
                        let mut buf = Vec::new();
                        entry.read_to_end(&mut buf)?;
                        out.insert(name, buf);
                    }
                }
                Ok(())
            })?,
        }
        Ok(out)
    }

    /// Walks the layer `digest` as a tar.
    fn walk_layer(
        &self,
        digest: &str,
        into: &Path,
        listing: &mut Listing,
    ) -> Result<(), ArchiveError> {
        let hex = digest.trim_start_matches("sha256:");
        match self {
            Blobs::Dir(d) => {
                let blob = d.join("blobs/sha256").join(hex);
                with_tar(&blob, |tar| walk(tar, "", into, listing)).map(|_| ())
            }
            Blobs::Tar(p) => with_tar(p, |tar| {
                let want = format!("blobs/sha256/{hex}");
                for entry in tar.entries_with_seek()? {
                    let entry = entry?;
                    if safe_relative(&entry.path()?).as_deref() == Some(want.as_str()) {
                        let nested = Forward {
                            inner: entry,
                            pos: 0,
                        };
                        let mut layer = tar::Archive::new(Box::new(nested) as Box<dyn Source>);
                        walk(&mut layer, "", into, listing)?;
                        return Ok(());
                    }
                }
                Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("layer {digest} is not in the archive"),
                ))
            }),
        }
    }
}

/// The checkpoint layer of an OCI image: containerd's CRIU tar, or the one layer of a
/// CRI-O checkpoint image.
struct Layer {
    digest: String,
    format: Format,
    annotations: BTreeMap<String, String>,
}

fn find_layer(blobs: &BTreeMap<String, Vec<u8>>, source: &Path) -> Result<Layer, ArchiveError> {
    let bad = |why: String| ArchiveError::BadImage {
        path: source.display().to_string(),
        why,
    };
    let parse = |name: &str| -> Result<serde_json::Value, ArchiveError> {
        let bytes = blobs
            .get(name)
            .ok_or_else(|| bad(format!("blob {name} is missing")))?;
        serde_json::from_slice(bytes).map_err(|e| bad(format!("{name} is not JSON: {e}")))
    };
    let annotations_of = |v: &serde_json::Value| -> BTreeMap<String, String> {
        v["annotations"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Breadth-first over indexes; the first checkpoint layer found wins.
    let mut queue = vec![parse("index.json")?];
    let mut manifests = Vec::new();
    while let Some(index) = queue.pop() {
        for d in index["manifests"].as_array().into_iter().flatten() {
            let media = d["mediaType"].as_str().unwrap_or_default();
            let digest = d["digest"].as_str().unwrap_or_default().to_owned();
            if media == CONTAINERD_CRIU_TAR {
                return Ok(Layer {
                    digest,
                    format: Format::ContainerdImage,
                    annotations: annotations_of(&index),
                });
            }
            if media.ends_with("image.index.v1+json") {
                queue.push(parse(&digest)?);
            } else if media.ends_with("image.manifest.v1+json") {
                manifests.push((digest, annotations_of(d)));
            }
        }
    }
    for (digest, mut annotations) in manifests {
        let manifest = parse(&digest)?;
        annotations.extend(annotations_of(&manifest));
        if let Some(layer) = manifest["layers"].as_array().and_then(|l| l.last()) {
            return Ok(Layer {
                digest: layer["digest"].as_str().unwrap_or_default().to_owned(),
                format: Format::OciImage,
                annotations,
            });
        }
    }
    Err(bad("an OCI image without a checkpoint layer".into()))
}

fn open_oci(blobs: Blobs, source: &Path) -> Result<Checkpoint, ArchiveError> {
    let small = blobs.small()?;
    let layer = find_layer(&small, source)?;
    let scratch = scratch()?;
    let mut listing = Listing::default();
    blobs.walk_layer(&layer.digest, scratch.path(), &mut listing)?;
    listing.finish(source, layer.format, scratch, layer.annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_that_climb_out_are_never_extracted() {
        assert_eq!(
            safe_relative(Path::new("./checkpoint/inventory.img")).as_deref(),
            Some("checkpoint/inventory.img")
        );
        assert_eq!(safe_relative(Path::new("../etc/passwd")), None);
        assert_eq!(safe_relative(Path::new("/etc/passwd")), None);
    }

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn a_container_archive_lists_images_and_extracts_only_metadata() {
        let d = tempfile::tempdir().unwrap();
        let archive = d.path().join("ckpt.tar");
        std::fs::write(
            &archive,
            tar_of(&[
                ("config.dump", b"{\"name\":\"trainer\"}"),
                ("checkpoint/inventory.img", b"inv"),
                ("checkpoint/pages-1.img", &[7u8; 5000]),
                (
                    "checkpoint/dump.log",
                    b"(00.000000) Version: 4.2.1 (gitid 0)\n",
                ),
                ("rootfs-diff.tar", b"x"),
            ]),
        )
        .unwrap();
        let c = Checkpoint::open(&archive).unwrap();
        assert_eq!(c.format, Format::ContainerArchive);
        assert_eq!(c.image_bytes(), (3 + 5000 + 37, 5000));
        assert!(c.images.join("inventory.img").exists());
        assert!(
            !c.images.join("pages-1.img").exists(),
            "memory pages are not copied"
        );
        assert_eq!(c.criu_version().as_deref(), Some("4.2.1"));
        assert!(c.other_files.iter().any(|f| f.name == "rootfs-diff.tar"));
    }

    #[test]
    fn an_archive_without_images_says_so() {
        let d = tempfile::tempdir().unwrap();
        let archive = d.path().join("x.tar");
        std::fs::write(&archive, tar_of(&[("hello.txt", b"hi")])).unwrap();
        let e = Checkpoint::open(&archive).unwrap_err();
        assert!(e.to_string().contains("no CRIU images"), "{e}");
        std::fs::write(&archive, b"not a tar at all, just words").unwrap();
        assert!(Checkpoint::open(&archive).is_err());
    }
}
