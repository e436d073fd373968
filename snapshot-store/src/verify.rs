//! Checking snapshots without restoring them: every chunk they name read and checked against
//! its name, each missing or damaged one reported with a snapshot, file and bytes it belongs to.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use crate::backend::Lock;
use crate::error::Result;
use crate::id::ChunkId;
use crate::manifest::{ChunkRef, Manifest};
use crate::Store;

#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    pub snapshots: Vec<String>,
    pub chunks: u64,
    pub bytes: u64,
    /// Each problem in words: a damaged manifest, a missing or damaged chunk.
    pub problems: Vec<String>,
}

impl Store {
    /// Checks the snapshots named (all when none are).
    pub fn verify(&self, names: &[String], opts: &crate::GetOptions) -> Result<VerifyReport> {
        let _held = self.objects.lock(Lock::Shared, opts.lock_wait)?;
        let names = if names.is_empty() {
            self.names()?
        } else {
            names.to_vec()
        };
        let mut report = VerifyReport::default();
        let mut manifests: Vec<Manifest> = Vec::new();
        for name in &names {
            match self.manifest(name) {
                Ok(m) => manifests.push(m),
                Err(e) => report.problems.push(e.to_string()),
            }
            report.snapshots.push(name.clone());
        }
        let mut distinct: HashMap<ChunkId, ChunkRef<'_>> = HashMap::new();
        for m in &manifests {
            for r in m.chunk_refs() {
                distinct.entry(r.id).or_insert(r);
            }
        }
        let refs: Vec<&ChunkRef<'_>> = distinct.values().collect();
        let next = AtomicUsize::new(0);
        let problems = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..opts.threads.max(1) {
                s.spawn(|| {
                    while let Some(r) = refs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if let Err(e) = self.with_chunk(r, |_| Ok(())) {
                            problems.lock().expect("the problems").push(e.to_string());
                        }
                    }
                });
            }
        });
        report.chunks = refs.len() as u64;
        report.bytes = refs.iter().map(|r| r.len).sum();
        let mut found = problems.into_inner().expect("the problems");
        found.sort();
        report.problems.extend(found);
        Ok(report)
    }
}
