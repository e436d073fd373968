//! The job's files at the snapshot, so that a snapshot can be rolled back to after the job went on.
//!
//! CRIU restores a regular file only if its size is what it was at the dump (`File ... has bad
//! size`): a job that went on after `criu-gpu dump --leave-running` has grown its logs, and its
//! snapshot no longer restores. Worse, CRIU checks no size for a file opened write-only for
//! appending (Python's logging, `tee -a`, `>>`): such a log is restored as it grew, the abandoned
//! run's lines followed by the restored run's. So while the dumped tree is still frozen (CRIU's
//! post-dump action script: `criu-gpu dump` has CRIU run criu-gpu itself), each regular file the
//! job had open or mapped is recorded, appended ones included: its size, identity and
//! modification time, and for a file the job could write (open for writing, or mapped shared and
//! writable) a digest of its contents. Before a restore, [`changes`] names every file that changed since; one that
//! only grew, whose first bytes are what the digest says, can be cut back to its size at the
//! snapshot ([`cut_back`], `criu-gpu restore --truncate-grown`). Nothing else is ever changed.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use criu_gpu_image::criu_image;
use criu_gpu_image::record::{self, RecordError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const FILE: &str = "criu-gpu-files.json";
const FORMAT: &str = "criu-gpu/files";
const VERSION: u32 = 1;
/// Files open for writing up to this size get a digest while the job is frozen (it costs the
/// job that time: about 1 s per GiB); larger ones are recorded without.
pub const DIGEST_LIMIT: u64 = 256 << 20;

/// One regular file of the job, as it was while the job was frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileState {
    pub path: PathBuf,
    pub size: u64,
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i128,
    /// sha256 of its first `size` bytes (files open for writing, up to [`DIGEST_LIMIT`]).
    pub digest: Option<String>,
    /// Mapped shared and writable: written through memory, which need not change its
    /// modification time (tmpfs never does, other file systems once per writeback), so its
    /// digest is compared whatever its time says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mapped: bool,
    /// Opened write-only for appending: CRIU checks no size for it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub appended: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FilesRecord {
    pub files: Vec<FileState>,
    /// Bytes hashed, and how long it took (the job was frozen meanwhile).
    pub hashed_bytes: u64,
    pub hash_seconds: f64,
}

impl FilesRecord {
    pub fn read(dir: &Path) -> Result<Option<FilesRecord>, RecordError> {
        record::read(dir, FILE, FORMAT, VERSION)
    }
}

/// What became of a file since the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Longer, its first bytes as they were: it can be cut back.
    Grew {
        from: u64,
        to: u64,
        /// Opened for appending: CRIU would restore it as it is.
        appended: bool,
    },
    /// Longer, and its first bytes differ from the snapshot's, or were never hashed.
    GrewChanged {
        from: u64,
        to: u64,
        hashed: bool,
    },
    Shrank {
        from: u64,
        to: u64,
    },
    /// The same size, other contents.
    Rewritten,
    /// Another file at that path now.
    Replaced,
    Missing,
}

impl Change {
    pub fn describe(&self, path: &Path) -> String {
        let p = path.display();
        match self {
            Change::Grew {
                from,
                to,
                appended: false,
            } => format!("{p} grew from {from} to {to} bytes since the snapshot"),
            Change::Grew {
                from,
                to,
                appended: true,
            } => format!(
                "{p} grew from {from} to {to} bytes since the snapshot; the job appends to it, and \
                 CRIU would restore it as it is: the restored job would write after the lines \
                 written since"
            ),
            Change::GrewChanged { from, to, hashed } => format!(
                "{p} grew from {from} to {to} bytes since the snapshot, and {}",
                if *hashed {
                    format!("its first {from} bytes are not what they were")
                } else {
                    "its contents were not hashed at the snapshot (open read-only, larger than \
                     256 MiB, or dumped without criu-gpu)"
                        .to_owned()
                }
            ),
            Change::Shrank { from, to } => {
                format!("{p} shrank from {from} to {to} bytes since the snapshot")
            }
            Change::Rewritten => format!("{p} was rewritten since the snapshot (same size)"),
            Change::Replaced => format!("{p} is another file than at the snapshot"),
            Change::Missing => format!("{p} is gone since the snapshot"),
        }
    }

    /// Whether `--truncate-grown` puts it back.
    pub fn can_cut_back(&self) -> bool {
        matches!(self, Change::Grew { .. })
    }
}

/// A file of the image that the restore depends on.
struct JobFile {
    name: String,
    /// Its size at the dump as CRIU recorded it: none for a file opened for appending.
    size: Option<u64>,
    /// The job could write it: opened for writing, or mapped shared and writable.
    writable: bool,
    /// Mapped shared and writable.
    mapped: bool,
    /// Opened write-only for appending (and so without a size).
    appended: bool,
}

/// The files the restore depends on: the image's regular files at their paths (unlinked ones
/// left out: CRIU restores those from the images), each once. CRIU checks their sizes at the
/// restore, but for files opened write-only for appending, as logs are (files-reg.c,
/// should_check_size): one the job went on appending to would come back holding the abandoned
/// run's lines, so those are here too, without a size.
fn job_files(dir: &Path) -> Result<Vec<JobFile>, criu_image::CriuImageError> {
    // Files written through memory: files.img gives a mapped file no open flags.
    let mapped = criu_image::shared_writable_mappings(dir).unwrap_or_else(|e| {
        eprintln!("criu-gpu: the job's memory mappings were not read ({e}): mapped files count as read-only");
        Default::default()
    });
    let mut files: Vec<JobFile> = Vec::new();
    let mut reg = criu_image::regular_files(dir)?;
    reg.sort_by(|a, b| a.name.cmp(&b.name));
    for f in reg {
        if f.remapped || (f.size.is_none() && !f.appended()) {
            continue;
        }
        let in_memory = mapped.contains(&f.id);
        let writable = f.writable() || in_memory;
        match files.last_mut() {
            Some(last) if last.name == f.name => {
                last.size = last.size.or(f.size);
                last.writable |= writable;
                last.mapped |= in_memory;
                last.appended &= f.size.is_none();
            }
            _ => files.push(JobFile {
                appended: f.size.is_none(),
                name: f.name,
                size: f.size,
                writable,
                mapped: in_memory,
            }),
        }
    }
    Ok(files)
}

