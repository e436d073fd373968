//! The little of CRIU's own images that a check outside CRIU needs: the plugin list of
//! `inventory.img` (CRIU >= 4.1 writes there which plugins an image needs; `criu restore`
//! refuses an image whose list names a plugin it did not load).
//!
//! CRIU's images are protobuf messages behind a magic number and a 32-bit length; only the fields
//! read here are decoded (criu/images/inventory.proto: `inventory_entry.plugins_entry = 12`,
//! `plugins_entry.plugins = 12`, repeated strings).

use std::path::Path;

/// `INVENTORY_MAGIC` (criu/include/magic.h); the inventory has no common magic before it.
const INVENTORY_MAGIC: u32 = 0x5831_3116;
const PLUGINS_ENTRY: u64 = 12;
const PLUGINS: u64 = 12;
/// No inventory comes anywhere near this.
const MAX_INVENTORY: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CriuImageError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a CRIU inventory image ({why}): the checkpoint is damaged or not a CRIU image directory")]
    Bad { path: String, why: &'static str },
}

/// The plugins the image's inventory lists: `Ok(None)` when it has no list (dumped by CRIU < 4.1,
/// or no plugin was needed and this CRIU writes none).
pub fn inventory_plugins(dir: &Path) -> Result<Option<Vec<String>>, CriuImageError> {
    let path = dir.join("inventory.img");
    let io = |source| CriuImageError::Io {
        path: path.display().to_string(),
        source,
    };
    let bad = |why| CriuImageError::Bad {
        path: path.display().to_string(),
        why,
    };
    let meta = std::fs::metadata(&path).map_err(io)?;
    if meta.len() > MAX_INVENTORY {
        return Err(bad("too large"));
    }
    let bytes = std::fs::read(&path).map_err(io)?;
    let (magic, rest) = split_u32(&bytes).ok_or_else(|| bad("too short"))?;
    if magic != INVENTORY_MAGIC {
        return Err(bad("wrong magic"));
    }
    let (len, rest) = split_u32(rest).ok_or_else(|| bad("no entry"))?;
    let entry = rest.get(..len as usize).ok_or_else(|| bad("truncated"))?;
    let mut list = None;
    for field in Fields(entry) {
        let (tag, value) = field.map_err(bad)?;
        if let (PLUGINS_ENTRY, Value::Bytes(b)) = (tag, value) {
            let names = list.get_or_insert_with(Vec::new);
            for inner in Fields(b) {
                if let (PLUGINS, Value::Bytes(name)) = inner.map_err(bad)? {
                    names.push(String::from_utf8_lossy(name).into_owned());
                }
            }
        }
    }
    Ok(list)
}

fn split_u32(b: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = b.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*head), rest))
}

enum Value<'a> {
    Varint,
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of one protobuf message: (field number, value).
struct Fields<'a>(&'a [u8]);

fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let mut b = self.0;
        let item = (|| {
            let key = varint(&mut b).ok_or("bad field key")?;
            let value = match key & 7 {
                0 => varint(&mut b).map(|_| Value::Varint).ok_or("bad varint")?,
                1 | 5 => {
                    let n = if key & 7 == 1 { 8 } else { 4 };
                    b = b.get(n..).ok_or("truncated field")?;
                    Value::Fixed
                }
                2 => {
                    let len = varint(&mut b).ok_or("bad length")? as usize;
                    let (v, rest) = (b.get(..len).ok_or("truncated field")?, &b[len..]);
                    b = rest;
                    Value::Bytes(v)
                }
                _ => return Err("unknown wire type"),
            };
            Ok((key >> 3, value))
        })();
        self.0 = if item.is_ok() { b } else { &[] };
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(tag: u64, bytes: &[u8]) -> Vec<u8> {
        let mut v = vec![(tag << 3 | 2) as u8, bytes.len() as u8];
        v.extend_from_slice(bytes);
        v
    }

    fn inventory(entry: &[u8]) -> Vec<u8> {
        let mut v = INVENTORY_MAGIC.to_le_bytes().to_vec();
        v.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        v.extend_from_slice(entry);
        v
    }

    #[test]
    fn reads_the_plugin_list_and_its_absence() {
        let d = tempfile::tempdir().unwrap();
        let mut plugins = field(PLUGINS, b"cuda_plugin");
        plugins.extend(field(PLUGINS, b"criu_gpu_amd"));
        // img_version = 2 (varint), then the plugins entry.
        let mut entry = vec![1 << 3, 2];
        entry.extend(field(PLUGINS_ENTRY, &plugins));
        std::fs::write(d.path().join("inventory.img"), inventory(&entry)).unwrap();
        assert_eq!(
            inventory_plugins(d.path()).unwrap(),
            Some(vec!["cuda_plugin".to_owned(), "criu_gpu_amd".to_owned()])
        );
        std::fs::write(d.path().join("inventory.img"), inventory(&[1 << 3, 2])).unwrap();
        assert_eq!(inventory_plugins(d.path()).unwrap(), None);
    }

    #[test]
    fn refuses_what_is_not_an_inventory() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("inventory.img");
        std::fs::write(&p, [0u8; 3]).unwrap();
        assert!(inventory_plugins(d.path()).is_err());
        let mut v = inventory(&field(PLUGINS_ENTRY, b"xx"));
        v[0] ^= 1;
        std::fs::write(&p, &v).unwrap();
        assert!(inventory_plugins(d.path())
            .unwrap_err()
            .to_string()
            .contains("wrong magic"));
        let v = inventory(&field(PLUGINS_ENTRY, b"xx"));
        std::fs::write(&p, &v[..v.len() - 1]).unwrap();
        assert!(inventory_plugins(d.path()).is_err());
    }
}
