//! What each snapshot takes: its size, what writing it added to the store, and of its chunks
//! which it shares with other snapshots and which only it names (what deleting it frees).

use std::collections::HashMap;

use serde::Serialize;

use crate::error::Result;
use crate::id::ChunkId;
use crate::manifest::Written;
use crate::Store;

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotUsage {
    pub name: String,
    pub created: u64,
    pub host: String,
    /// Bytes of its files.
    pub bytes: u64,
    /// What writing it added (new chunks, their bytes, stored size) and how long it took.
    pub written: Written,
    /// Bytes of its distinct chunks that other snapshots name too.
    pub shared_bytes: u64,
    /// Bytes of its distinct chunks no other snapshot names, and what they take stored.
    pub own_bytes: u64,
    pub own_stored_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct StoreUsage {
    pub location: String,
    pub snapshots: Vec<SnapshotUsage>,
    /// Every chunk object, named or not, and its stored bytes.
    pub chunks: u64,
    pub stored_bytes: u64,
    /// Bytes of all snapshots' files together.
    pub logical_bytes: u64,
    /// Snapshots whose manifest could not be read, with why.
    pub damaged: Vec<(String, String)>,
}

impl Store {
    pub fn usage(&self) -> Result<StoreUsage> {
        let mut manifests = Vec::new();
        let mut damaged = Vec::new();
        for name in self.names()? {
            match self.manifest(&name) {
                Ok(m) => manifests.push(m),
                Err(e) => damaged.push((name, e.to_string())),
            }
        }
        // In how many snapshots each chunk is, its length, and its stored size.
        let mut users: HashMap<ChunkId, (u32, u64)> = HashMap::new();
        let distinct: Vec<HashMap<ChunkId, u64>> = manifests
            .iter()
            .map(|m| m.chunk_refs().map(|r| (r.id, r.len)).collect())
            .collect();
        for d in &distinct {
            for (id, len) in d {
                users.entry(*id).or_insert((0, *len)).0 += 1;
            }
        }
        let mut stored: HashMap<ChunkId, u64> = HashMap::new();
        let (mut chunks, mut stored_bytes) = (0, 0);
        for obj in self.objects.list("chunks/")? {
            if let Ok(id) = obj.key.rsplit('/').next().unwrap_or_default().parse() {
                stored.insert(id, obj.size);
                chunks += 1;
                stored_bytes += obj.size;
            }
        }
        let snapshots = manifests
            .iter()
            .zip(&distinct)
            .map(|(m, d)| {
                let mut u = SnapshotUsage {
                    name: m.name.clone(),
                    created: m.created,
                    host: m.host.clone(),
                    bytes: m.written.bytes,
                    written: m.written.clone(),
                    shared_bytes: 0,
                    own_bytes: 0,
                    own_stored_bytes: 0,
                };
                for (id, len) in d {
                    if users[id].0 > 1 {
                        u.shared_bytes += len;
                    } else {
                        u.own_bytes += len;
                        u.own_stored_bytes += stored.get(id).copied().unwrap_or(0);
                    }
                }
                u
            })
            .collect::<Vec<_>>();
        Ok(StoreUsage {
            location: self.location(),
            logical_bytes: snapshots.iter().map(|s| s.bytes).sum(),
            snapshots,
            chunks,
            stored_bytes,
            damaged,
        })
    }
}
