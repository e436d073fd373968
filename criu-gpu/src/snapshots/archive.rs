//! Trees that are not image directories: a container checkpoint archive (Podman's `--export`,
//! CRI-O's, the kubelet's) is stored as the files it holds, so its pages images dedup like any
//! other, and exported back as a tar that `podman container restore --import` takes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use snapshot_store::{Entry, PutOptions, Store, Written};

use crate::archive::ArchiveError;
use crate::error::Error;

/// Stores `path` (an image directory, an extracted archive, or an archive file) as `name`.
pub fn put_path(
    store: &Store,
    name: &str,
    path: &Path,
    opts: &PutOptions,
) -> Result<Written, Error> {
    let meta =
        std::fs::metadata(path).map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?;
    if meta.is_dir() {
        return Ok(store.put(name, path, opts)?.written);
    }
    let scratch = tempfile::Builder::new()
        .prefix("criu-gpu-archive-")
        .tempdir_in(if Path::new("/dev/shm").is_dir() {
            Path::new("/dev/shm")
        } else {
            Path::new("/tmp")
        })
        .map_err(|e| Error::Refused(format!("a scratch directory for the archive: {e}")))?;
    crate::archive::extract(path, scratch.path())?;
    Ok(store.put(name, scratch.path(), opts)?.written)
}

/// Writes snapshot `name` as an uncompressed tar at `output`, straight from the store.
pub fn export(store: &Store, name: &str, output: &Path) -> Result<u64, Error> {
    let manifest = store.manifest(name)?;
    let io = |e: std::io::Error| {
        Error::Archive(ArchiveError::Io {
            path: output.display().to_string(),
            source: e,
        })
    };
    let mut tar = tar::Builder::new(BufWriter::with_capacity(
        1 << 20,
        File::create(output).map_err(io)?,
    ));
    let mut bytes = 0;
    for e in &manifest.entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(manifest.created);
        match e {
            Entry::Dir { path, mode } => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                h.set_size(0);
                tar.append_data(&mut h, path, std::io::empty())
                    .map_err(io)?;
            }
            Entry::Link { path, target } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                tar.append_link(&mut h, path, target).map_err(io)?;
            }
            Entry::File {
                path, mode, size, ..
            } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(*size);
                let data = store.file_reader(&manifest, path);
                tar.append_data(&mut h, path, data).map_err(io)?;
                bytes += size;
            }
        }
    }
    let mut inner = tar.into_inner().map_err(io)?;
    inner.flush().map_err(io)?;
    inner
        .into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    Ok(bytes)
}
