//! How a chunk is kept: raw, or compressed (zstd or LZ4) where that saves enough to pay for
//! itself. A stored chunk says how it was kept and how long it is, so it can be read without
//! its manifest: one codec byte, the content's length (u32, little endian), the payload.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};

const RAW: u8 = 0;
const ZSTD: u8 = 1;
const LZ4: u8 = 2;
const HEADER: usize = 5;

/// A compressed chunk is kept only when it is at most this share of the raw one (15/16):
/// smaller savings cost more to decompress than they save in reading.
const KEEP_NUM: usize = 15;
const KEEP_DEN: usize = 16;

/// What new chunks are compressed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "codec", content = "level")]
pub enum Compression {
    None,
    Zstd(i32),
    Lz4,
}

impl Default for Compression {
    /// zstd's fastest level: on the GPU machine's 16 CPUs it compresses faster than a disk
    /// writes, and saves a quarter of a training state (docs/performance.md).
    fn default() -> Compression {
        Compression::Zstd(1)
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd(l) => write!(f, "zstd:{l}"),
            Compression::Lz4 => f.write_str("lz4"),
        }
    }
}

impl FromStr for Compression {
    type Err = String;

    /// `none`, `lz4`, `zstd` or `zstd:LEVEL` (1 to 19, or negative for faster levels).
    fn from_str(s: &str) -> Result<Compression, String> {
        match s.split_once(':') {
            None if s == "none" => Ok(Compression::None),
            None if s == "lz4" => Ok(Compression::Lz4),
            None if s == "zstd" => Ok(Compression::default()),
            Some(("zstd", level)) => match level.parse::<i32>() {
                Ok(l) if (-7..=19).contains(&l) && l != 0 => Ok(Compression::Zstd(l)),
                _ => Err(format!("zstd level {level:?}: use -7 to -1 or 1 to 19")),
            },
            _ => Err(format!(
                "compression {s:?}: use none, lz4, zstd or zstd:LEVEL"
            )),
        }
    }
}

/// Whether compressing a file's chunks pays, learnt as they go: after 8 chunks in a row that
/// did not compress enough, only every 16th is tried until one does (GPU data that does not
/// compress then costs one chunk in 16 of compression time).
#[derive(Debug, Default)]
pub struct Pays {
    misses: AtomicU32,
    skipped: AtomicU32,
}

impl Pays {
    const MISSES: u32 = 8;
    const PROBE_EVERY: u32 = 16;

    fn should_try(&self) -> bool {
        if self.misses.load(Ordering::Relaxed) < Self::MISSES {
            return true;
        }
        self.skipped.fetch_add(1, Ordering::Relaxed) % Self::PROBE_EVERY == 0
    }

    fn saw(&self, paid: bool) {
        if paid {
            self.misses.store(0, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A chunk as stored: the header and the payload.
pub fn encode(data: &[u8], how: Compression, pays: &Pays) -> Vec<u8> {
    let packed = match how {
        Compression::None => None,
        _ if !pays.should_try() => None,
        Compression::Zstd(level) => zstd::bulk::compress(data, level).ok(),
        Compression::Lz4 => Some(lz4_flex::block::compress(data)),
    };
    let keep = packed.filter(|p| p.len() * KEEP_DEN <= data.len() * KEEP_NUM);
    if how != Compression::None {
        pays.saw(keep.is_some());
    }
    let (codec, payload) = match (&keep, how) {
        (Some(p), Compression::Zstd(_)) => (ZSTD, p.as_slice()),
        (Some(p), _) => (LZ4, p.as_slice()),
        (None, _) => (RAW, data),
    };
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.push(codec);
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The content of a stored chunk (a raw one without a copy), or why it cannot be read.
pub fn decode(stored: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    use std::borrow::Cow;
    if stored.len() < HEADER {
        return Err(format!("{} bytes, shorter than its header", stored.len()));
    }
    let len = u32::from_le_bytes([stored[1], stored[2], stored[3], stored[4]]) as usize;
    let payload = &stored[HEADER..];
    let data = match stored[0] {
        RAW => Cow::Borrowed(payload),
        ZSTD => Cow::Owned(zstd::bulk::decompress(payload, len).map_err(|e| format!("zstd: {e}"))?),
        LZ4 => {
            Cow::Owned(lz4_flex::block::decompress(payload, len).map_err(|e| format!("lz4: {e}"))?)
        }
        other => return Err(format!("unknown codec {other}")),
    };
    if data.len() != len {
        return Err(format!("{} bytes where its header says {len}", data.len()));
    }
    Ok(data)
}

/// The content's length a stored chunk's header gives.
pub fn content_len(stored: &[u8]) -> Option<u64> {
    (stored.len() >= HEADER)
        .then(|| u32::from_le_bytes([stored[1], stored[2], stored[3], stored[4]]) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn compressible_chunks_are_kept_compressed_and_read_back() {
        let data: Vec<u8> = (0..1 << 20).map(|i| (i / 64) as u8).collect();
        for how in [Compression::Zstd(1), Compression::Lz4] {
            let stored = encode(&data, how, &Pays::default());
            assert!(stored.len() < data.len() / 4, "{how}");
            assert_eq!(&*decode(&stored).unwrap(), &data[..]);
        }
    }

    #[test]
    fn noise_is_kept_raw_and_after_eight_misses_mostly_not_tried() {
        let data = noise(64 << 10);
        let pays = Pays::default();
        for _ in 0..8 {
            assert_eq!(encode(&data, Compression::Zstd(1), &pays)[0], RAW);
        }
        let tried = (0..32).filter(|_| pays.should_try()).count();
        assert_eq!(tried, 2);
        let stored = encode(&data, Compression::Zstd(1), &pays);
        assert_eq!(&*decode(&stored).unwrap(), &data[..]);
    }

    #[test]
    fn a_damaged_chunk_says_why() {
        let data: Vec<u8> = vec![7; 4096];
        let mut stored = encode(&data, Compression::Zstd(1), &Pays::default());
        let n = stored.len();
        stored[n - 2] ^= 0xff;
        assert!(decode(&stored).is_err() || *decode(&stored).unwrap() != data[..]);
        assert!(decode(&[1, 2])
            .unwrap_err()
            .contains("shorter than its header"));
        assert!(decode(&[9, 0, 0, 0, 0])
            .unwrap_err()
            .contains("unknown codec"));
    }

    #[test]
    fn settings_parse() {
        assert_eq!("zstd".parse(), Ok(Compression::Zstd(1)));
        assert_eq!("zstd:3".parse(), Ok(Compression::Zstd(3)));
        assert_eq!("lz4".parse(), Ok(Compression::Lz4));
        assert_eq!("none".parse(), Ok(Compression::None));
        assert!("zstd:99".parse::<Compression>().is_err());
        assert!("gzip".parse::<Compression>().is_err());
    }
}
