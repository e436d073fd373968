//! What can go wrong in a store, each with what to do about it.

use std::io;
use std::time::Duration;

use crate::id::ChunkId;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{location} is not a snapshot store (no {config}): a `criu-gpu dump --store` makes one, or name the store's root")]
    NotAStore {
        location: String,
        config: &'static str,
    },
    #[error("{location}: the store's {config} is unreadable ({why}); it was written by another tool or damaged")]
    BadConfig {
        location: String,
        config: &'static str,
        why: String,
    },
    #[error("{0:?} is not a snapshot name: use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.'")]
    BadName(String),
    #[error("the store already holds a snapshot named {0}: choose another name, or delete that one first")]
    SnapshotExists(String),
    #[error("the store holds no snapshot named {0} (`criu-gpu store list` shows those it holds)")]
    NoSnapshot(String),
    #[error(
        "snapshot {name}: its manifest is damaged ({why}); its chunks are kept until it is deleted"
    )]
    DamagedManifest { name: String, why: String },
    #[error("chunk {id} of {file} (bytes {offset}..{end}) is missing from the store: the snapshot cannot be restored; was the store copied in part, or a chunk deleted by hand?", end = offset + len)]
    MissingChunk {
        id: ChunkId,
        file: String,
        offset: u64,
        len: u64,
    },
    #[error("chunk {id} of {file} (bytes {offset}..{end}) is damaged: {why}; refused. The store's copy is {key}: `criu-gpu store verify` lists every damaged chunk", end = offset + len)]
    DamagedChunk {
        id: ChunkId,
        file: String,
        offset: u64,
        len: u64,
        key: String,
        why: String,
    },
    #[error("{what} waited {waited:?} for {holder}; try again when it is done")]
    Busy {
        what: &'static str,
        holder: String,
        waited: Duration,
    },
    #[error("{source_path}: {why}")]
    BadSource { source_path: String, why: String },
    #[error("the object store at {location}: {op}: {source}")]
    Object {
        location: String,
        op: String,
        source: object_store::Error,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// `map_err` helper: an I/O error with what was being done.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}
