//! A store in a directory of a local or network file system. Objects are files written whole
//! through a temporary name (`.tmp-*`, renamed into place); new objects become durable together
//! with one `syncfs` before the manifest that names them, which is written and synced on its
//! own. The lock is `flock` on the store's `lock` file: shared for dumps and restores,
//! exclusive for garbage collection (NFS carries flock to the server as a lock of the whole
//! file, so it holds across machines).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{flock, FlockOperation};

use super::{Held, Lock, ObjectMeta, Objects};
use crate::error::{io, Result, StoreError};

pub const TMP_PREFIX: &str = ".tmp-";

pub struct FsObjects {
    root: PathBuf,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

impl FsObjects {
    pub fn new(root: PathBuf) -> FsObjects {
        FsObjects { root }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// A temporary name beside `path`, unique in this process and among processes.
    fn tmp_beside(path: &Path) -> PathBuf {
        let name = path.file_name().map_or_else(String::new, |n| {
            n.to_string_lossy().chars().take(80).collect::<String>()
        });
        path.with_file_name(format!(
            "{TMP_PREFIX}{name}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ))
    }

    fn write_tmp(path: &Path, bytes: &[u8], durable: bool) -> io::Result<PathBuf> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let tmp = Self::tmp_beside(path);
        let mut f = File::create(&tmp)?;
        let written = f
            .write_all(bytes)
            .and_then(|()| if durable { f.sync_all() } else { Ok(()) });
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(tmp)
    }

    fn sync_dir(path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(dir) => File::open(dir)?.sync_all(),
            None => Ok(()),
        }
    }

    /// Create-only: the content is written and synced under a temporary name, then linked to
    /// its name, which fails if the name exists: no reader ever sees a part of it.
    fn create(&self, path: &Path, bytes: &[u8]) -> io::Result<bool> {
        let tmp = Self::write_tmp(path, bytes, true)?;
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Self::sync_dir(path).map(|()| true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn walk(&self, dir: &Path, out: &mut Vec<ObjectMeta>) -> io::Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for e in entries {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                self.walk(&e.path(), out)?;
            } else if t.is_file() {
                let m = e.metadata()?;
                let key = e.path().strip_prefix(&self.root).map_or_else(
                    |_| e.path().display().to_string(),
                    |p| p.display().to_string(),
                );
                out.push(ObjectMeta {
                    key,
                    size: m.len(),
                    modified: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
        }
        Ok(())
    }
}

struct FlockHeld(#[allow(dead_code)] File);
impl Held for FlockHeld {}

impl Objects for FsObjects {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn where_is(&self, key: &str) -> String {
        self.path(key).display().to_string()
    }

    fn put(&self, key: &str, bytes: &[u8], create_only: bool) -> Result<bool> {
        let path = self.path(key);
        let what = || format!("writing {}", path.display());
        if create_only {
            return self.create(&path, bytes).map_err(io(what()));
        }
        let tmp = Self::write_tmp(&path, bytes, false).map_err(io(what()))?;
        fs::rename(&tmp, &path).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            StoreError::Io {
                what: what(),
                source: e,
            }
        })?;
        Ok(true)
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path(key);
        match fs::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(format!("reading {}", path.display()))(e)),
        }
    }

    fn exists(&self, key: &str) -> Result<bool> {
        let path = self.path(key);
        match fs::symlink_metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(format!("looking at {}", path.display()))(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let mut out = Vec::new();
        let dir = self.path(prefix);
        self.walk(&dir, &mut out)
            .map_err(io(format!("listing {}", dir.display())))?;
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(format!("deleting {}", path.display()))(e)),
        }
    }

    fn sync(&self) -> Result<()> {
        let root = File::open(&self.root).map_err(io(format!("opening {}", self.location())))?;
        rustix::fs::syncfs(&root).map_err(|e| io(format!("syncing {}", self.location()))(e.into()))
    }

    fn lock(&self, how: Lock, wait: Duration) -> Result<Box<dyn Held>> {
        let path = self.path("lock");
        let what = || format!("opening the store's lock {}", path.display());
        fs::create_dir_all(&self.root).map_err(io(what()))?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(what()))?;
        let op = match how {
            Lock::Shared => FlockOperation::NonBlockingLockShared,
            Lock::Exclusive => FlockOperation::NonBlockingLockExclusive,
        };
        let start = Instant::now();
        loop {
            match flock(&file, op) {
                Ok(()) => return Ok(Box::new(FlockHeld(file))),
                Err(rustix::io::Errno::WOULDBLOCK) if start.elapsed() < wait => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    return Err(StoreError::Busy {
                        what: match how {
                            Lock::Shared => "using the store",
                            Lock::Exclusive => "garbage collection",
                        },
                        holder: match how {
                            Lock::Shared => "a garbage collection of the store".into(),
                            Lock::Exclusive => "the dumps and restores using the store".into(),
                        },
                        waited: start.elapsed(),
                    })
                }
                Err(e) => return Err(io(format!("locking {}", path.display()))(e.into())),
            }
        }
    }
}
