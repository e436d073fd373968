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

/// `IMG_COMMON_MAGIC` and the images' own magics (criu/include/magic.h).
const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
const PSTREE_MAGIC: u32 = 0x5027_3030;
const CORE_MAGIC: u32 = 0x5505_3847;
const MM_MAGIC: u32 = 0x5749_2820;
const FILES_MAGIC: u32 = 0x5630_3138;
/// Larger than any pstree, core, mm or files image of a real tree.
const MAX_IMAGE: u64 = 64 << 20;
/// vma_entry.status bits of a file mapping (criu/include/image.h).
const VMA_FILE_PRIVATE: u64 = 1 << 6;
const VMA_FILE_SHARED: u64 = 1 << 7;
/// fd_types.REG (criu/images/fdinfo.proto).
const FD_REG: u64 = 1;

/// A process of the image that mapped the CUDA driver: what CRIU's C cuda_plugin checkpointed
/// (it records nothing of its own; the device memory is inside the process's pages).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CudaMapper {
    pub pid: u32,
    pub comm: String,
}

/// The processes of the image in `dir` that mapped `libcuda.so` when they were dumped, read from
/// CRIU's pstree, files, mm and core images (criu/images/{pstree,fdinfo,regfile,mm,vma,core}.proto).
pub fn cuda_mappers(dir: &Path) -> Result<Vec<CudaMapper>, CriuImageError> {
    let mut names = std::collections::HashMap::new();
    // files.img: file_entry { type = 1; id = 2; reg = 3 { name = 6 } }
    for entry in entries(&dir.join("files.img"), FILES_MAGIC)? {
        let (mut kind, mut id, mut name) = (0, 0, None);
        for (tag, value) in fields(&entry)? {
            match (tag, value) {
                (1, Value::Varint(v)) => kind = v,
                (2, Value::Varint(v)) => id = v,
                (3, Value::Bytes(reg)) => {
                    for (t, v) in fields(reg)? {
                        if let (6, Value::Bytes(n)) = (t, v) {
                            name = Some(String::from_utf8_lossy(n).into_owned());
                        }
                    }
                }
                _ => {}
            }
        }
        if let (FD_REG, Some(name)) = (kind, name) {
            names.insert(id, name);
        }
    }
    let mut out = Vec::new();
    // pstree.img: pstree_entry { pid = 1; ... }
    for entry in entries(&dir.join("pstree.img"), PSTREE_MAGIC)? {
        let Some(pid) = fields(&entry)?.into_iter().find_map(|(t, v)| match (t, v) {
            (1, Value::Varint(p)) => Some(p as u32),
            _ => None,
        }) else {
            continue;
        };
        // mm-PID.img: mm_entry { vmas = 14 { shmid = 4; status = 7 } }
        let mm = entries(&dir.join(format!("mm-{pid}.img")), MM_MAGIC)?;
        let maps_cuda = mm.first().map(|m| fields(m)).transpose()?.is_some_and(|f| {
            f.iter().any(|(t, v)| match (t, v) {
                (14, Value::Bytes(vma)) => fields(vma).is_ok_and(|vf| {
                    let get = |n| {
                        vf.iter().find_map(|(t, v)| match (t, v) {
                            (t, Value::Varint(x)) if *t == n => Some(*x),
                            _ => None,
                        })
                    };
                    let file =
                        get(7).is_some_and(|s| s & (VMA_FILE_PRIVATE | VMA_FILE_SHARED) != 0);
                    file && get(4)
                        .and_then(|id| names.get(&id))
                        .is_some_and(|n| is_libcuda(n))
                }),
                _ => false,
            })
        });
        if maps_cuda {
            out.push(CudaMapper {
                pid,
                comm: comm(dir, pid).unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

fn is_libcuda(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|f| f.starts_with("libcuda.so"))
}

/// core-PID.img: core_entry { tc = 3 { comm = 6 } }
fn comm(dir: &Path, pid: u32) -> Option<String> {
    let core = entries(&dir.join(format!("core-{pid}.img")), CORE_MAGIC).ok()?;
    fields(core.first()?)
        .ok()?
        .into_iter()
        .find_map(|(t, v)| match (t, v) {
            (3, Value::Bytes(tc)) => fields(tc)
                .ok()?
                .into_iter()
                .find_map(|(t, v)| match (t, v) {
                    (6, Value::Bytes(c)) => Some(String::from_utf8_lossy(c).into_owned()),
                    _ => None,
                }),
            _ => None,
        })
}

/// The entries of a CRIU image: the common magic, the image's magic, then (length, message) pairs.
fn entries(path: &Path, magic: u32) -> Result<Vec<Vec<u8>>, CriuImageError> {
    let io = |source| CriuImageError::Io {
        path: path.display().to_string(),
        source,
    };
    let bad = |why| CriuImageError::Bad {
        path: path.display().to_string(),
        why,
    };
    if std::fs::metadata(path).map_err(io)?.len() > MAX_IMAGE {
        return Err(bad("too large"));
    }
    let bytes = std::fs::read(path).map_err(io)?;
    let (common, rest) = split_u32(&bytes).ok_or_else(|| bad("too short"))?;
    let (own, mut rest) = split_u32(rest).ok_or_else(|| bad("too short"))?;
    if common != IMG_COMMON_MAGIC || own != magic {
        return Err(bad("wrong magic"));
    }
    let mut out = Vec::new();
    while let Some((len, after)) = split_u32(rest) {
        let entry = after.get(..len as usize).ok_or_else(|| bad("truncated"))?;
        out.push(entry.to_vec());
        rest = &after[len as usize..];
    }
    Ok(out)
}

fn fields(b: &[u8]) -> Result<Vec<(u64, Value<'_>)>, CriuImageError> {
    Fields(b)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|why| CriuImageError::Bad {
            path: "an image entry".into(),
            why,
        })
}

fn split_u32(b: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = b.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*head), rest))
}

