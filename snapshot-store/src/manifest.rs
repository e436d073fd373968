//! A snapshot's manifest: every file and directory of the image tree, each file as the list of
//! its chunks in order, and what writing it added to the store. Stored as JSON with the BLAKE3
//! hash of its body, so a damaged manifest is refused rather than restored wrong.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::codec::Compression;
use crate::id::ChunkId;

pub const FORMAT: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub name: String,
    /// Seconds since the epoch.
    pub created: u64,
    pub host: String,
    /// Where the tree was read from.
    pub source: String,
    pub entries: Vec<Entry>,
    pub written: Written,
}

/// One entry of the tree; paths are relative, '/'-separated, parents before children.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        size: u64,
        /// The chunks in order: name and length.
        chunks: Vec<(ChunkId, u32)>,
    },
    Link {
        path: String,
        target: String,
    },
}

impl Entry {
    pub fn path(&self) -> &str {
        match self {
            Entry::Dir { path, .. } | Entry::File { path, .. } | Entry::Link { path, .. } => path,
        }
    }
}

/// What writing the snapshot did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Written {
    /// Bytes of file content and their chunks.
    pub bytes: u64,
    pub chunks: u64,
    /// Chunks (and their content bytes) that were not in the store before this snapshot.
    pub new_chunks: u64,
    pub new_bytes: u64,
    /// What those new chunks take in the store (after compression).
    pub new_stored_bytes: u64,
    pub compression: Option<Compression>,
    /// Wall time of the write, and of its parts.
    pub seconds: f64,
    pub cut_seconds: f64,
    pub sync_seconds: f64,
}

impl Manifest {
    /// The files' chunk references, with the file and offset of each.
    pub fn chunk_refs(&self) -> impl Iterator<Item = ChunkRef<'_>> {
        self.entries.iter().flat_map(|e| {
            let (path, chunks) = match e {
                Entry::File { path, chunks, .. } => (path.as_str(), chunks.as_slice()),
                _ => ("", &[][..]),
            };
            let mut offset = 0u64;
            chunks.iter().map(move |(id, len)| {
                let r = ChunkRef {
                    id: *id,
                    file: path,
                    offset,
                    len: u64::from(*len),
                };
                offset += u64::from(*len);
                r
            })
        })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let body = serde_json::to_string(self).expect("a manifest serializes");
        let hash = blake3::hash(body.as_bytes()).to_hex();
        format!("{{\"blake3\":\"{hash}\",\"body\":{body}}}\n").into_bytes()
    }

    /// Reads a stored manifest, refusing one whose body does not match its hash.
    pub fn from_bytes(bytes: &[u8]) -> Result<Manifest, String> {
        #[derive(Deserialize)]
        struct Sealed<'a> {
            blake3: String,
            #[serde(borrow)]
            body: &'a RawValue,
        }
        let sealed: Sealed<'_> =
            serde_json::from_slice(bytes).map_err(|e| format!("not a manifest: {e}"))?;
        let got = blake3::hash(sealed.body.get().as_bytes()).to_hex();
        if got.as_str() != sealed.blake3 {
            return Err(format!(
                "its body hashes to {got}, not the {} it records",
                sealed.blake3
            ));
        }
        let m: Manifest = serde_json::from_str(sealed.body.get()).map_err(|e| e.to_string())?;
        if m.format != FORMAT {
            return Err(format!(
                "manifest format {} (this criu-gpu reads {FORMAT})",
                m.format
            ));
        }
        Ok(m)
    }
}

/// One chunk of one file.
#[derive(Debug, Clone, Copy)]
pub struct ChunkRef<'a> {
    pub id: ChunkId,
    pub file: &'a str,
    pub offset: u64,
    pub len: u64,
}

/// Snapshot names: they are file and object names in the store.
pub fn check_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format: FORMAT,
            name: "s1".into(),
            created: 1,
            host: "h".into(),
            source: "/d".into(),
            entries: vec![
                Entry::Dir {
                    path: "sub".into(),
                    mode: 0o755,
                },
                Entry::File {
                    path: "sub/a".into(),
                    mode: 0o600,
                    size: 5,
                    chunks: vec![(ChunkId::of(b"ab"), 2), (ChunkId::of(b"cde"), 3)],
                },
            ],
            written: Written::default(),
        }
    }

    #[test]
    fn a_manifest_reads_back_and_its_chunks_have_offsets() {
        let m = Manifest::from_bytes(&sample().to_bytes()).unwrap();
        assert_eq!(m.entries, sample().entries);
        let refs: Vec<_> = m.chunk_refs().map(|r| (r.file, r.offset, r.len)).collect();
        assert_eq!(refs, vec![("sub/a", 0, 2), ("sub/a", 2, 3)]);
    }

    #[test]
    fn an_edited_manifest_is_refused() {
        let bytes = String::from_utf8(sample().to_bytes()).unwrap();
        let edited = bytes.replace("\"size\":5", "\"size\":6");
        let why = Manifest::from_bytes(edited.as_bytes()).unwrap_err();
        assert!(why.contains("hashes to"), "{why}");
        assert!(Manifest::from_bytes(b"{}").is_err());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("server-1.2_b"));
        for bad in ["", ".x", "a/b", "a b", &"x".repeat(129)] {
            assert!(!check_name(bad), "{bad}");
        }
    }
}
