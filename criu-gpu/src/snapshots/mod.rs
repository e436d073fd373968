//! GPU snapshots in a content-addressed store (the `snapshot-store` crate): `criu-gpu dump
//! --store` dumps into a staging directory (tmpfs by default: CRIU writes it at memory speed)
//! and stores it, `criu-gpu restore --store` reads a snapshot back into a staging directory and
//! restores from there; `criu-gpu store` lists, reads, exports (a container archive for
//! `podman container restore --import`), deletes, verifies and collects garbage.

mod archive;
pub mod command;
mod report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criu_gpu_host::settings::declared::STORE_HOLD;
use criu_gpu_host::settings::Settings;
use serde::Serialize;
use snapshot_store::{Chunking, Compression, GetOptions, PutOptions, Store, Written};

pub use self::archive::{export, put_path};
pub use self::report::{print_gc, print_usage, print_verify};
use crate::error::Error;
use crate::{human, job, out};

/// Where a dump or restore meets the store.
#[derive(Debug, Clone)]
pub struct StoreRequest {
    /// The store: a directory, or an object store URL.
    pub store: String,
    pub snapshot: String,
    /// The staging directory (default: a new one in /dev/shm).
    pub stage: Option<PathBuf>,
    pub compression: Compression,
}

/// A dump into the store.
#[derive(Debug, Clone, Serialize)]
pub struct StoredDump {
    pub dump: job::Outcome,
    pub store: String,
    pub snapshot: String,
    pub written: Option<Written>,
    /// The whole command: CRIU's dump and the store's write.
    pub seconds: f64,
}

/// A restore from the store.
#[derive(Debug, Clone, Serialize)]
pub struct StoredRestore {
    pub read: snapshot_store::GetReport,
    pub restore: job::Outcome,
    pub stage: PathBuf,
    pub seconds: f64,
}

/// Whether `path` is the root of a snapshot store on a file system.
pub fn is_store(path: &Path) -> bool {
    path.join("store.json").is_file()
}

/// A staging directory of its own: in /dev/shm where there is one (the images are memory
/// there, and go as soon as they are stored), else in the temporary directory.
fn default_stage(what: &str, snapshot: &str) -> PathBuf {
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    base.join(format!("criu-gpu-{what}-{snapshot}-{}", std::process::id()))
}

/// The staging directory, which must be new or empty: a store never writes over images.
fn stage_of(s: &StoreRequest, what: &str) -> Result<PathBuf, Error> {
    let stage = s
        .stage
        .clone()
        .unwrap_or_else(|| default_stage(what, &s.snapshot));
    let used = std::fs::read_dir(&stage).is_ok_and(|mut d| d.next().is_some());
    if used {
        return Err(Error::Usage(format!(
            "the staging directory {} is not empty: name a new one with --stage",
            stage.display()
        )));
    }
    Ok(stage)
}

/// How this command writes into a store: with `compression`, and held where a test of the
/// store's concurrency asks (`CRIU_GPU_STORE_HOLD`).
fn put_options(compression: Compression, settings: &Settings) -> PutOptions {
    PutOptions {
        compression,
        hold: settings.get(&STORE_HOLD).ok().flatten(),
        ..PutOptions::default()
    }
}

/// Dumps the job rooted at `pid` into the store as `s.snapshot`.
pub fn dump(
    pid: i32,
    leave_running: bool,
    r: &job::Request,
    s: &StoreRequest,
) -> Result<StoredDump, Error> {
    let start = Instant::now();
    // A store that cannot take the snapshot refuses before anything is frozen; a dry run
    // makes no store.
    let store = if r.dry_run {
        Store::open(&s.store)
    } else {
        Store::open_or_create(&s.store, Chunking::default())
    };
    let store = match store {
        Ok(store) => {
            store.check_new(&s.snapshot)?;
            Some(store)
        }
        Err(snapshot_store::StoreError::NotAStore { .. }) if r.dry_run => None,
        Err(e) => return Err(e.into()),
    };
    let stage = stage_of(s, "dump")?;
    let outcome = job::dump(
        pid,
        leave_running,
        &job::Request {
            dir: stage.clone(),
            ..r.clone()
        },
    )?;
    let mut stored = StoredDump {
        dump: outcome,
        store: s.store.clone(),
        snapshot: s.snapshot.clone(),
        written: None,
        seconds: 0.0,
    };
    let Some(store) = store.filter(|_| !r.dry_run) else {
        return Ok(stored);
    };
    let opts = put_options(s.compression, &r.settings);
    let manifest = store.put(&s.snapshot, &stage, &opts).map_err(|e| {
        Error::Refused(format!(
            "{e}; the images are kept in {st}: `criu-gpu store put {} {} {st}` stores them",
            s.store,
            s.snapshot,
            st = stage.display()
        ))
    })?;
    let _ = std::fs::remove_dir_all(&stage);
    say_written(&s.snapshot, &store.location(), &manifest.written);
    stored.written = Some(manifest.written);
    stored.seconds = start.elapsed().as_secs_f64();
    Ok(stored)
}

fn say_written(name: &str, location: &str, w: &Written) {
    out::line(format!(
        "stored snapshot {name} in {location} in {:.1} s: {} of images, {} new ({} stored), {} \
         already in the store",
        w.seconds,
        human::bytes(w.bytes),
        human::bytes(w.new_bytes),
        human::bytes(w.new_stored_bytes),
        human::bytes(w.bytes - w.new_bytes)
    ));
}

/// Restores snapshot `s.snapshot` of the store.
pub fn restore(
    how: &job::RestoreHow,
    r: &job::Request,
    s: &StoreRequest,
) -> Result<StoredRestore, Error> {
    let start = Instant::now();
    let store = Store::open(&s.store)?;
    let stage = stage_of(s, "restore")?;
    let read = store.get(&s.snapshot, &stage, &GetOptions::default())?;
    out::line(format!(
        "read snapshot {} from {} into {} in {:.1} s ({}, {})",
        s.snapshot,
        store.location(),
        stage.display(),
        read.seconds,
        human::bytes(read.bytes),
        human::gbps(read.bytes, Duration::from_secs_f64(read.seconds))
    ));
    // The stage is this restore's own copy of the images: CRIU's log and the timings stay
    // beside them (with the logs the stage keeps), unless a work directory was named.
    let how = job::RestoreHow {
        work_dir: how.work_dir.clone().or_else(|| Some(stage.clone())),
        ..how.clone()
    };
    let restored = job::restore(
        &how,
        &job::Request {
            dir: stage.clone(),
            ..r.clone()
        },
    )
    .map_err(|e| {
        Error::Refused(format!(
            "{e}\nthe images read from the store stay in {st}: `criu-gpu restore {st}` restores \
             from them without reading the store again",
            st = stage.display()
        ))
    })?;
    if !r.dry_run {
        drop_pages(&stage);
    }
    Ok(StoredRestore {
        read,
        restore: restored,
        stage,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// After a restore, the pages images are no longer needed; the logs and records stay.
fn drop_pages(stage: &Path) {
    let Ok(entries) = std::fs::read_dir(stage) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with("pages-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
