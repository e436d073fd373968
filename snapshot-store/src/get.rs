//! Reading a snapshot back into a tree of files: every chunk fetched, decompressed and checked
//! against its name by several threads, written in place; a missing or damaged chunk fails the
//! whole read, naming the chunk, its file and its bytes.

use std::fs::OpenOptions;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::backend::Lock;
use crate::error::{io, Result, StoreError};
use crate::id::ChunkId;
use crate::manifest::{ChunkRef, Entry, Manifest};
use crate::mapped::Target;
use crate::{chunk_key, codec, Store};

#[derive(Debug, Clone)]
pub struct GetOptions {
    pub threads: usize,
    pub lock_wait: Duration,
}

impl Default for GetOptions {
    fn default() -> GetOptions {
        GetOptions {
            threads: crate::default_threads(),
            lock_wait: crate::LOCK_WAIT,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GetReport {
    pub name: String,
    pub bytes: u64,
    /// What was read from the store (compressed chunks count as stored).
    pub stored_bytes: u64,
    pub chunks: u64,
    pub seconds: f64,
}

impl Store {
    /// Writes snapshot `name` into `dest`, which must not exist or be empty.
    pub fn get(&self, name: &str, dest: &Path, opts: &GetOptions) -> Result<GetReport> {
        let _held = self.objects.lock(Lock::Shared, opts.lock_wait)?;
        let manifest = self.manifest(name)?;
        let start = Instant::now();
        let files = lay_out(&manifest, dest)?;
        let refs: Vec<(usize, ChunkRef<'_>)> = refs_by_file(&manifest);
        let stored = AtomicU64::new(0);
        crate::in_parallel(&refs, opts.threads, |_, (file, r)| {
            self.fetch_one(r, &files[*file], &stored)
        })?;
        set_modes(&manifest, dest)?;
        Ok(GetReport {
            name: name.to_owned(),
            bytes: refs.iter().map(|(_, r)| r.len).sum(),
            stored_bytes: stored.into_inner(),
            chunks: refs.len() as u64,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// The content of the file `path` of `manifest`, read chunk by chunk, each checked (for
    /// archives made from the store, without a copy of the tree). A missing or damaged chunk
    /// is a read error that names it.
    pub fn file_reader<'a>(&'a self, manifest: &'a Manifest, path: &str) -> FileReader<'a> {
        FileReader {
            store: self,
            refs: manifest.chunk_refs().filter(|r| r.file == path).collect(),
            next: 0,
            buf: Vec::new(),
            pos: 0,
        }
    }

    fn fetch_one(&self, r: &ChunkRef<'_>, file: &Target, stored: &AtomicU64) -> Result<()> {
        let n = self.with_chunk(r, |data| {
            file.write_at(data, r.offset)
                .map_err(io(format!("writing {}", r.file)))
        })?;
        stored.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Reads a chunk, checks its content against its name and length, and hands the content
    /// to `f`; answers its stored size.
    pub(crate) fn with_chunk(
        &self,
        r: &ChunkRef<'_>,
        f: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<u64> {
        let key = chunk_key(&r.id);
        let bytes = self
            .objects
            .get(&key)?
            .ok_or_else(|| StoreError::MissingChunk {
                id: r.id,
                file: r.file.to_owned(),
                offset: r.offset,
                len: r.len,
            })?;
        let damaged = |why: String| StoreError::DamagedChunk {
            id: r.id,
            file: r.file.to_owned(),
            offset: r.offset,
            len: r.len,
            key: self.objects.where_is(&key),
            why,
        };
        let data = codec::decode(&bytes).map_err(damaged)?;
        let got = ChunkId::of(&data);
        if got != r.id {
            return Err(damaged(format!("its content hashes to {got}")));
        }
        if data.len() as u64 != r.len {
            return Err(damaged(format!(
                "{} bytes where the manifest says {}",
                data.len(),
                r.len
            )));
        }
        f(&data)?;
        Ok(bytes.len() as u64)
    }
}

/// The directories, links and files of the tree, files at their full size; the files open.
fn lay_out(manifest: &Manifest, dest: &Path) -> Result<Vec<Target>> {
    let what = || format!("creating {}", dest.display());
    std::fs::create_dir_all(dest).map_err(io(what()))?;
    if std::fs::read_dir(dest)
        .map_err(io(what()))?
        .next()
        .is_some()
    {
        return Err(StoreError::BadSource {
            source_path: dest.display().to_string(),
            why: "is not empty: a snapshot is read into a new or empty directory".into(),
        });
    }
    let mut files = Vec::new();
    for e in &manifest.entries {
        let path = dest.join(e.path());
        let what = || format!("creating {}", path.display());
        match e {
            Entry::Dir { .. } => std::fs::create_dir_all(&path).map_err(io(what()))?,
            Entry::Link { target, .. } => {
                std::os::unix::fs::symlink(target, &path).map_err(io(what()))?;
            }
            Entry::File { size, .. } => {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(io(what()))?;
                f.set_len(*size).map_err(io(what()))?;
                files.push(Target::new(f, *size).map_err(io(what()))?);
            }
        }
    }
    Ok(files)
}

/// Every chunk reference with the index of its file among the file entries.
fn refs_by_file(manifest: &Manifest) -> Vec<(usize, ChunkRef<'_>)> {
    let order: std::collections::HashMap<&str, usize> = manifest
        .entries
        .iter()
        .filter(|e| matches!(e, Entry::File { .. }))
        .enumerate()
        .map(|(i, e)| (e.path(), i))
        .collect();
    manifest.chunk_refs().map(|r| (order[r.file], r)).collect()
}

fn set_modes(manifest: &Manifest, dest: &Path) -> Result<()> {
    // Children first: a directory without write permission is set last.
    for e in manifest.entries.iter().rev() {
        let mode = match e {
            Entry::Dir { mode, .. } | Entry::File { mode, .. } => *mode,
            Entry::Link { .. } => continue,
        };
        let path = dest.join(e.path());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(io(format!("setting the mode of {}", path.display())))?;
    }
    Ok(())
}

pub struct FileReader<'a> {
    store: &'a Store,
    refs: Vec<ChunkRef<'a>>,
    next: usize,
    buf: Vec<u8>,
    pos: usize,
}

impl std::io::Read for FileReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            let Some(r) = self.refs.get(self.next) else {
                return Ok(0);
            };
            let mut buf = Vec::new();
            self.store
                .with_chunk(r, |data| {
                    buf = data.to_vec();
                    Ok(())
                })
                .map_err(std::io::Error::other)?;
            self.buf = buf;
            self.next += 1;
            self.pos = 0;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
