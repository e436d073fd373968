//! Digests of a checkpoint's image files, taken when the dump ends and checked before a restore
//! starts: a damaged or truncated image is refused with the file's name instead of restoring
//! corrupt device memory, or sending CRIU's restorer into a loop on a short file.
//!
//! xxh3-128 over fixed chunks, several threads at once: a file's digest is the hash of its size
//! and of its chunks' hashes, so a large pages image is hashed in parallel.
//!
//! A restore checks every file's size and the small files first; the contents of large pages
//! images ([`LATER`]) can be checked while the restore reads them ([`split`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

/// Files are hashed in chunks of this size, each chunk by one thread.
pub const CHUNK: u64 = 64 << 20;
/// Pages images this large may be checked while the restore reads them.
pub const LATER: u64 = 256 << 20;
const BUF: usize = 4 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub name: String,
    pub size: u64,
    /// xxh3-128, hex.
    pub xxh3: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    #[error(
        "the image file {name} is missing: the checkpoint was not copied completely; copy the \
         image directory again from its source"
    )]
    Missing { name: String },
    #[error(
        "the image file {name} is truncated or grown ({found} bytes, the dump wrote {expected}): \
         copy the image directory again from its source"
    )]
    Size {
        name: String,
        expected: u64,
        found: u64,
    },
    #[error(
        "the image file {name} is damaged (its contents differ from what the dump wrote): copy \
         the image directory again from its source"
    )]
    Damaged { name: String },
    #[error("cannot read the image file {name}: {source}")]
    Io {
        name: String,
        source: std::io::Error,
    },
}

/// The image files CRIU writes (`*.img`) in `dir`, sorted.
pub fn image_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".img"))
        .collect();
    names.sort();
    Ok(names)
}

fn threads_for(chunks: usize, most: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    cores.clamp(1, most).min(chunks.max(1))
}

/// Digests of `names` in `dir`, with one thread per CPU (at most 16).
pub fn digest(dir: &Path, names: &[String]) -> Result<Vec<FileDigest>, DigestError> {
    digest_with(dir, names, 16)
}

/// Digests of `names` in `dir`, with at most `threads` threads.
pub fn digest_with(
    dir: &Path,
    names: &[String],
    threads: usize,
) -> Result<Vec<FileDigest>, DigestError> {
    let io = |name: &str| {
        let name = name.to_owned();
        move |source| DigestError::Io { name, source }
    };
    let mut sizes = Vec::with_capacity(names.len());
    for n in names {
        sizes.push(std::fs::metadata(dir.join(n)).map_err(io(n))?.len());
    }
    // Every chunk of every file: (file index, offset).
    let chunks: Vec<(usize, u64)> = sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &size)| (0..size.div_ceil(CHUNK).max(1)).map(move |c| (i, c * CHUNK)))
        .collect();
    let hashes: Vec<Mutex<u128>> = chunks.iter().map(|_| Mutex::new(0)).collect();
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<DigestError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads_for(chunks.len(), threads) {
            s.spawn(|| {
                let mut buf = vec![0u8; BUF];
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(file, offset)) = chunks.get(k) else {
                        return;
                    };
                    let name = &names[file];
                    let len = (sizes[file] - offset).min(CHUNK);
                    match hash_range(&dir.join(name), offset, len, &mut buf) {
                        Ok(h) => *hashes[k].lock().unwrap_or_else(|e| e.into_inner()) = h,
                        Err(e) => {
                            let mut f = failure.lock().unwrap_or_else(|e| e.into_inner());
                            f.get_or_insert(io(name)(e));
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    // Chunks are listed file by file, in order.
    let mut out: Vec<FileDigest> = Vec::with_capacity(names.len());
    let mut k = 0;
    for (i, name) in names.iter().enumerate() {
        let mut h = Xxh3::new();
        h.update(&sizes[i].to_le_bytes());
        while k < chunks.len() && chunks[k].0 == i {
            let part = *hashes[k].lock().unwrap_or_else(|e| e.into_inner());
            h.update(&part.to_le_bytes());
            k += 1;
        }
        out.push(FileDigest {
            name: name.clone(),
            size: sizes[i],
            xxh3: format!("{:032x}", h.digest128()),
        });
    }
    Ok(out)
}

fn hash_range(path: &Path, offset: u64, len: u64, buf: &mut [u8]) -> std::io::Result<u128> {
    let f = File::open(path)?;
    let mut h = Xxh3::new();
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(buf.len() as u64) as usize;
        let n = f.read_at(&mut buf[..want], offset + done)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was read",
            ));
        }
        h.update(&buf[..n]);
        done += n as u64;
    }
    Ok(h.digest128())
}

