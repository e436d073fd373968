//! Checkpoint archives as OCI images, the format CRI-O restores from: one layer holding the
//! archive's files, and the container's name in the annotation
//! `io.kubernetes.cri-o.annotations.checkpoint.name` (plus the `org.criu.checkpoint.*` names
//! newer tools read). Written as an OCI image layout directory; the layer blob is a hard link
//! to the archive where the file system allows, so an image of a 80 GB checkpoint costs no
//! second 80 GB.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::codec::Codec;

pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const CRIO_CHECKPOINT_NAME: &str = "io.kubernetes.cri-o.annotations.checkpoint.name";

/// One blob of a written image.
#[derive(Debug, Clone)]
pub struct Blob {
    pub digest: String,
    pub size: u64,
    pub media_type: String,
    pub path: PathBuf,
}

/// An image written as an OCI layout.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
    pub manifest: Blob,
    pub config: Blob,
    pub layer: Blob,
}

/// What goes into an image besides its layer.
#[derive(Debug, Clone, Default)]
pub struct ImageSpec {
    /// `name:tag` recorded in the layout's index (what `ctr images import` names it).
    pub reference: String,
    pub annotations: BTreeMap<String, String>,
    /// The image config's `config` object (Cmd, Env, ...); empty for checkpoint images.
    pub runtime_config: serde_json::Value,
}

/// The sha256 of a stream, as `sha256:<hex>`, and its length.
pub fn digest_of(mut r: impl Read) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let got = r.read(&mut buf)?;
        if got == 0 {
            break;
        }
        hasher.update(&buf[..got]);
        n += got as u64;
    }
    Ok((format!("sha256:{}", hex(&hasher.finalize())), n))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes the image of `layer` (a tar, plain or compressed) into the layout `dir`.
/// `known_digest` saves a pass over a file already hashed while it was copied.
pub fn write_layout(
    dir: &Path,
    layer: &Path,
    known_digest: Option<&str>,
    spec: &ImageSpec,
) -> io::Result<Layout> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let (digest, size) = match known_digest {
        Some(d) => (d.to_owned(), std::fs::metadata(layer)?.len()),
        None => digest_of(File::open(layer)?)?,
    };
    let (media_type, diff_id) = match Codec::of(layer)? {
        None => ("application/vnd.oci.image.layer.v1.tar", digest.clone()),
        Some(codec) => (
            match codec {
                Codec::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
                Codec::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            },
            uncompressed_digest(layer, codec)?,
        ),
    };
    let layer_blob = blobs.join(digest.trim_start_matches("sha256:"));
    if !layer_blob.exists() && std::fs::hard_link(layer, &layer_blob).is_err() {
        std::fs::copy(layer, &layer_blob)?;
    }
    let layer = Blob {
        digest,
        size,
        media_type: media_type.into(),
        path: layer_blob,
    };
    let config = json!({
        "created": crate::human::rfc3339(std::time::SystemTime::now()),
        "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
        "os": "linux",
        "config": spec.runtime_config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "criu-gpu"}],
    });
    let config = write_json_blob(&blobs, CONFIG, &config)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": descriptor(&config),
        "layers": [descriptor(&layer)],
        "annotations": spec.annotations,
    });
    let manifest = write_json_blob(&blobs, MANIFEST, &manifest)?;
    let (name, tag) = split_reference(&spec.reference);
    let mut annotations = spec.annotations.clone();
    annotations.insert("org.opencontainers.image.ref.name".into(), tag.into());
    annotations.insert("io.containerd.image.name".into(), format!("{name}:{tag}"));
    let mut entry = descriptor(&manifest);
    entry["annotations"] = json!(annotations);
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [entry]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec_pretty(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(Layout {
        dir: dir.to_path_buf(),
        manifest,
        config,
        layer,
    })
}

