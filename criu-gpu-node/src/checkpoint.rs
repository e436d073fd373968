//! Checkpointing a node's GPU containers through the kubelet, all at once (or `--parallel N`
//! at a time), each archive copied into the store while it is hashed, and each result written
//! into the manifest as it lands.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::kube::Kubelet;
use crate::pods::GpuContainer;
use crate::progress::{Board, Phase};
use crate::store::{Status, Store};
use crate::NodeError;

/// A saved archive.
#[derive(Debug, Clone)]
pub struct Saved {
    pub archive: String,
    pub bytes: u64,
    pub took: Duration,
}

/// Checkpoints every target; one result per target, in order.
pub fn all(
    kubelet: &Kubelet,
    store: Option<&Store>,
    targets: &[GpuContainer],
    parallel: usize,
    board: &Board,
) -> Vec<Result<Saved, NodeError>> {
    let next = AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<Saved, NodeError>>>> = targets
        .iter()
        .map(|_| std::sync::Mutex::new(None))
        .collect();
    let workers = if parallel == 0 {
        targets.len()
    } else {
        parallel.min(targets.len())
    };
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(t) = targets.get(i) else { break };
                let r = one(kubelet, store, t, i, board);
                match &r {
                    Ok(saved) => board.set(
                        i,
                        Phase::Saved {
                            bytes: saved.bytes,
                            took: saved.took,
                        },
                    ),
                    Err(e) => board.set(i, Phase::Failed(e.to_string())),
                }
                *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| Err(NodeError::Failed("not run".into())))
        })
        .collect()
}

fn one(
    kubelet: &Kubelet,
    store: Option<&Store>,
    t: &GpuContainer,
    i: usize,
    board: &Board,
) -> Result<Saved, NodeError> {
    let start = Instant::now();
    board.set(i, Phase::Checkpointing(start));
    let record = |f: &dyn Fn(&mut crate::store::ContainerRecord)| -> Result<(), NodeError> {
        match store {
            Some(s) => s.container(&t.namespace, &t.pod, &t.container, |c| f(c)),
            None => Ok(()),
        }
    };
    record(&|c| c.status = Status::Checkpointing)?;
    let result = (|| -> Result<(String, u64, Option<String>), NodeError> {
        let node_archive = kubelet.checkpoint(&t.namespace, &t.pod, &t.container)?;
        record(&|c| c.node_archive = Some(node_archive.clone()))?;
        let Some(store) = store else {
            let bytes = std::fs::metadata(&node_archive)
                .map(|m| m.len())
                .unwrap_or(0);
            return Ok((node_archive, bytes, None));
        };
        let name = Path::new(&node_archive)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| format!("checkpoint-{}_{}-{}.tar", t.pod, t.namespace, t.container));
        let rel = format!("archives/{name}");
        let (bytes, digest) = copy_hashed(
            Path::new(&node_archive),
            &store.resolve(&rel),
            |done, total| board.set(i, Phase::Copying { done, total }),
        )?;
        Ok((rel, bytes, Some(digest)))
    })();
    let took = start.elapsed();
    match result {
        Ok((archive, bytes, sha256)) => {
            record(&|c| {
                c.status = Status::Saved;
                c.archive = Some(archive.clone());
                c.bytes = Some(bytes);
                c.sha256 = sha256.clone();
                c.seconds = Some((took.as_secs_f64() * 100.0).round() / 100.0);
                c.error = None;
            })?;
            Ok(Saved {
                archive,
                bytes,
                took,
            })
        }
        Err(e) => {
            let why = e.to_string();
            record(&|c| {
                c.status = Status::Failed;
                c.error = Some(why.clone());
            })?;
            Err(e)
        }
    }
}

/// Copies `from` to `to` (through a temporary name), returning its size and sha256.
fn copy_hashed(
    from: &Path,
    to: &Path,
    progress: impl Fn(u64, u64),
) -> Result<(u64, String), NodeError> {
    let mut src = File::open(from).map_err(|e| {
        NodeError::Failed(format!(
            "{}: {e} (run criu-gpu on the node itself, where the kubelet writes its archives)",
            from.display()
        ))
    })?;
    let total = src.metadata().map(|m| m.len()).unwrap_or(0);
    let parent = to.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| NodeError::store(parent, e))?;
    let tmp = to.with_extension("partial");
    let mut dst = File::create(&tmp).map_err(|e| NodeError::store(&tmp, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut done = 0u64;
    loop {
        let n = src.read(&mut buf).map_err(|e| NodeError::store(from, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n])
            .map_err(|e| NodeError::store(&tmp, e))?;
        done += n as u64;
        progress(done, total);
    }
    dst.sync_all().map_err(|e| NodeError::store(&tmp, e))?;
    std::fs::rename(&tmp, to).map_err(|e| NodeError::store(to, e))?;
    Ok((
        done,
        format!("sha256:{}", crate::oci::hex(&hasher.finalize())),
    ))
}
