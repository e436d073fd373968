//! Writing a snapshot: the tree is walked, every file cut into chunks, every chunk hashed and,
//! if the store lacks it, compressed and stored, by several threads; then the new chunks are
//! made durable, and only then is the manifest written (create-only: two writers of one name
//! cannot both win).

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backend::Lock;
use crate::codec::{self, Compression, Pays};
use crate::error::{io, Result, StoreError};
use crate::id::ChunkId;
use crate::manifest::{Entry, Manifest, Written, FORMAT};
use crate::mapped::Mapped;
use crate::{check_name, chunk_key, chunker, manifest_key, Store};

#[derive(Debug, Clone)]
pub struct PutOptions {
    pub compression: Compression,
    pub threads: usize,
    pub lock_wait: Duration,
    /// Tests of the store's concurrency only: the writer stops between its chunks and its
    /// manifest while this file exists (at most 120 s), after creating `FILE.held` to say so.
    pub hold: Option<PathBuf>,
}

impl Default for PutOptions {
    fn default() -> PutOptions {
        PutOptions {
            compression: Compression::default(),
            threads: crate::default_threads(),
            lock_wait: crate::LOCK_WAIT,
            hold: None,
        }
    }
}

/// One file of the tree, mapped, with its cut points.
struct Source {
    entry: usize,
    map: Mapped,
    cuts: Vec<usize>,
    pays: Pays,
}

/// One chunk to store: which file, where.
struct Job {
    file: usize,
    from: usize,
    to: usize,
}

#[derive(Default)]
struct Tally {
    new_chunks: AtomicU64,
    new_bytes: AtomicU64,
    new_stored: AtomicU64,
}

impl Store {
    /// Stores the tree at `source` as snapshot `name`.
    pub fn put(&self, name: &str, source: &Path, opts: &PutOptions) -> Result<Manifest> {
        check_name(name)?;
        let _held = self.objects.lock(Lock::Shared, opts.lock_wait)?;
        if self.objects.exists(&manifest_key(name))? {
            return Err(StoreError::SnapshotExists(name.to_owned()));
        }
        let start = Instant::now();
        let mut entries = Vec::new();
        let mut paths = Vec::new();
        walk(source, source, &mut entries, &mut paths)?;
        let sources = self.cut(&entries, &paths, opts.threads)?;
        let cut_seconds = start.elapsed().as_secs_f64();
        let tally = Tally::default();
        let ids = self.store_chunks(&sources, opts, &tally)?;
        let synced = Instant::now();
        self.objects.sync()?;
        let sync_seconds = synced.elapsed().as_secs_f64();
        fill_chunks(&mut entries, &sources, ids);
        if let Some(hold) = &opts.hold {
            hold_before_manifest(hold);
        }
        let manifest = Manifest {
            format: FORMAT,
            name: name.to_owned(),
            created: crate::now_secs(),
            host: crate::host_name(),
            source: source.display().to_string(),
            written: written(&entries, &tally, opts, start, cut_seconds, sync_seconds),
            entries,
        };
        if !self
            .objects
            .put(&manifest_key(name), &manifest.to_bytes(), true)?
        {
            return Err(StoreError::SnapshotExists(name.to_owned()));
        }
        Ok(manifest)
    }

    /// Every file mapped and cut.
    fn cut(&self, entries: &[Entry], paths: &[PathBuf], threads: usize) -> Result<Vec<Source>> {
        let mut sources = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if let Entry::File { .. } = e {
                let map = Mapped::open(&paths[i])?;
                let cuts = chunker::cut_points(map.bytes(), self.config.chunking, threads);
                sources.push(Source {
                    entry: i,
                    map,
                    cuts,
                    pays: Pays::default(),
                });
            }
        }
        Ok(sources)
    }

    /// Hashes every chunk and stores those the store lacks; the names, per file, in order.
    fn store_chunks(
        &self,
        sources: &[Source],
        opts: &PutOptions,
        tally: &Tally,
    ) -> Result<Vec<Vec<ChunkId>>> {
        let jobs: Vec<Job> = sources
            .iter()
            .enumerate()
            .flat_map(|(file, s)| {
                let mut from = 0;
                s.cuts.iter().map(move |&to| {
                    let j = Job { file, from, to };
                    from = to;
                    j
                })
            })
            .collect();
        let ids: Vec<Mutex<Option<ChunkId>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
        let seen = Mutex::new(HashSet::new());
        crate::in_parallel(&jobs, opts.threads, |i, job| {
            let id = self.store_one(&sources[job.file], job, opts, &seen, tally)?;
            *ids[i].lock().expect("an id slot") = Some(id);
            Ok(())
        })?;
        let mut out: Vec<Vec<ChunkId>> = sources.iter().map(|_| Vec::new()).collect();
        for (job, id) in jobs.iter().zip(ids) {
            out[job.file].push(
                id.into_inner()
                    .expect("an id slot")
                    .expect("every chunk stored"),
            );
        }
        Ok(out)
    }

    fn store_one(
        &self,
        source: &Source,
        job: &Job,
        opts: &PutOptions,
        seen: &Mutex<HashSet<ChunkId>>,
        tally: &Tally,
    ) -> Result<ChunkId> {
        let data = &source.map.bytes()[job.from..job.to];
        let id = ChunkId::of(data);
        let first = seen.lock().expect("the seen set").insert(id);
        let key = chunk_key(&id);
        if first && !self.objects.exists(&key)? {
            let stored = codec::encode(data, opts.compression, &source.pays);
            self.objects.put(&key, &stored, false)?;
            tally.new_chunks.fetch_add(1, Ordering::Relaxed);
            tally
                .new_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            tally
                .new_stored
                .fetch_add(stored.len() as u64, Ordering::Relaxed);
        }
        Ok(id)
    }
}

