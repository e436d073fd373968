//! The image of one process's KFD state: `amdgpu-kfd-<id>.img` in CRIU's image directory.
//!
//! ```text
//! header   magic "CRIUKFD\0", version, payload length, metadata length, metadata CRC32 (40 bytes)
//! payload  the KFD private data, then the contents of each VRAM/GTT buffer
//! metadata JSON: process, GPUs (topology), buffers, and each payload section's offset, length, CRC32
//! ```
//!
//! Written in one pass (the header last), read with every length bounded by the file's size and
//! every section checked against its CRC, so a truncated, corrupted, oversized or foreign file
//! is refused with a message that says which.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::topology::Topology;

pub const MAGIC: [u8; 8] = *b"CRIUKFD\0";
pub const VERSION: u32 = 1;
const HEADER: u64 = 40;
/// Metadata larger than this is refused (a buffer list of millions would be far below it).
pub const MAX_METADATA: u64 = 64 << 20;
/// Copies go through a buffer of this size.
pub const CHUNK: usize = 8 << 20;

pub fn file_name(id: u32) -> String {
    format!("amdgpu-kfd-{id}.img")
}

/// A byte range of the payload and its checksum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Section {
    pub offset: u64,
    pub len: u64,
    pub crc32: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// The gpu_id the application knows (from its first start; KFD keeps it across restores).
    pub user_gpu_id: u32,
    /// The gpu_id on the dumping machine.
    pub actual_gpu_id: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoRecord {
    pub addr: u64,
    pub size: u64,
    pub offset: u64,
    /// User gpu_id.
    pub gpu_id: u32,
    pub alloc_flags: u32,
    /// Saved contents (VRAM and GTT buffers).
    pub contents: Option<Section>,
}

/// The metadata of a KFD image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KfdImage {
    /// The process as KFD named it (its pid in its own namespace).
    pub pid: u32,
    /// KFD ioctl version of the dumping kernel.
    pub kfd_version: (u32, u32),
    /// The GPUs the process used, labelled with their user gpu_ids, and the CPUs.
    pub topology: Topology,
    pub devices: Vec<DeviceRecord>,
    pub bos: Vec<BoRecord>,
    pub num_objects: u32,
    /// KFD's private data (queues, events, SVM ranges; opaque, bound to the kernel).
    pub priv_data: Section,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is not a KFD image (bad magic): the image directory holds something else")]
    BadMagic { path: String },
    #[error("{path} has format version {found}, this plugin reads {VERSION}: restore with the release that dumped it")]
    Version { path: String, found: u32 },
    #[error("{path} is truncated ({found} bytes, {expected} expected): copy the checkpoint again")]
    Truncated {
        path: String,
        expected: u64,
        found: u64,
    },
    #[error("{path} is oversized ({what}): refused")]
    Oversized { path: String, what: String },
    #[error("{path} is corrupt ({what}): copy the checkpoint again")]
    Corrupt { path: String, what: String },
}

/// Writes an image in one pass.
pub struct ImageWriter {
    path: PathBuf,
    file: File,
    len: u64,
}

impl ImageWriter {
    pub fn create(path: &Path) -> Result<ImageWriter, ImageError> {
        let io = |e| ImageError::Io {
            path: path.display().to_string(),
            source: e,
        };
        let mut file = File::create(path).map_err(io)?;
        file.write_all(&[0u8; HEADER as usize]).map_err(io)?;
        Ok(ImageWriter {
            path: path.to_path_buf(),
            file,
            len: 0,
        })
    }

    fn io(&self, e: io::Error) -> ImageError {
        ImageError::Io {
            path: self.path.display().to_string(),
            source: e,
        }
    }

    /// Appends a section, produced in chunks by `fill` (called with a buffer to fill and the
    /// offset into the section); returns it with its CRC.
    pub fn section(
        &mut self,
        len: u64,
        mut fill: impl FnMut(&mut [u8], u64) -> io::Result<()>,
    ) -> Result<Section, ImageError> {
        let mut buf = vec![0u8; (len as usize).min(CHUNK)];
        let mut crc = crc32fast::Hasher::new();
        let mut done = 0u64;
        while done < len {
            let n = ((len - done) as usize).min(CHUNK);
            fill(&mut buf[..n], done).map_err(|e| self.io(e))?;
            crc.update(&buf[..n]);
            self.file.write_all(&buf[..n]).map_err(|e| self.io(e))?;
            done += n as u64;
        }
        let s = Section {
            offset: self.len,
            len,
            crc32: crc.finalize(),
        };
        self.len += len;
        Ok(s)
    }

