//! Where a store keeps its objects: a directory of a local or network file system ([`fs`]), or
//! an object store through the `object_store` crate ([`object`]). Both hold the same keys:
//! `store.json`, `chunks/<2 hex>/<hash>`, `snapshots/<name>.json`; they differ in how writes
//! become durable and how dumps and garbage collection keep out of each other's way.

pub mod fs;
mod lease;
pub mod object;

use std::time::{Duration, SystemTime};

use crate::error::Result;

/// One object as listed.
#[derive(Debug, Clone)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    pub modified: SystemTime,
}

/// Dumps, restores and deletions share the store; garbage collection has it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    Shared,
    Exclusive,
}

/// Held while the lock is: dropping it lets go.
pub trait Held: Send {}

pub trait Objects: Send + Sync {
    /// The store's root, for messages.
    fn location(&self) -> String;
    /// Where one object is, for messages (a path or a URL).
    fn where_is(&self, key: &str) -> String;
    /// Writes `key` whole (a reader sees all of it or nothing). With `create_only`, writes
    /// nothing and answers false when it exists.
    fn put(&self, key: &str, bytes: &[u8], create_only: bool) -> Result<bool>;
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    fn exists(&self, key: &str) -> Result<bool>;
    /// Every object under `prefix` (a folder, ending in '/').
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>>;
    /// Deletes `key`; one already gone is no error.
    fn delete(&self, key: &str) -> Result<()>;
    /// Makes every object written so far durable (before a manifest names them).
    fn sync(&self) -> Result<()>;
    /// Takes the store's lock, waiting at most `wait` for it.
    fn lock(&self, how: Lock, wait: Duration) -> Result<Box<dyn Held>>;
}

/// Opens the objects at `location`: a path (or `file://` URL) is a directory of a file system,
/// `memory://` an object store in this process's memory (tests), other URLs an object store.
pub fn open(location: &str) -> Result<Box<dyn Objects>> {
    if let Some(path) = location.strip_prefix("file://") {
        return Ok(Box::new(fs::FsObjects::new(path.into())));
    }
    if location.contains("://") {
        return Ok(Box::new(object::ObjectStoreObjects::from_url(location)?));
    }
    Ok(Box::new(fs::FsObjects::new(location.into())))
}