/// Checks `dir` against the digests the dump recorded: sizes first (cheap, and what a
/// truncated copy shows), then contents.
pub fn verify(dir: &Path, expected: &[FileDigest]) -> Result<(), DigestError> {
    verify_sizes(dir, expected)?;
    verify_contents(dir, expected, 16)
}

/// The digests whose contents are checked now, and the large pages images that may be checked
/// while the restore reads them.
pub fn split(expected: &[FileDigest]) -> (Vec<FileDigest>, Vec<FileDigest>) {
    expected
        .iter()
        .cloned()
        .partition(|d| !(d.name.starts_with("pages-") && d.size >= LATER))
}

/// Every file is there, with the size the dump wrote.
pub fn verify_sizes(dir: &Path, expected: &[FileDigest]) -> Result<(), DigestError> {
    for d in expected {
        match std::fs::metadata(dir.join(&d.name)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(DigestError::Missing {
                    name: d.name.clone(),
                })
            }
            Err(source) => {
                return Err(DigestError::Io {
                    name: d.name.clone(),
                    source,
                })
            }
            Ok(m) if m.len() != d.size => {
                return Err(DigestError::Size {
                    name: d.name.clone(),
                    expected: d.size,
                    found: m.len(),
                })
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// Every file holds what the dump wrote (hashed with at most `threads` threads).
pub fn verify_contents(
    dir: &Path,
    expected: &[FileDigest],
    threads: usize,
) -> Result<(), DigestError> {
    let names: Vec<String> = expected.iter().map(|d| d.name.clone()).collect();
    for (got, want) in digest_with(dir, &names, threads)?.iter().zip(expected) {
        if got.xxh3 != want.xxh3 {
            return Err(DigestError::Damaged {
                name: want.name.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, usize)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (n, size) in files {
            let data: Vec<u8> = (0..*size).map(|i| (i * 7 + n.len()) as u8).collect();
            std::fs::write(d.path().join(n), data).unwrap();
        }
        d
    }

    #[test]
    fn digests_follow_contents_not_chunking() {
        let d = dir_with(&[("pages-1.img", 3 << 20), ("core-1.img", 100), ("x.log", 5)]);
        let names = image_files(d.path()).unwrap();
        assert_eq!(names, ["core-1.img", "pages-1.img"]);
        let a = digest(d.path(), &names).unwrap();
        assert_eq!(a[1].size, 3 << 20);
        verify(d.path(), &a).unwrap();
        assert_eq!(digest(d.path(), &names).unwrap(), a, "deterministic");
    }

    #[test]
    fn large_pages_images_may_be_checked_later() {
        let d = |name: &str, size| FileDigest {
            name: name.into(),
            size,
            xxh3: String::new(),
        };
        let all = [
            d("core-1.img", 100),
            d("pages-1.img", LATER),
            d("pages-2.img", 4096),
            d("mm-1.img", LATER),
        ];
        let (now, later) = split(&all);
        let names = |v: &[FileDigest]| v.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&now), ["core-1.img", "pages-2.img", "mm-1.img"]);
        assert_eq!(names(&later), ["pages-1.img"]);
    }

    #[test]
    fn damage_truncation_and_loss_are_named() {
        let d = dir_with(&[("pages-1.img", 1 << 20), ("core-1.img", 100)]);
        let names = image_files(d.path()).unwrap();
        let want = digest(d.path(), &names).unwrap();
        let p = d.path().join("pages-1.img");
        let good = std::fs::read(&p).unwrap();

        let mut bad = good.clone();
        bad[700_000] ^= 1;
        std::fs::write(&p, &bad).unwrap();
        let e = verify(d.path(), &want).unwrap_err();
        assert!(
            matches!(&e, DigestError::Damaged { name } if name == "pages-1.img"),
            "{e}"
        );

        std::fs::write(&p, &good[..good.len() - 4096]).unwrap();
        let e = verify(d.path(), &want).unwrap_err();
        assert!(e.to_string().contains("pages-1.img is truncated"), "{e}");

        std::fs::remove_file(&p).unwrap();
        let e = verify(d.path(), &want).unwrap_err();
        assert!(matches!(e, DigestError::Missing { .. }), "{e}");
    }
}
