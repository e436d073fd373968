//! `criu-gpu store ...`: each subcommand one call into the store, its answer printed.

use std::path::Path;
use std::time::Duration;

use snapshot_store::{Chunking, Entry, GcOptions, GetOptions, PutOptions, Store};

use super::{export, print_gc, print_usage, print_verify, put_options, put_path};
use crate::cli::StoreCommand;
use crate::error::Error;
use crate::{human, out};
use criu_gpu_host::settings::Settings;

/// Runs `criu-gpu store ...`; the exit status (1 when `verify` found damage).
pub fn run(command: StoreCommand, settings: &Settings, json: bool) -> Result<u8, Error> {
    match command {
        StoreCommand::List { store } => list(&store, json),
        StoreCommand::Put {
            store,
            snapshot,
            path,
            compress,
        } => put(
            &store,
            &snapshot,
            &path,
            put_options(compress, settings),
            json,
        ),
        StoreCommand::Get {
            store,
            snapshot,
            dir,
        } => get(&store, &snapshot, &dir, json),
        StoreCommand::Cat {
            store,
            snapshot,
            file,
        } => cat(&store, &snapshot, &file),
        StoreCommand::Export {
            store,
            snapshot,
            output,
        } => export_to(&store, &snapshot, &output, json),
        StoreCommand::Delete { store, snapshots } => delete(&store, &snapshots, json),
        StoreCommand::Gc {
            store,
            grace,
            wait,
            dry_run,
        } => gc(
            &store,
            &GcOptions {
                grace: Duration::from_secs(grace),
                lock_wait: Duration::from_secs(wait),
                dry_run,
            },
            json,
        ),
        StoreCommand::Verify { store, snapshots } => verify(&store, &snapshots, json),
    }
}

/// `list`, and `inspect` of a store.
pub fn list(store: &str, json: bool) -> Result<u8, Error> {
    let usage = Store::open(store)?.usage()?;
    if json {
        out::json(&usage);
    } else {
        print_usage(&usage);
    }
    Ok(0)
}

fn put(store: &str, name: &str, path: &Path, opts: PutOptions, json: bool) -> Result<u8, Error> {
    let store = Store::open_or_create(store, Chunking::default())?;
    let w = put_path(&store, name, path, &opts)?;
    if json {
        out::json(&w);
    } else {
        super::say_written(name, &store.location(), &w);
    }
    Ok(0)
}

fn get(store: &str, name: &str, dir: &Path, json: bool) -> Result<u8, Error> {
    let r = Store::open(store)?.get(name, dir, &GetOptions::default())?;
    if json {
        out::json(&r);
    } else {
        out::line(format!(
            "read snapshot {name} into {} in {:.1} s: {} ({})",
            dir.display(),
            r.seconds,
            human::bytes(r.bytes),
            human::gbps(r.bytes, Duration::from_secs_f64(r.seconds))
        ));
    }
    Ok(0)
}

/// One file of a snapshot on stdout.
fn cat(store: &str, name: &str, file: &str) -> Result<u8, Error> {
    let store = Store::open(store)?;
    let manifest = store.manifest(name)?;
    let is_file = |e: &Entry| e.path() == file && matches!(e, Entry::File { .. });
    if !manifest.entries.iter().any(is_file) {
        return Err(Error::Usage(format!(
            "snapshot {name} holds no file {file}"
        )));
    }
    let mut reader = store.file_reader(&manifest, file);
    std::io::copy(&mut reader, &mut std::io::stdout().lock())
        .map_err(|e| Error::Refused(format!("{file} of snapshot {name}: {e}")))?;
    Ok(0)
}

fn export_to(store: &str, name: &str, output: &Path, json: bool) -> Result<u8, Error> {
    let bytes = export(&Store::open(store)?, name, output)?;
    if json {
        out::json(&serde_json::json!({"output": output, "bytes": bytes}));
    } else {
        out::line(format!(
            "wrote snapshot {name} as {} ({})",
            output.display(),
            human::bytes(bytes)
        ));
    }
    Ok(0)
}

fn delete(store: &str, names: &[String], json: bool) -> Result<u8, Error> {
    let store = Store::open(store)?;
    for name in names {
        store.delete(name, snapshot_store::LOCK_WAIT)?;
        if !json {
            out::line(format!(
                "deleted snapshot {name}; `criu-gpu store gc` frees its chunks"
            ));
        }
    }
    if json {
        out::json(&serde_json::json!({ "deleted": names }));
    }
    Ok(0)
}

fn gc(store: &str, opts: &GcOptions, json: bool) -> Result<u8, Error> {
    let r = Store::open(store)?.gc(opts)?;
    if json {
        out::json(&r);
    } else {
        print_gc(&r);
    }
    Ok(0)
}

fn verify(store: &str, names: &[String], json: bool) -> Result<u8, Error> {
    let r = Store::open(store)?.verify(names, &GetOptions::default())?;
    if json {
        out::json(&r);
    } else {
        print_verify(&r);
    }
    Ok(u8::from(!r.problems.is_empty()))
}
