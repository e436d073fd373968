//! A store in an object store, through the `object_store` crate (S3 and the S3-compatible
//! stores, GCS, Azure, or memory for tests). Objects are written whole by the store itself;
//! a manifest is created only if its name is free (a conditional put); the lock is a lease
//! object per user ([`super::lease`]), as object stores have no locks.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::lease::Lease;
use super::{Held, Lock, ObjectMeta, Objects};
use crate::error::{Result, StoreError};

pub(super) struct Inner {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) location: String,
}

impl Inner {
    pub(super) fn err(&self, op: String) -> impl FnOnce(object_store::Error) -> StoreError + '_ {
        move |source| StoreError::Object {
            location: self.location.clone(),
            op,
            source,
        }
    }

    pub(super) fn put(&self, key: &str, bytes: &[u8], create_only: bool) -> Result<bool> {
        let opts = PutOptions {
            mode: if create_only {
                PutMode::Create
            } else {
                PutMode::Overwrite
            },
            ..PutOptions::default()
        };
        let payload = PutPayload::from(bytes.to_vec());
        match self
            .rt
            .block_on(self.store.put_opts(&Path::from(key), payload, opts))
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) if create_only => Ok(false),
            Err(e) => Err(self.err(format!("writing {key}"))(e)),
        }
    }

    pub(super) fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let prefix = Path::from(prefix.trim_end_matches('/'));
        let listed: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(self.store.list(Some(&prefix)).try_collect())
            .map_err(self.err(format!("listing {prefix}")))?;
        Ok(listed
            .into_iter()
            .map(|m| ObjectMeta {
                key: m.location.to_string(),
                size: m.size,
                modified: SystemTime::from(m.last_modified),
            })
            .collect())
    }

    pub(super) fn delete(&self, key: &str) -> Result<()> {
        match self.rt.block_on(self.store.delete(&Path::from(key))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(format!("deleting {key}"))(e)),
        }
    }
}

pub struct ObjectStoreObjects {
    inner: Arc<Inner>,
    lease_ttl: Duration,
}

impl ObjectStoreObjects {
    /// A store in `store`, named `location` in messages.
    pub fn new(store: Arc<dyn ObjectStore>, location: &str) -> Result<ObjectStoreObjects> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(crate::error::io("starting the object store's runtime"))?;
        Ok(ObjectStoreObjects {
            inner: Arc::new(Inner {
                store,
                rt,
                location: location.to_owned(),
            }),
            lease_ttl: Lease::TTL,
        })
    }

    /// How long a lease lives without being renewed (shorter in tests).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> ObjectStoreObjects {
        self.lease_ttl = ttl;
        self
    }

    pub fn from_url(url: &str) -> Result<ObjectStoreObjects> {
        if url == "memory://" {
            return ObjectStoreObjects::new(Arc::new(InMemory::new()), url);
        }
        Err(StoreError::BadSource {
            source_path: url.to_owned(),
            why: "this build reaches object stores through the library (snapshot_store::backend::object) \
                  and memory:// only; name a directory (a local or network file system) instead"
                .into(),
        })
    }
}

impl Objects for ObjectStoreObjects {
    fn location(&self) -> String {
        self.inner.location.clone()
    }

    fn where_is(&self, key: &str) -> String {
        format!("{}/{key}", self.inner.location.trim_end_matches('/'))
    }

    fn put(&self, key: &str, bytes: &[u8], create_only: bool) -> Result<bool> {
        self.inner.put(key, bytes, create_only)
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let inner = &self.inner;
        let got = inner.rt.block_on(async {
            let r = inner.store.get(&Path::from(key)).await?;
            r.bytes().await
        });
        match got {
            Ok(b) => Ok(Some(b.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(inner.err(format!("reading {key}"))(e)),
        }
    }

    fn exists(&self, key: &str) -> Result<bool> {
        match self
            .inner
            .rt
            .block_on(self.inner.store.head(&Path::from(key)))
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.inner.err(format!("looking at {key}"))(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)
    }

    /// An object store acknowledges a put once it is durable.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn lock(&self, how: Lock, wait: Duration) -> Result<Box<dyn Held>> {
        Ok(Box::new(Lease::take(
            self.inner.clone(),
            how,
            wait,
            self.lease_ttl,
        )?))
    }
}