#[derive(Clone, Copy)]
enum Value<'a> {
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

    fn varint_field(tag: u64, v: u64) -> Vec<u8> {
        let mut out = vec![(tag << 3) as u8];
        let mut v = v;
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    fn image(magic: u32, entries: &[Vec<u8>]) -> Vec<u8> {
        let mut v = IMG_COMMON_MAGIC.to_le_bytes().to_vec();
        v.extend_from_slice(&magic.to_le_bytes());
        for e in entries {
            v.extend_from_slice(&(e.len() as u32).to_le_bytes());
            v.extend_from_slice(e);
        }
        v
    }

    fn reg_file(id: u64, name: &str) -> Vec<u8> {
        let mut e = varint_field(1, FD_REG);
        e.extend(varint_field(2, id));
        e.extend(field(3, &field(6, name.as_bytes())));
        e
    }

    fn mm(vmas: &[(u64, u64)]) -> Vec<u8> {
        let mut e = Vec::new();
        for &(shmid, status) in vmas {
            let mut vma = varint_field(1, 0x1000);
            vma.extend(varint_field(4, shmid));
            vma.extend(varint_field(7, status));
            e.extend(field(14, &vma));
        }
        e
    }

    #[test]
    fn finds_the_processes_that_mapped_the_cuda_driver() {
        let d = tempfile::tempdir().unwrap();
        let w = |name: &str, bytes: Vec<u8>| std::fs::write(d.path().join(name), bytes).unwrap();
        w(
            "files.img",
            image(
                FILES_MAGIC,
                &[
                    reg_file(7, "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"),
                    reg_file(8, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
                    reg_file(9, "/opt/app/libcudart-not-the-driver.so"),
                ],
            ),
        );
        w(
            "pstree.img",
            image(PSTREE_MAGIC, &[varint_field(1, 100), varint_field(1, 101)]),
        );
        // 100 maps libc and the driver; 101 libc, and the driver's id in an anonymous VMA.
        w(
            "mm-100.img",
            image(
                MM_MAGIC,
                &[mm(&[(8, 1 | VMA_FILE_PRIVATE), (7, 1 | VMA_FILE_PRIVATE)])],
            ),
        );
        w(
            "mm-101.img",
            image(MM_MAGIC, &[mm(&[(8, 1 | VMA_FILE_PRIVATE), (7, 1)])]),
        );
        let mut tc = field(6, b"trainer");
        tc.extend(varint_field(1, 1));
        w("core-100.img", image(CORE_MAGIC, &[field(3, &tc)]));
        assert_eq!(
            cuda_mappers(d.path()).unwrap(),
            vec![CudaMapper {
                pid: 100,
                comm: "trainer".into()
            }]
        );
        w("mm-101.img", image(PSTREE_MAGIC, &[]));
        assert!(cuda_mappers(d.path())
            .unwrap_err()
            .to_string()
            .contains("wrong magic"));
        std::fs::remove_file(d.path().join("mm-101.img")).unwrap();
        assert!(cuda_mappers(d.path())
            .unwrap_err()
            .to_string()
            .contains("mm-101.img"));
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