    /// Writes the metadata and the header.
    pub fn finish(mut self, meta: &KfdImage) -> Result<(), ImageError> {
        let json = serde_json::to_vec(meta).map_err(|e| self.io(io::Error::other(e)))?;
        self.file.write_all(&json).map_err(|e| self.io(e))?;
        let mut h = Vec::with_capacity(HEADER as usize);
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&self.len.to_le_bytes());
        h.extend_from_slice(&(json.len() as u64).to_le_bytes());
        h.extend_from_slice(&crc32fast::hash(&json).to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        self.file.write_all_at(&h, 0).map_err(|e| self.io(e))?;
        self.file.sync_all().map_err(|e| self.io(e))
    }
}

/// The fixed header of the image at `p`: payload length, metadata length and checksum.
fn read_header(file: &mut File, p: &str) -> Result<(u64, u64, u32), ImageError> {
    let mut h = [0u8; HEADER as usize];
    file.read_exact(&mut h).map_err(|source| ImageError::Io {
        path: p.to_owned(),
        source,
    })?;
    if h[..8] != MAGIC {
        return Err(ImageError::BadMagic { path: p.to_owned() });
    }
    // Fixed offsets inside the header read above.
    let u32_at = |o: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&h[o..o + 4]);
        u32::from_le_bytes(b)
    };
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let version = u32_at(8);
    if version != VERSION {
        return Err(ImageError::Version {
            path: p.to_owned(),
            found: version,
        });
    }
    // The two reserved words are written as zero: anything else is damage no checksum covers.
    if u32_at(12) != 0 || u32_at(36) != 0 {
        return Err(ImageError::Corrupt {
            path: p.to_owned(),
            what: "reserved header bytes are not zero".into(),
        });
    }
    let (payload_len, meta_len, meta_crc) = (u64_at(16), u64_at(24), u32_at(32));
    if meta_len > MAX_METADATA {
        return Err(ImageError::Oversized {
            path: p.to_owned(),
            what: format!("{meta_len} bytes of metadata, at most {MAX_METADATA}"),
        });
    }
    Ok((payload_len, meta_len, meta_crc))
}

/// An image opened for restore, its metadata checked.
pub struct ImageReader {
    path: PathBuf,
    file: File,
    payload_len: u64,
    pub meta: KfdImage,
}

impl ImageReader {
    pub fn open(path: &Path) -> Result<ImageReader, ImageError> {
        let p = path.display().to_string();
        let io = |e| ImageError::Io {
            path: p.clone(),
            source: e,
        };
        let mut file = File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        if size < HEADER {
            return Err(ImageError::Truncated {
                path: p,
                expected: HEADER,
                found: size,
            });
        }
        let (payload_len, meta_len, meta_crc) = read_header(&mut file, &p)?;
        let expected = HEADER
            .checked_add(payload_len)
            .and_then(|v| v.checked_add(meta_len))
            .ok_or_else(|| ImageError::Oversized {
                path: p.clone(),
                what: "lengths overflow".into(),
            })?;
        if size < expected {
            return Err(ImageError::Truncated {
                path: p,
                expected,
                found: size,
            });
        }
        if size > expected {
            return Err(ImageError::Oversized {
                path: p,
                what: format!("{} bytes more than its header declares", size - expected),
            });
        }
        let mut json = vec![0u8; meta_len as usize];
        file.seek(SeekFrom::Start(HEADER + payload_len))
            .map_err(io)?;
        file.read_exact(&mut json).map_err(io)?;
        if crc32fast::hash(&json) != meta_crc {
            return Err(ImageError::Corrupt {
                path: p,
                what: "metadata checksum mismatch".into(),
            });
        }
        let meta: KfdImage = serde_json::from_slice(&json).map_err(|e| ImageError::Corrupt {
            path: p.clone(),
            what: format!("metadata: {e}"),
        })?;
        let r = ImageReader {
            path: path.to_path_buf(),
            file,
            payload_len,
            meta,
        };
        r.check_sections()?;
        Ok(r)
    }

    fn corrupt(&self, what: String) -> ImageError {
        ImageError::Corrupt {
            path: self.path.display().to_string(),
            what,
        }
    }

    /// Every section inside the payload, every buffer's contents exactly its size.
    fn check_sections(&self) -> Result<(), ImageError> {
        let inside = |s: &Section| {
            s.offset
                .checked_add(s.len)
                .is_some_and(|e| e <= self.payload_len)
        };
        if !inside(&self.meta.priv_data) {
            return Err(self.corrupt("private data outside the payload".into()));
        }
        for b in &self.meta.bos {
            if let Some(s) = &b.contents {
                if !inside(s) || s.len != b.size {
                    return Err(self.corrupt(format!(
                        "buffer at {:#x}: contents of {} bytes for a buffer of {}",
                        b.addr, s.len, b.size
                    )));
                }
            }
        }
        Ok(())
    }

