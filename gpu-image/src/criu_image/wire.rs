//! CRIU's image files on the wire: a magic number (after the common one, for all but the
//! inventory), then entries of a 32-bit length and a protobuf message, whose fields are read
//! here without a protobuf library (only varints and length-delimited fields are needed).

use std::path::Path;

use super::CriuImageError;

/// `IMG_COMMON_MAGIC` (criu/include/magic.h): before the magic of every image but the inventory.
pub(super) const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
/// Larger than any pstree, core, mm or files image of a real tree.
pub(super) const MAX_IMAGE: u64 = 64 << 20;

/// One CRIU image file: its magic checked, then its (32-bit length, protobuf message) entries.
pub(super) struct Image {
    path: String,
    pub(super) entries: Vec<Vec<u8>>,
}

impl Image {
    /// `common`: the image starts with IMG_COMMON_MAGIC (all but the inventory do).
    pub(super) fn read(
        path: &Path,
        common: bool,
        magic: u32,
        max: u64,
    ) -> Result<Image, CriuImageError> {
        let mut image = Image {
            path: path.display().to_string(),
            entries: Vec::new(),
        };
        let io = |source| CriuImageError::Io {
            path: image.path.clone(),
            source,
        };
        if std::fs::metadata(path).map_err(io)?.len() > max {
            return Err(image.bad("too large"));
        }
        let bytes = std::fs::read(path).map_err(io)?;
        let mut rest = bytes.as_slice();
        let magics = if common {
            vec![IMG_COMMON_MAGIC, magic]
        } else {
            vec![magic]
        };
        for want in magics {
            let (got, after) = split_u32(rest).ok_or_else(|| image.bad("too short"))?;
            if got != want {
                return Err(image.bad("wrong magic"));
            }
            rest = after;
        }
        while let Some((len, after)) = split_u32(rest) {
            let entry = after
                .get(..len as usize)
                .ok_or_else(|| image.bad("truncated"))?;
            image.entries.push(entry.to_vec());
            rest = &after[len as usize..];
        }
        if !rest.is_empty() {
            return Err(image.bad("truncated"));
        }
        Ok(image)
    }

    pub(super) fn bad(&self, why: &'static str) -> CriuImageError {
        CriuImageError::Bad {
            path: self.path.clone(),
            why,
        }
    }

    /// The fields of `message`, an entry of this image or a message inside one.
    pub(super) fn fields<'a>(
        &self,
        message: &'a [u8],
    ) -> Result<Vec<(u64, Value<'a>)>, CriuImageError> {
        Fields(message)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| self.bad(why))
    }
}

/// The first varint field numbered `tag`.
pub(super) fn varint_field(fields: &[(u64, Value<'_>)], tag: u64) -> Option<u64> {
    fields.iter().find_map(|(t, v)| match v {
        Value::Varint(x) if *t == tag => Some(*x),
        _ => None,
    })
}

/// The first length-delimited field numbered `tag`.
pub(super) fn bytes_field<'a>(fields: &[(u64, Value<'a>)], tag: u64) -> Option<&'a [u8]> {
    fields.iter().find_map(|(t, v)| match v {
        Value::Bytes(b) if *t == tag => Some(*b),
        _ => None,
    })
}

fn split_u32(b: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = b.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*head), rest))
}

#[derive(Clone, Copy)]
pub(super) enum Value<'a> {
    Varint(u64),
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
                0 => varint(&mut b).map(Value::Varint).ok_or("bad varint")?,
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