/// sha256 of the first `len` bytes of `path`.
fn digest_of(path: &Path, len: u64) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?.take(len);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        got += n as u64;
    }
    if got != len {
        return Err(std::io::Error::other(format!(
            "{} has {got} bytes, {len} expected",
            path.display()
        )));
    }
    Ok(format!("{:x}", h.finalize()))
}

fn mtime_ns(m: &std::fs::Metadata) -> i128 {
    m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128
}

/// Records the job's files in `dir` (run while CRIU holds the tree frozen, after its images are
/// written). A file that cannot be read is left out, with a line on stderr (CRIU's log).
pub fn record(dir: &Path) -> Result<FilesRecord, String> {
    let start = std::time::Instant::now();
    let mut rec = FilesRecord::default();
    for f in job_files(dir).map_err(|e| e.to_string())? {
        let path = PathBuf::from(&f.name);
        let Ok(meta) = std::fs::metadata(&path) else {
            eprintln!("criu-gpu: {} is not there to record", path.display());
            continue;
        };
        // Appending to a device (/dev/null): nothing to roll back.
        if !meta.is_file() {
            continue;
        }
        // A file opened for appending: its size now, while the job is frozen.
        let size = f.size.unwrap_or(meta.len());
        let digest = if f.writable && size <= DIGEST_LIMIT {
            match digest_of(&path, size) {
                Ok(d) => {
                    rec.hashed_bytes += size;
                    Some(d)
                }
                Err(e) => {
                    eprintln!("criu-gpu: no digest of {}: {e}", path.display());
                    None
                }
            }
        } else {
            None
        };
        rec.files.push(FileState {
            path,
            size,
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: mtime_ns(&meta),
            digest,
            mapped: f.mapped,
            appended: f.appended,
        });
    }
    rec.hash_seconds = start.elapsed().as_secs_f64();
    record::write(dir, FILE, FORMAT, VERSION, &rec).map_err(|e| e.to_string())?;
    Ok(rec)
}

/// What happened to one recorded file.
fn change_of(f: &FileState) -> Option<Change> {
    let Ok(meta) = std::fs::metadata(&f.path) else {
        return Some(Change::Missing);
    };
    if (meta.dev(), meta.ino()) != (f.dev, f.ino) {
        return Some(Change::Replaced);
    }
    let now = meta.len();
    let same_prefix = || match &f.digest {
        Some(d) => digest_of(&f.path, f.size).is_ok_and(|now| &now == d),
        None => false,
    };
    if now < f.size {
        return Some(Change::Shrank {
            from: f.size,
            to: now,
        });
    }
    if now > f.size {
        return Some(if same_prefix() {
            Change::Grew {
                from: f.size,
                to: now,
                appended: f.appended,
            }
        } else {
            Change::GrewChanged {
                from: f.size,
                to: now,
                hashed: f.digest.is_some(),
            }
        });
    }
    if mtime_ns(&meta) == f.mtime_ns && !f.mapped {
        return None;
    }
    // Touched (or written through memory): unchanged if its contents are what they were (or
    // were never hashed).
    match &f.digest {
        Some(_) if !same_prefix() => Some(Change::Rewritten),
        _ => None,
    }
}

/// Every file of the image in `dir` that changed since the snapshot. With a record of
/// `criu-gpu dump` each recorded file is compared whole; without one, the sizes CRIU will check.
pub fn changes(dir: &Path) -> Result<Vec<(PathBuf, Change)>, String> {
    if let Some(rec) = FilesRecord::read(dir).map_err(|e| e.to_string())? {
        return Ok(rec
            .files
            .iter()
            .filter_map(|f| Some((f.path.clone(), change_of(f)?)))
            .collect());
    }
    let files = match job_files(dir) {
        Ok(f) => f,
        // Not a CRIU image directory this command can read: CRIU says what is wrong.
        Err(_) => return Ok(Vec::new()),
    };
    Ok(files
        .into_iter()
        .filter_map(|f| {
            let path = PathBuf::from(&f.name);
            let was = f.size?;
            let change = match std::fs::metadata(&path) {
                Err(_) => Change::Missing,
                Ok(m) if m.len() < was => Change::Shrank {
                    from: was,
                    to: m.len(),
                },
                Ok(m) if m.len() > was => Change::GrewChanged {
                    from: was,
                    to: m.len(),
                    hashed: false,
                },
                Ok(_) => return None,
            };
            Some((path, change))
        })
        .collect())
}

/// Cuts every recorded file that only grew back to its size at the snapshot, each looked at once
/// more right before; what was cut.
pub fn cut_back(dir: &Path) -> Result<Vec<(PathBuf, Change)>, String> {
    let Some(rec) = FilesRecord::read(dir).map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    let mut cut = Vec::new();
    for f in &rec.files {
        let Some(change @ Change::Grew { from, .. }) = change_of(f) else {
            continue;
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f.path)
            .and_then(|file| {
                file.set_len(from)?;
                file.sync_all()
            })
            .map_err(|e| format!("cutting {} back to {from} bytes: {e}", f.path.display()))?;
        cut.push((f.path.clone(), change));
    }
    Ok(cut)
}

#[cfg(test)]
mod tests;