/// `registry/repo:tag` -> (`registry/repo`, `tag`); `latest` when no tag is given.
pub fn split_reference(reference: &str) -> (&str, &str) {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    match last.rsplit_once(':') {
        Some((_, tag)) => (&reference[..reference.len() - tag.len() - 1], tag),
        None => (reference, "latest"),
    }
}

pub fn descriptor(b: &Blob) -> serde_json::Value {
    json!({"mediaType": b.media_type, "digest": b.digest, "size": b.size})
}

fn write_json_blob(blobs: &Path, media_type: &str, v: &serde_json::Value) -> io::Result<Blob> {
    let bytes = serde_json::to_vec(v)?;
    let (digest, size) = digest_of(&bytes[..])?;
    let path = blobs.join(digest.trim_start_matches("sha256:"));
    std::fs::write(&path, &bytes)?;
    Ok(Blob {
        digest,
        size,
        media_type: media_type.into(),
        path,
    })
}

/// The digest of the uncompressed contents of `path`, compressed with `codec`.
fn uncompressed_digest(path: &Path, codec: Codec) -> io::Result<String> {
    let wrap = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("reading {} as {}: {e}", path.display(), codec.name()),
        )
    };
    let decoded = codec.decoder(File::open(path)?).map_err(wrap)?;
    Ok(digest_of(decoded).map_err(wrap)?.0)
}

/// Packs a layout directory into an OCI archive (what `ctr images import` and
/// `podman load` read).
pub fn pack(layout: &Path, out: &Path) -> io::Result<()> {
    let mut tar = tar::Builder::new(File::create(out)?);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.append_path_with_name(layout.join("oci-layout"), "oci-layout")?;
    tar.append_path_with_name(layout.join("index.json"), "index.json")?;
    let mut blobs: Vec<PathBuf> = std::fs::read_dir(layout.join("blobs/sha256"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<io::Result<_>>()?;
    blobs.sort();
    for b in blobs {
        let name = format!(
            "blobs/sha256/{}",
            b.file_name().unwrap_or_default().to_string_lossy()
        );
        tar.append_path_with_name(&b, name)?;
    }
    tar.into_inner()?.flush()
}

/// Verifies a layout's blobs against their digests (what a registry or runtime will do).
pub fn verify(layout: &Layout) -> io::Result<()> {
    for b in [&layout.manifest, &layout.config, &layout.layer] {
        let (d, _) = digest_of(File::open(&b.path)?)?;
        if d != b.digest {
            return Err(io::Error::other(format!(
                "{} changed since the image was written (digest {d}, expected {})",
                b.path.display(),
                b.digest
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_name_and_tag() {
        assert_eq!(
            split_reference("reg:5000/ckpt/a:v1"),
            ("reg:5000/ckpt/a", "v1")
        );
        assert_eq!(
            split_reference("reg:5000/ckpt/a"),
            ("reg:5000/ckpt/a", "latest")
        );
    }

    #[test]
    fn a_layout_links_the_archive_and_names_the_container() {
        let d = tempfile::tempdir().unwrap();
        let archive = d.path().join("ckpt.tar");
        std::fs::write(&archive, vec![0u8; 10240]).unwrap();
        let spec = ImageSpec {
            reference: "reg/ckpt/train:1".into(),
            annotations: [(CRIO_CHECKPOINT_NAME.to_owned(), "trainer".to_owned())].into(),
            runtime_config: json!({}),
        };
        let l = write_layout(&d.path().join("img"), &archive, None, &spec).unwrap();
        verify(&l).unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&l.manifest.path).unwrap()).unwrap();
        assert_eq!(manifest["annotations"][CRIO_CHECKPOINT_NAME], "trainer");
        assert_eq!(manifest["layers"][0]["digest"], l.layer.digest.as_str());
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&l.config.path).unwrap()).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], l.layer.digest.as_str());
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.path().join("img/index.json")).unwrap())
                .unwrap();
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            "1"
        );
    }
}
