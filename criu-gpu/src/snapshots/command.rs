//! `criu-gpu store ...`: each subcommand one call into the store, its answer printed.

use std::time::Duration;

use snapshot_store::{GcOptions, GetOptions, PutOptions, Store};

use super::{export, print_gc, print_usage, print_verify, put_path};
use crate::cli::StoreCommand;
use crate::error::Error;
use crate::{human, out};

/// Runs `criu-gpu store ...`; the exit status (1 when `verify` found damage).
pub fn run(command: StoreCommand, json: bool) -> Result<u8, Error> {
    match command {
        StoreCommand::List { store } => {
            let usage = Store::open(&store)?.usage()?;
            if json {
                out::json(&usage);
            } else {
                print_usage(&usage);
            }
            Ok(0)
        }
        StoreCommand::Put {
            store,
            snapshot,
            path,
            compress,
        } => {
            let store = Store::open_or_create(&store, snapshot_store::Chunking::default())?;
            let opts = PutOptions {
                compression: compress,
                ..PutOptions::default()
            };
            let w = put_path(&store, &snapshot, &path, &opts)?;
            if json {
                out::json(&w);
            } else {
                super::say_written(&snapshot, &store.location(), &w);
            }
            Ok(0)
        }
        StoreCommand::Get {
            store,
            snapshot,
            dir,
        } => {
            let r = Store::open(&store)?.get(&snapshot, &dir, &GetOptions::default())?;
            if json {
                out::json(&r);
            } else {
                out::line(format!(
                    "read snapshot {snapshot} into {} in {:.1} s: {} ({})",
                    dir.display(),
                    r.seconds,
                    human::bytes(r.bytes),
                    human::gbps(r.bytes, Duration::from_secs_f64(r.seconds))
                ));
            }
            Ok(0)
        }
        other => manage(other, json),
    }
}

/// The subcommands that change or check the store as a whole.
fn manage(command: StoreCommand, json: bool) -> Result<u8, Error> {
    match command {
        StoreCommand::Export {
            store,
            snapshot,
            output,
        } => {
            let bytes = export(&Store::open(&store)?, &snapshot, &output)?;
            if json {
                out::json(&serde_json::json!({"output": output, "bytes": bytes}));
            } else {
                out::line(format!(
                    "wrote snapshot {snapshot} as {} ({})",
                    output.display(),
                    human::bytes(bytes)
                ));
            }
            Ok(0)
        }
        StoreCommand::Cat {
            store,
            snapshot,
            file,
        } => {
            let store = Store::open(&store)?;
            let manifest = store.manifest(&snapshot)?;
            if !manifest.entries.iter().any(|e| {
                e.path() == file && matches!(e, snapshot_store::Entry::File { .. })
            }) {
                return Err(Error::Usage(format!("snapshot {snapshot} holds no file {file}")));
            }
            let mut reader = store.file_reader(&manifest, &file);
            std::io::copy(&mut reader, &mut std::io::stdout().lock())
                .map_err(|e| Error::Refused(format!("{file} of snapshot {snapshot}: {e}")))?;
            Ok(0)
        }
        StoreCommand::Delete { store, snapshots } => {
            let store = Store::open(&store)?;
            for name in &snapshots {
                store.delete(name, snapshot_store::LOCK_WAIT)?;
                if !json {
                    out::line(format!(
                        "deleted snapshot {name}; `criu-gpu store gc` frees its chunks"
                    ));
                }
            }
            if json {
                out::json(&serde_json::json!({"deleted": snapshots}));
            }
            Ok(0)
        }
        StoreCommand::Gc {
            store,
            grace,
            wait,
            dry_run,
        } => {
            let r = Store::open(&store)?.gc(&GcOptions {
                grace: Duration::from_secs(grace),
                lock_wait: Duration::from_secs(wait),
                dry_run,
            })?;
            if json {
                out::json(&r);
            } else {
                print_gc(&r);
            }
            Ok(0)
        }
        StoreCommand::Verify { store, snapshots } => {
            let r = Store::open(&store)?.verify(&snapshots, &GetOptions::default())?;
            if json {
                out::json(&r);
            } else {
                print_verify(&r);
            }
            Ok(u8::from(!r.problems.is_empty()))
        }
        StoreCommand::List { .. } | StoreCommand::Put { .. } | StoreCommand::Get { .. } => {
            run(command, json)
        }
    }
}