    /// Streams a section to `sink` in chunks (offset into the section, bytes), then checks its
    /// CRC. `sink` may have consumed the data before a mismatch is found: callers treat the
    /// error as fatal for what they restored.
    pub fn read_section(
        &self,
        s: &Section,
        mut sink: impl FnMut(u64, &[u8]) -> io::Result<()>,
    ) -> Result<(), ImageError> {
        let io = |e| ImageError::Io {
            path: self.path.display().to_string(),
            source: e,
        };
        let mut buf = vec![0u8; (s.len as usize).min(CHUNK)];
        let mut crc = crc32fast::Hasher::new();
        let mut done = 0u64;
        while done < s.len {
            let n = ((s.len - done) as usize).min(CHUNK);
            self.file
                .read_exact_at(&mut buf[..n], HEADER + s.offset + done)
                .map_err(io)?;
            crc.update(&buf[..n]);
            sink(done, &buf[..n]).map_err(io)?;
            done += n as u64;
        }
        if crc.finalize() != s.crc32 {
            return Err(self.corrupt(format!("section at {} fails its checksum", s.offset)));
        }
        Ok(())
    }

    pub fn read_all(&self, s: &Section) -> Result<Vec<u8>, ImageError> {
        let mut out = vec![0u8; s.len as usize];
        self.read_section(s, |off, b| {
            out[off as usize..off as usize + b.len()].copy_from_slice(b);
            Ok(())
        })?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::fixture;

    fn write_sample(path: &Path) -> KfdImage {
        let mut w = ImageWriter::create(path).unwrap();
        let priv_data = w
            .section(5, |b, _| {
                b.copy_from_slice(b"queue");
                Ok(())
            })
            .unwrap();
        let contents = w
            .section(3 * CHUNK as u64 / 2, |b, off| {
                for (i, x) in b.iter_mut().enumerate() {
                    *x = ((off as usize + i) % 251) as u8;
                }
                Ok(())
            })
            .unwrap();
        let meta = KfdImage {
            pid: 42,
            kfd_version: (1, 16),
            topology: fixture::single_gpu(),
            devices: vec![DeviceRecord {
                user_gpu_id: 7,
                actual_gpu_id: 7,
            }],
            bos: vec![BoRecord {
                addr: 0x7000_0000,
                size: contents.len,
                offset: 0,
                gpu_id: 7,
                alloc_flags: crate::uapi::alloc::VRAM,
                contents: Some(contents),
            }],
            num_objects: 1,
            priv_data,
        };
        w.finish(&meta).unwrap();
        meta
    }

    #[test]
    fn round_trip_with_checksums() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(file_name(3));
        let meta = write_sample(&p);
        let r = ImageReader::open(&p).unwrap();
        assert_eq!(r.meta, meta);
        assert_eq!(r.read_all(&r.meta.priv_data).unwrap(), b"queue");
        let data = r
            .read_all(r.meta.bos[0].contents.as_ref().unwrap())
            .unwrap();
        assert!(data.iter().enumerate().all(|(i, x)| *x == (i % 251) as u8));
    }

    #[test]
    fn damage_is_refused_with_its_name() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("img");
        write_sample(&p);
        let good = std::fs::read(&p).unwrap();
        let check = |bytes: &[u8], want: &str| {
            std::fs::write(&p, bytes).unwrap();
            let e = ImageReader::open(&p).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        check(&good[..good.len() - 10], "truncated");
        check(&good[..20], "truncated");
        let mut longer = good.clone();
        longer.extend_from_slice(&[0; 9]);
        check(&longer, "oversized");
        let mut magic = good.clone();
        magic[0] = b'X';
        check(&magic, "bad magic");
        let mut version = good.clone();
        version[8] = 9;
        check(&version, "format version 9");
        let mut meta = good.clone();
        let n = meta.len();
        meta[n - 3] ^= 0x20;
        check(&meta, "metadata checksum");
        let mut huge = good.clone();
        huge[24..32].copy_from_slice(&(MAX_METADATA + 1).to_le_bytes());
        check(&huge, "oversized");
        // A flipped byte in the buffer contents is found when they are read.
        let mut payload = good.clone();
        payload[HEADER as usize + 100] ^= 1;
        std::fs::write(&p, &payload).unwrap();
        let r = ImageReader::open(&p).unwrap();
        let e = r
            .read_all(r.meta.bos[0].contents.as_ref().unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("fails its checksum"), "{e}");
    }
}
