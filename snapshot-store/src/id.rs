//! A chunk's name: the BLAKE3 hash of its (uncompressed) content.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId([u8; 32]);

impl ChunkId {
    /// The name of `data`.
    pub fn of(data: &[u8]) -> ChunkId {
        ChunkId(*blake3::hash(data).as_bytes())
    }

    pub fn hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({})", self.hex())
    }
}

impl FromStr for ChunkId {
    type Err = String;

    fn from_str(s: &str) -> Result<ChunkId, String> {
        blake3::Hash::from_hex(s)
            .map(|h| ChunkId(*h.as_bytes()))
            .map_err(|e| format!("{s:?} is not a chunk name: {e}"))
    }
}

impl Serialize for ChunkId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for ChunkId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ChunkId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_the_blake3_of_the_content_and_reads_back_from_hex() {
        let id = ChunkId::of(b"abc");
        assert_eq!(
            id.hex(),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
        assert_eq!(id.hex().parse::<ChunkId>().unwrap(), id);
        assert!("xyz".parse::<ChunkId>().is_err());
    }
}
