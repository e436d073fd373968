//! A restore from a disk reads the large pages images into the page cache, several threads
//! at once and in file order, from the moment CRIU starts: CRIU's own work before the GPU
//! restore (the plugin's checks, the tasks, the small images) no longer leaves the disk idle,
//! and the pages the driver's restore waits for are read at the disk's full queue depth.
//! Images in memory (tmpfs) are not read ahead; nor are images larger than half the memory
//! available, which would push their own first pages out again.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

const THREADS: u64 = 8;
const BLOCK: u64 = 8 << 20;
/// Only pages images at least this large are read ahead.
const LARGE: u64 = 64 << 20;
const TMPFS_MAGIC: i64 = 0x0102_1994;

pub struct Prefetch {
    stop: Arc<AtomicBool>,
    read: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
    start: Instant,
}

/// What was read ahead, for the restore's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Prefetched {
    pub bytes: u64,
    pub seconds: f64,
}

fn large_pages_images(dir: &Path) -> Vec<(PathBuf, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, u64)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.len())))
        .filter(|(_, len)| *len >= LARGE)
        .collect();
    out.sort();
    out
}

fn in_memory(dir: &Path) -> bool {
    // f_type is i64 here, i32 or u32 on other targets.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as i64 == TMPFS_MAGIC)
}

/// MemAvailable, in bytes (0 when unknown: nothing is read ahead).
fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib << 10)
        })
        .unwrap_or(0)
}

/// Starts reading ahead the pages images of `dir`, where that helps.
pub fn start(dir: &Path) -> Option<Prefetch> {
    if in_memory(dir) {
        return None;
    }
    let files = large_pages_images(dir);
    let total: u64 = files.iter().map(|(_, l)| l).sum();
    if files.is_empty() || total > available_memory() / 2 {
        return None;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicU64::new(0));
    let files = Arc::new(files);
    let threads = (0..THREADS)
        .map(|i| {
            let (stop, read, files) = (stop.clone(), read.clone(), files.clone());
            std::thread::spawn(move || read_blocks(i, &files, &stop, &read))
        })
        .collect();
    Some(Prefetch {
        stop,
        read,
        threads,
        start: Instant::now(),
    })
}

/// Thread `i` reads blocks i, i + THREADS, ... of each file in turn (together: in order).
fn read_blocks(i: u64, files: &[(PathBuf, u64)], stop: &AtomicBool, read: &AtomicU64) {
    let mut buf = vec![0u8; BLOCK as usize];
    for (path, len) in files {
        let Ok(f) = File::open(path) else { continue };
        let mut at = i * BLOCK;
        while at < *len && !stop.load(Ordering::Relaxed) {
            match f.read_at(&mut buf, at) {
                Ok(0) | Err(_) => break,
                Ok(n) => read.fetch_add(n as u64, Ordering::Relaxed),
            };
            at += THREADS * BLOCK;
        }
    }
}

impl Prefetch {
    /// Stops reading ahead (the restore is over) and says what was read.
    pub fn finish(self) -> Prefetched {
        self.stop.store(true, Ordering::Relaxed);
        let seconds = self.start.elapsed().as_secs_f64();
        for t in self.threads {
            let _ = t.join();
        }
        Prefetched {
            bytes: self.read.load(Ordering::Relaxed),
            seconds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_pages_images_on_a_disk_are_read_ahead_and_none_in_memory() {
        let disk = tempfile::tempdir_in("/var/tmp").unwrap();
        let size = LARGE + 3 * BLOCK + 17;
        let f = File::create(disk.path().join("pages-1.img")).unwrap();
        f.set_len(size).unwrap();
        std::fs::write(disk.path().join("pages-2.img"), b"small").unwrap();
        if in_memory(disk.path()) {
            return; // /var/tmp is tmpfs here: nothing to read ahead
        }
        let p = start(disk.path()).expect("read ahead");
        let t = Instant::now();
        while p.read.load(Ordering::Relaxed) < size && t.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            p.finish().bytes,
            size,
            "every byte of the large image, once"
        );
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        std::fs::copy(
            disk.path().join("pages-1.img"),
            shm.path().join("pages-1.img"),
        )
        .unwrap();
        assert!(
            start(shm.path()).is_none(),
            "images in memory are not read ahead"
        );
    }
}
