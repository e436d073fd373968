//! etcd (v3) as the job's nodes share it: a blocking face over `etcd-client` on a small tokio
//! runtime of its own. A node's session holds a lease kept alive every 2 s: its keys vanish
//! within [`TTL`] of the node's death (as torch's etcd rendezvous counts a node dead after 3
//! missed keep-alives of 5 s, we use a shorter lease: a dump waits on it). What a node records
//! for the others (round outcomes, barriers, the decision) goes under a second lease that is not
//! kept alive, so it outlives the node's exit by [`RECORD_TTL`] and then is cleaned up by etcd.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};

/// A node's liveness lease.
pub const TTL: i64 = 6;
const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// How long a node's records stay after it is gone.
const RECORD_TTL: i64 = 600;
/// How long one request to etcd may take (a stopped etcd refuses at once; 3 s was too short
/// for a connection on a loaded 2-core machine, where etcd answered in up to 0.7 s).
const REQUEST: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("etcd at {endpoints} {what}: {source}")]
pub struct StoreError {
    pub endpoints: String,
    pub what: &'static str,
    #[source]
    pub source: etcd_client::Error,
}

/// The keys under one prefix, by their name after it.
pub type Keys = BTreeMap<String, Vec<u8>>;

/// One key's change in [`Store::swap_all`]: to `value` if it still holds `was` (`None`: absent),
/// under the node's liveness lease if `live` (else under none).
pub struct Swap<'a> {
    pub key: &'a str,
    pub was: Option<&'a [u8]>,
    pub value: &'a [u8],
    pub live: bool,
}

/// A node's connection to etcd.
pub struct Store {
    rt: tokio::runtime::Runtime,
    client: Client,
    endpoints: String,
    /// The liveness lease (kept alive) and the records' lease.
    pub live: i64,
    records: i64,
}

impl Store {
    /// Connects and takes the node's leases; within `REQUEST` or an error naming etcd.
    pub fn connect(endpoints: &[String]) -> Result<Store, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("criu-gpu-etcd")
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let joined = endpoints.join(",");
        let err = |what: &'static str| {
            let endpoints = joined.clone();
            move |source| StoreError {
                endpoints,
                what,
                source,
            }
        };
        let opts = ConnectOptions::new()
            .with_connect_timeout(REQUEST)
            .with_timeout(REQUEST);
        let (client, live, records) = rt.block_on(async {
            let mut c = Client::connect(endpoints, Some(opts))
                .await
                .map_err(err("cannot be reached"))?;
            let live = c
                .lease_grant(TTL, None)
                .await
                .map_err(err("cannot be reached"))?
                .id();
            let records = c
                .lease_grant(RECORD_TTL, None)
                .await
                .map_err(err("cannot be reached"))?
                .id();
            Ok::<_, StoreError>((c, live, records))
        })?;
        let mut keeper = client.clone();
        rt.spawn(async move {
            let Ok((mut k, mut answers)) = keeper.lease_keep_alive(live).await else {
                return;
            };
            loop {
                if k.keep_alive().await.is_err() {
                    return;
                }
                let _ = tokio::time::timeout(REQUEST, answers.message()).await;
                tokio::time::sleep(KEEP_ALIVE).await;
            }
        });
        Ok(Store {
            rt,
            client,
            endpoints: joined,
            live,
            records,
        })
    }

    fn err(&self, what: &'static str) -> impl FnOnce(etcd_client::Error) -> StoreError + '_ {
        move |source| StoreError {
            endpoints: self.endpoints.clone(),
            what,
            source,
        }
    }

    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    /// Every key under `prefix` (names without it) and the store's revision.
    pub fn keys(&self, prefix: &str) -> Result<(Keys, i64), StoreError> {
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.get(prefix, Some(GetOptions::new().with_prefix())))
            .map_err(self.err("cannot be read"))?;
        let rev = r.header().map_or(0, |h| h.revision());
        let keys = r
            .kvs()
            .iter()
            .filter_map(|kv| {
                let k = kv.key_str().ok()?;
                Some((k.strip_prefix(prefix)?.to_owned(), kv.value().to_vec()))
            })
            .collect();
        Ok((keys, rev))
    }

    /// Puts `key` under the liveness lease (`live`) or the records' lease.
    pub fn put(&self, key: &str, value: &[u8], live: bool) -> Result<(), StoreError> {
        let lease = if live { self.live } else { self.records };
        let mut c = self.client.clone();
        self.rt
            .block_on(c.put(key, value, Some(PutOptions::new().with_lease(lease))))
            .map_err(self.err("cannot be written"))?;
        Ok(())
    }

    /// Puts `key` unless any of `absent` exists (itself among them, or not); whether it did.
    pub fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        absent: &[&str],
        live: bool,
    ) -> Result<bool, StoreError> {
        let lease = if live { self.live } else { self.records };
        let compares: Vec<Compare> = absent
            .iter()
            .map(|k| Compare::create_revision(*k, CompareOp::Equal, 0))
            .collect();
        let txn = Txn::new().when(compares).and_then(vec![TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(lease)),
        )]);
        self.commit(txn)
    }

    /// Makes every change of `swaps` if each key still holds what it `was`, or none of them
    /// (one transaction); whether it made them.
    pub fn swap_all(&self, swaps: &[Swap<'_>]) -> Result<bool, StoreError> {
        let compares: Vec<Compare> = swaps
            .iter()
            .map(|s| match s.was {
                Some(v) => Compare::value(s.key, CompareOp::Equal, v),
                None => Compare::create_revision(s.key, CompareOp::Equal, 0),
            })
            .collect();
        let puts: Vec<TxnOp> = swaps
            .iter()
            .map(|s| {
                let lease = s.live.then(|| PutOptions::new().with_lease(self.live));
                TxnOp::put(s.key, s.value, lease)
            })
            .collect();
        self.commit(Txn::new().when(compares).and_then(puts))
    }

    /// Runs a write transaction; whether its comparisons held.
    fn commit(&self, txn: Txn) -> Result<bool, StoreError> {
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.txn(txn))
            .map_err(self.err("cannot be written"))?;
        Ok(r.succeeded())
    }

    /// Waits until `decide` says something about the keys under `prefix`, re-reading them at
    /// each change, for at most `limit`: `None` when the time ran out.
    pub fn wait<T>(
        &self,
        prefix: &str,
        limit: Duration,
        mut decide: impl FnMut(&Keys) -> Option<T>,
    ) -> Result<Option<T>, StoreError> {
        let until = Instant::now() + limit;
        loop {
            let (keys, rev) = self.keys(prefix)?;
            if let Some(t) = decide(&keys) {
                return Ok(Some(t));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut c = self.client.clone();
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(rev + 1);
            self.rt.block_on(async {
                let mut stream = c
                    .watch(prefix, Some(opts))
                    .await
                    .map_err(self.err("cannot be watched"))?;
                // Any change (or the time running out) and the keys are read again; a watch
                // that breaks shows as an error of that read.
                let _ = tokio::time::timeout(left.min(REQUEST), stream.message()).await;
                Ok::<_, StoreError>(())
            })?;
        }
    }

    /// Ends the node's session: its live keys go at once, its records stay for a while.
    pub fn close(&self) {
        let mut c = self.client.clone();
        let _ = self
            .rt
            .block_on(async { tokio::time::timeout(REQUEST, c.lease_revoke(self.live)).await });
    }
}
