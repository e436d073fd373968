//! Garbage collection: the chunks no snapshot names are deleted, with the store's lock held
//! alone (no dump is writing, none starts meanwhile) and sparing chunks younger than a grace
//! period (a writer whose lease lapsed while it still wrote). A manifest that cannot be read
//! stops the collection: its chunks are not known, so none may go.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::backend::fs::TMP_PREFIX;
use crate::backend::Lock;
use crate::error::Result;
use crate::id::ChunkId;
use crate::Store;

#[derive(Debug, Clone)]
pub struct GcOptions {
    /// Chunks written less than this long ago stay.
    pub grace: Duration,
    pub lock_wait: Duration,
    /// Count what would go; delete nothing.
    pub dry_run: bool,
}

impl Default for GcOptions {
    fn default() -> GcOptions {
        GcOptions {
            grace: Duration::from_secs(15 * 60),
            lock_wait: crate::LOCK_WAIT,
            dry_run: false,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub snapshots: usize,
    pub kept_chunks: u64,
    pub kept_bytes: u64,
    pub deleted_chunks: u64,
    pub deleted_bytes: u64,
    /// Unnamed chunks younger than the grace period, kept.
    pub young_chunks: u64,
    /// Temporary files of interrupted writes, deleted.
    pub leftovers: u64,
    pub dry_run: bool,
}

impl Store {
    pub fn gc(&self, opts: &GcOptions) -> Result<GcReport> {
        let _held = self.objects.lock(Lock::Exclusive, opts.lock_wait)?;
        let mut report = GcReport {
            dry_run: opts.dry_run,
            ..GcReport::default()
        };
        let mut named = HashSet::new();
        for name in self.names()? {
            let m = self.manifest(&name)?;
            named.extend(m.chunk_refs().map(|r| r.id));
            report.snapshots += 1;
        }
        let old_enough = |modified: SystemTime| {
            SystemTime::now()
                .duration_since(modified)
                .is_ok_and(|age| age >= opts.grace)
        };
        for obj in self.objects.list("chunks/")? {
            let base = obj.key.rsplit('/').next().unwrap_or_default();
            let id = base.parse::<ChunkId>().ok();
            let leftover = base.starts_with(TMP_PREFIX);
            if id.is_some_and(|id| named.contains(&id)) {
                report.kept_chunks += 1;
                report.kept_bytes += obj.size;
                continue;
            }
            if id.is_none() && !leftover {
                continue;
            }
            if !old_enough(obj.modified) {
                report.young_chunks += u64::from(id.is_some());
                continue;
            }
            if !opts.dry_run {
                self.objects.delete(&obj.key)?;
            }
            if leftover {
                report.leftovers += 1;
            } else {
                report.deleted_chunks += 1;
                report.deleted_bytes += obj.size;
            }
        }
        Ok(report)
    }
}
