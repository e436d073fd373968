//! A tar archive walked as a stream: every entry listed with its size, the wanted few extracted
//! into the scratch directory, and none ever written outside it.

use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path};

use super::stream::Tar;
use super::*;

/// Entries of one archive: every file's path and size, and the wanted ones extracted.
#[derive(Default)]
pub(super) struct Listing {
    files: Vec<(String, u64)>,
}

impl Listing {
    /// Sorts the listing into CRIU images and other files; the images are where the markers are.
    pub(super) fn finish(
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
pub(super) struct Walked {
    /// The tar is an OCI image layout (`oci-layout` at its root).
    pub(super) layout: bool,
}

/// Lists every file of a tar stream, extracting the wanted ones under `into`.
pub(super) fn walk(
    tar: &mut Tar<'_>,
    prefix: &str,
    into: &Path,
    listing: &mut Listing,
) -> io::Result<Walked> {
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
pub(super) fn safe_relative(path: &Path) -> Option<String> {
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