/// The tree under `dir`: entries in order, parents first, names sorted; `paths` beside them.
fn walk(root: &Path, dir: &Path, entries: &mut Vec<Entry>, paths: &mut Vec<PathBuf>) -> Result<()> {
    let what = || format!("reading {}", dir.display());
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(what()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(io(what()))?;
    names.sort();
    for path in names {
        let meta =
            std::fs::symlink_metadata(&path).map_err(io(format!("reading {}", path.display())))?;
        let rel = path
            .strip_prefix(root)
            .map_err(|_| bad(&path, "outside the tree"))?
            .to_str()
            .ok_or_else(|| bad(&path, "its name is not UTF-8"))?
            .to_owned();
        let mode = meta.permissions().mode() & 0o7777;
        let t = meta.file_type();
        if t.is_dir() {
            entries.push(Entry::Dir { path: rel, mode });
            paths.push(path.clone());
            walk(root, &path, entries, paths)?;
        } else if t.is_file() {
            entries.push(Entry::File {
                path: rel,
                mode,
                size: meta.size(),
                chunks: Vec::new(),
            });
            paths.push(path);
        } else if t.is_symlink() {
            let target =
                std::fs::read_link(&path).map_err(io(format!("reading {}", path.display())))?;
            let target = target
                .to_str()
                .ok_or_else(|| bad(&path, "its target is not UTF-8"))?
                .to_owned();
            entries.push(Entry::Link { path: rel, target });
            paths.push(path);
        } else {
            return Err(bad(
                &path,
                "neither a file, a directory nor a symbolic link: a store keeps only those",
            ));
        }
    }
    Ok(())
}

fn bad(path: &Path, why: &str) -> StoreError {
    StoreError::BadSource {
        source_path: path.display().to_string(),
        why: why.to_owned(),
    }
}

/// The chunk lists into the file entries.
fn fill_chunks(entries: &mut [Entry], sources: &[Source], ids: Vec<Vec<ChunkId>>) {
    for (s, ids) in sources.iter().zip(ids) {
        if let Entry::File { chunks, .. } = &mut entries[s.entry] {
            let mut from = 0;
            *chunks = s
                .cuts
                .iter()
                .zip(ids)
                .map(|(&to, id)| {
                    let len = (to - from) as u32;
                    from = to;
                    (id, len)
                })
                .collect();
        }
    }
}

fn written(
    entries: &[Entry],
    tally: &Tally,
    opts: &PutOptions,
    start: Instant,
    cut_seconds: f64,
    sync_seconds: f64,
) -> Written {
    let (mut bytes, mut chunks) = (0, 0);
    for e in entries {
        if let Entry::File {
            size, chunks: c, ..
        } = e
        {
            bytes += size;
            chunks += c.len() as u64;
        }
    }
    Written {
        bytes,
        chunks,
        new_chunks: tally.new_chunks.load(Ordering::Relaxed),
        new_bytes: tally.new_bytes.load(Ordering::Relaxed),
        new_stored_bytes: tally.new_stored.load(Ordering::Relaxed),
        compression: Some(opts.compression),
        seconds: start.elapsed().as_secs_f64(),
        cut_seconds,
        sync_seconds,
    }
}

/// Tests of the store's concurrency (tests/tests/store.rs) hold a writer between its chunks and
/// its manifest ([`PutOptions::hold`]): it creates `hold`.held and waits while `hold` exists (at
/// most 120 s).
fn hold_before_manifest(hold: &Path) {
    let mut held = hold.as_os_str().to_owned();
    held.push(".held");
    let _ = std::fs::write(&held, b"");
    let start = Instant::now();
    while hold.exists() && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(20));
    }
}
