//! Checkpoint images stored by content. A snapshot is a tree of files (a CRIU image directory,
//! or a container checkpoint archive's files) cut into content-defined chunks ([`chunker`]),
//! each named by the BLAKE3 hash of its content ([`id`]) and stored once, compressed where that
//! pays ([`codec`]); a manifest per snapshot lists its files' chunks ([`manifest`]). A second
//! snapshot of a process whose memory mostly did not change stores only what did, and replicas
//! of one server share their chunks.
//!
//! The store lives in a directory of a local or network file system, or in an object store
//! ([`backend`]). Writing a snapshot ([`Store::put`]) stores its chunks first, makes them
//! durable, then writes its manifest, under a shared lock; garbage collection ([`Store::gc`])
//! takes the lock alone and spares chunks younger than a grace period, so a collection never
//! takes the chunks of a snapshot being written. Reading ([`Store::get`]) checks every chunk
//! against its name and refuses a damaged or missing one by name.

pub mod backend;
pub mod chunker;
pub mod codec;
pub mod error;
mod gc;
mod get;
pub mod id;
pub mod manifest;
mod mapped;
mod put;
mod usage;
mod verify;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use backend::{Lock, Objects};
pub use chunker::Chunking;
pub use codec::Compression;
pub use error::{Result, StoreError};
pub use gc::{GcOptions, GcReport};
pub use get::{FileReader, GetOptions, GetReport};
pub use id::ChunkId;
pub use manifest::{Entry, Manifest, Written};
pub use put::PutOptions;
pub use usage::{SnapshotUsage, StoreUsage};
pub use verify::VerifyReport;

/// The store's settings, fixed when it is made: snapshots dedup against each other only when
/// cut the same way.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Config {
    pub format: u32,
    pub hash: String,
    pub chunking: Chunking,
}

const CONFIG: &str = "store.json";
const FORMAT: u32 = 1;

/// How long a command waits for the store's lock by default.
pub const LOCK_WAIT: Duration = Duration::from_secs(600);

pub struct Store {
    objects: Box<dyn Objects>,
    config: Config,
}

impl Store {
    /// The store at `location` (a directory, or an object store URL), which must exist.
    pub fn open(location: &str) -> Result<Store> {
        Store::with_objects(backend::open(location)?, None)
    }

    /// The store at `location`, made with `chunking` if there is none yet.
    pub fn open_or_create(location: &str, chunking: Chunking) -> Result<Store> {
        Store::with_objects(backend::open(location)?, Some(chunking))
    }

    /// The store in `objects`; made with `create` if there is none and it is given.
    pub fn with_objects(objects: Box<dyn Objects>, create: Option<Chunking>) -> Result<Store> {
        let bad = |why: String| StoreError::BadConfig {
            location: objects.location(),
            config: CONFIG,
            why,
        };
        if let Some(chunking) = create {
            chunking.check().map_err(bad)?;
            let config = Config {
                format: FORMAT,
                hash: "blake3".into(),
                chunking,
            };
            let bytes = serde_json::to_vec_pretty(&config).expect("a config serializes");
            // Two dumps that make the store at once: one config wins, both read it.
            objects.put(CONFIG, &bytes, true)?;
        }
        let Some(bytes) = objects.get(CONFIG)? else {
            return Err(StoreError::NotAStore {
                location: objects.location(),
                config: CONFIG,
            });
        };
        let config: Config = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if config.format != FORMAT || config.hash != "blake3" {
            return Err(bad(format!(
                "format {} with {} (this criu-gpu reads format {FORMAT}, blake3)",
                config.format, config.hash
            )));
        }
        config.chunking.check().map_err(bad)?;
        Ok(Store { objects, config })
    }

    pub fn location(&self) -> String {
        self.objects.location()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The snapshots' names, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .objects
            .list("snapshots/")?
            .into_iter()
            .filter_map(|m| {
                let name = m.key.strip_prefix("snapshots/")?.strip_suffix(".json")?;
                manifest::check_name(name).then(|| name.to_owned())
            })
            .collect();
        names.sort();
        Ok(names)
    }

    pub fn manifest(&self, name: &str) -> Result<Manifest> {
        check_name(name)?;
        let bytes = self
            .objects
            .get(&manifest_key(name))?
            .ok_or_else(|| StoreError::NoSnapshot(name.to_owned()))?;
        Manifest::from_bytes(&bytes).map_err(|why| StoreError::DamagedManifest {
            name: name.to_owned(),
            why,
        })
    }

    /// Whether a new snapshot can be named `name`: a valid name no snapshot has yet (asked
    /// before a dump freezes anything; `put` checks again).
    pub fn check_new(&self, name: &str) -> Result<()> {
        check_name(name)?;
        if self.objects.exists(&manifest_key(name))? {
            return Err(StoreError::SnapshotExists(name.to_owned()));
        }
        Ok(())
    }

    /// Deletes a snapshot's manifest; its chunks go at the next garbage collection.
    pub fn delete(&self, name: &str, lock_wait: Duration) -> Result<()> {
        check_name(name)?;
        let _held = self.objects.lock(Lock::Shared, lock_wait)?;
        let key = manifest_key(name);
        if !self.objects.exists(&key)? {
            return Err(StoreError::NoSnapshot(name.to_owned()));
        }
        self.objects.delete(&key)
    }

    /// The store's objects, for what this crate does not do itself (tests, tools).
    pub fn objects(&self) -> &dyn Objects {
        self.objects.as_ref()
    }
}

fn check_name(name: &str) -> Result<()> {
    if manifest::check_name(name) {
        Ok(())
    } else {
        Err(StoreError::BadName(name.to_owned()))
    }
}

fn manifest_key(name: &str) -> String {
    format!("snapshots/{name}.json")
}

pub fn chunk_key(id: &ChunkId) -> String {
    let hex = id.hex();
    format!("chunks/{}/{hex}", &hex[..2])
}

/// This machine's name, for manifests and leases.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// Threads for chunking, hashing, compressing and moving chunks: every CPU, and at least 4,
/// as each also waits on the store's disk or network.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .clamp(4, 32)
}

/// Runs `work` on every item of `items` by `threads` threads at once, each taking the next item
/// left; the first error stops the others from taking more, and is returned.
fn in_parallel<T: Sync>(
    items: &[T],
    threads: usize,
    work: impl Fn(usize, &T) -> error::Result<()> + Sync,
) -> error::Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { return };
                if let Err(e) = work(i, item) {
                    failed.lock().expect("the error slot").get_or_insert(e);
                    next.store(items.len(), Ordering::Relaxed);
                }
            });
        }
    });
    match failed.into_inner().expect("the error slot") {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
