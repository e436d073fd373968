//! OCI images of a checkpoint (a layout directory or an OCI archive): the manifest and the layer
//! that holds the checkpoint, walked like any archive.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::stream::{with_tar, Forward, Source};
use super::tar::{safe_relative, walk, Listing};
use super::*;

/// Where an OCI image's blobs are.
pub(super) enum Blobs {
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
                        let mut layer = ::tar::Archive::new(Box::new(nested) as Box<dyn Source>);
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

pub(super) fn open_oci(blobs: Blobs, source: &Path) -> Result<Checkpoint, ArchiveError> {
    let small = blobs.small()?;
    let layer = find_layer(&small, source)?;
    let scratch = scratch()?;
    let mut listing = Listing::default();
    blobs.walk_layer(&layer.digest, scratch.path(), &mut listing)?;
    listing.finish(source, layer.format, scratch, layer.annotations)
}
