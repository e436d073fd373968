//! Locks for object stores, which have none: each user of the store writes a lease object
//! (`locks/use-*` for dumps, restores and deletions, `locks/gc-*` for a garbage collection),
//! renewed while it works and ignored once expired (a user that died). A user first writes its
//! lease, then lists the others: a dump that sees a live collection, or a collection that sees
//! any other live lease, takes its own back and tries again later. Of two that start together
//! at least one sees the other (a list after a put sees it; S3 is strongly consistent), so a
//! collection never runs while a dump writes chunks it could take.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::object::Inner;
use super::{Held, Lock};
use crate::error::{Result, StoreError};

const PREFIX: &str = "locks/";

#[derive(Serialize, Deserialize)]
struct Body {
    /// Milliseconds since the epoch after which the lease counts for nothing.
    expires_ms: u128,
    host: String,
    pid: u32,
}

pub(super) struct Lease {
    inner: Arc<Inner>,
    key: String,
    stop: Option<mpsc::Sender<()>>,
    renewer: Option<JoinHandle<()>>,
}

impl Held for Lease {}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn write(inner: &Inner, key: &str, ttl: Duration) -> Result<()> {
    let body = Body {
        expires_ms: now_ms() + ttl.as_millis(),
        host: crate::host_name(),
        pid: std::process::id(),
    };
    let bytes = serde_json::to_vec(&body).expect("a lease serializes");
    inner.put(key, &bytes, false).map(|_| ())
}

/// The live leases other than `mine`, by key.
fn others(inner: &Inner, mine: &str) -> Result<Vec<String>> {
    let now = now_ms();
    let mut live = Vec::new();
    for m in inner.list(PREFIX)? {
        if m.key == mine {
            continue;
        }
        let got = inner.rt.block_on(async {
            use object_store::ObjectStoreExt;
            let r = inner
                .store
                .get(&object_store::path::Path::from(m.key.as_str()))
                .await?;
            r.bytes().await
        });
        let alive = match got {
            Ok(b) => serde_json::from_slice::<Body>(&b).is_ok_and(|b| b.expires_ms > now),
            Err(_) => false,
        };
        if alive {
            live.push(m.key);
        }
    }
    Ok(live)
}

impl Lease {
    /// Renewed three times per life.
    pub(super) const TTL: Duration = Duration::from_secs(90);

    pub(super) fn take(
        inner: Arc<Inner>,
        how: Lock,
        wait: Duration,
        ttl: Duration,
    ) -> Result<Lease> {
        let kind = match how {
            Lock::Shared => "use",
            Lock::Exclusive => "gc",
        };
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let key = format!(
            "{PREFIX}{kind}-{}-{}-{}-{}",
            crate::host_name(),
            std::process::id(),
            now_ms(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let start = Instant::now();
        loop {
            write(&inner, &key, ttl)?;
            let blocking: Vec<String> = others(&inner, &key)?
                .into_iter()
                .filter(|k| how == Lock::Exclusive || k.starts_with("locks/gc-"))
                .collect();
            if blocking.is_empty() {
                return Ok(Lease::renewed(inner, key, ttl));
            }
            inner.delete(&key)?;
            if start.elapsed() >= wait {
                return Err(StoreError::Busy {
                    what: if how == Lock::Shared {
                        "using the store"
                    } else {
                        "garbage collection"
                    },
                    holder: blocking.join(", "),
                    waited: start.elapsed(),
                });
            }
            // Apart in time, so that two collections starting together do not meet again.
            let jitter = u64::from(std::process::id() % 7) * 20 + (now_ms() % 50) as u64;
            std::thread::sleep(Duration::from_millis(100 + jitter));
        }
    }

    fn renewed(inner: Arc<Inner>, key: String, ttl: Duration) -> Lease {
        let (stop, stopped) = mpsc::channel::<()>();
        let (i, k) = (inner.clone(), key.clone());
        let renewer = std::thread::spawn(move || loop {
            match stopped.recv_timeout(ttl / 3) {
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = write(&i, &k, ttl) {
                        tracing::warn!("the store's lease {k} was not renewed: {e}");
                    }
                }
                _ => return,
            }
        });
        Lease {
            inner,
            key,
            stop: Some(stop),
            renewer: Some(renewer),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(r) = self.renewer.take() {
            let _ = r.join();
        }
        if let Err(e) = self.inner.delete(&self.key) {
            tracing::warn!("the store's lease {} was left behind: {e}", self.key);
        }
    }
}
