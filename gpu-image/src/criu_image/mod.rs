//! The little of CRIU's own images that a check outside CRIU needs, and that the guardian
//! needs after a killed CRIU: the plugin list and run id of `inventory.img` (CRIU >= 4.1 writes
//! there which plugins an image needs; `criu restore` refuses an image whose list names a plugin
//! it did not load), what the image's tasks mapped ([`cuda_mappers`],
//! [`shared_writable_mappings`]), and its regular files, unlinked ones included
//! ([`regular_files`]).
//!
//! CRIU's images are protobuf messages behind a magic number and a 32-bit length; only the fields
//! read here are decoded (`wire.rs`; criu/images/inventory.proto: `inventory_entry.plugins_entry
//! = 12`, `plugins_entry.plugins = 12`, repeated strings).

mod files;
mod tasks;
mod wire;

pub use self::files::{leftover_ghosts, regular_files, RegFile};
pub use self::tasks::{cuda_mappers, shared_writable_mappings, CudaMapper};
use self::wire::{bytes_field, Image, Value};

use std::path::Path;

/// `INVENTORY_MAGIC` (criu/include/magic.h); the inventory has no common magic before it.
const INVENTORY_MAGIC: u32 = 0x5831_3116;
const PLUGINS_ENTRY: u64 = 12;
const PLUGINS: u64 = 12;
/// inventory_entry.dump_criu_run_id: the id of the CRIU run that dumped the image.
const DUMP_RUN_ID: u64 = 13;
/// No inventory comes anywhere near this.
const MAX_INVENTORY: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CriuImageError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a valid CRIU image ({why}): the checkpoint is damaged or not a CRIU image directory")]
    Bad { path: String, why: &'static str },
}

/// The plugins the image's inventory lists: `Ok(None)` when it has no list (dumped by CRIU < 4.1,
/// or no plugin was needed and this CRIU writes none).
pub fn inventory_plugins(dir: &Path) -> Result<Option<Vec<String>>, CriuImageError> {
    let inv = Image::read(
        &dir.join("inventory.img"),
        false,
        INVENTORY_MAGIC,
        MAX_INVENTORY,
    )?;
    let entry = inv.entries.first().ok_or_else(|| inv.bad("no entry"))?;
    let mut list = None;
    for (tag, value) in inv.fields(entry)? {
        if let (PLUGINS_ENTRY, Value::Bytes(b)) = (tag, value) {
            let names = list.get_or_insert_with(Vec::new);
            for (t, v) in inv.fields(b)? {
                if let (PLUGINS, Value::Bytes(name)) = (t, v) {
                    names.push(String::from_utf8_lossy(name).into_owned());
                }
            }
        }
    }
    Ok(list)
}

/// The id of the CRIU run that dumped the image in `dir` (its network lock's table name).
pub fn dump_run_id(dir: &Path) -> Result<Option<String>, CriuImageError> {
    let inv = Image::read(
        &dir.join("inventory.img"),
        false,
        INVENTORY_MAGIC,
        MAX_INVENTORY,
    )?;
    let Some(entry) = inv.entries.first() else {
        return Ok(None);
    };
    Ok(bytes_field(&inv.fields(entry)?, DUMP_RUN_ID)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .filter(|s| !s.is_empty()))
}

#[cfg(test)]
mod tests;
