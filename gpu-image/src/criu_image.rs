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
/// inventory_entry.dump_criu_run_id: the id of the CRIU run that dumped the image.
const DUMP_RUN_ID: u64 = 13;
/// No inventory comes anywhere near this.
const MAX_INVENTORY: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CriuImageError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a valid CRIU image ({why}): the checkpoint is damaged or not a CRIU image directory")]
    Bad { path: String, why: &'static str },
}

/// The plugins the image's inventory lists: `Ok(None)` when it has no list (dumped by CRIU < 4.1,
/// or no plugin was needed and this CRIU writes none).
pub fn inventory_plugins(dir: &Path) -> Result<Option<Vec<String>>, CriuImageError> {
    let inv = Image::read(
        &dir.join("inventory.img"),
        false,
        INVENTORY_MAGIC,
        MAX_INVENTORY,
    )?;
    let entry = inv.entries.first().ok_or_else(|| inv.bad("no entry"))?;
    let mut list = None;
    for (tag, value) in inv.fields(entry)? {
        if let (PLUGINS_ENTRY, Value::Bytes(b)) = (tag, value) {
            let names = list.get_or_insert_with(Vec::new);
            for (t, v) in inv.fields(b)? {
                if let (PLUGINS, Value::Bytes(name)) = (t, v) {
                    names.push(String::from_utf8_lossy(name).into_owned());
                }
            }
        }
    }
    Ok(list)
}

/// The id of the CRIU run that dumped the image in `dir` (its network lock's table name).
pub fn dump_run_id(dir: &Path) -> Result<Option<String>, CriuImageError> {
    let inv = Image::read(
        &dir.join("inventory.img"),
        false,
        INVENTORY_MAGIC,
        MAX_INVENTORY,
    )?;
    let Some(entry) = inv.entries.first() else {
        return Ok(None);
    };
    Ok(bytes_field(&inv.fields(entry)?, DUMP_RUN_ID)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .filter(|s| !s.is_empty()))
}

/// `IMG_COMMON_MAGIC` and the images' own magics (criu/include/magic.h).
const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
const PSTREE_MAGIC: u32 = 0x5027_3030;
const CORE_MAGIC: u32 = 0x5505_3847;
const MM_MAGIC: u32 = 0x5749_2820;
const FILES_MAGIC: u32 = 0x5630_3138;
const REMAP_FPATH_MAGIC: u32 = 0x5913_3954;
/// Larger than any pstree, core, mm or files image of a real tree.
const MAX_IMAGE: u64 = 64 << 20;
/// vma_entry.status bits of a file mapping (criu/include/image.h).
const VMA_FILE_PRIVATE: u64 = 1 << 6;
const VMA_FILE_SHARED: u64 = 1 << 7;
/// PROT_WRITE (vma_entry.prot holds mmap's prot bits).
const PROT_WRITE: u64 = 2;
/// O_WRONLY, O_APPEND and the access mode's mask (reg_file_entry.flags holds open's flags).
const O_WRONLY: u64 = 1;
const O_ACCMODE: u64 = 3;
const O_APPEND: u64 = 0o2000;
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
    let image = |name: &str, magic| Image::read(&dir.join(name), true, magic, MAX_IMAGE);
    // files.img: file_entry { type = 1; id = 2; reg = 3 { name = 6 } }
    let files = image("files.img", FILES_MAGIC)?;
    let mut names = std::collections::HashMap::new();
    for entry in &files.entries {
        let f = files.fields(entry)?;
        if varint_field(&f, 1) != Some(FD_REG) {
            continue;
        }
        if let (Some(id), Some(reg)) = (varint_field(&f, 2), bytes_field(&f, 3)) {
            if let Some(name) = bytes_field(&files.fields(reg)?, 6) {
                names.insert(id, String::from_utf8_lossy(name).into_owned());
            }
        }
    }
    let mut out = Vec::new();
    each_task_vmas(dir, |pid, vmas| {
        let maps_cuda = vmas.iter().any(|v| {
            varint_field(v, 7).unwrap_or(0) & (VMA_FILE_PRIVATE | VMA_FILE_SHARED) != 0
                && varint_field(v, 4)
                    .and_then(|id| names.get(&id))
                    .is_some_and(|n| is_libcuda(n))
        });
        if maps_cuda {
            out.push(CudaMapper {
                pid,
                comm: comm(dir, pid).unwrap_or_default(),
            });
        }
    })?;
    Ok(out)
}

/// Calls `each` with every task of the image in `dir` and the fields of its memory areas
/// (pstree.img: pstree_entry { pid = 1 }; mm-PID.img: mm_entry { vmas = 14 { shmid = 4;
/// prot = 5; status = 7 } }).
fn each_task_vmas(
    dir: &Path,
    mut each: impl FnMut(u32, &[Vec<(u64, Value<'_>)>]),
) -> Result<(), CriuImageError> {
    let image = |name: &str, magic| Image::read(&dir.join(name), true, magic, MAX_IMAGE);
    let pstree = image("pstree.img", PSTREE_MAGIC)?;
    for entry in &pstree.entries {
        let Some(pid) = varint_field(&pstree.fields(entry)?, 1).map(|p| p as u32) else {
            continue;
        };
        let mm = image(&format!("mm-{pid}.img"), MM_MAGIC)?;
        let mut vmas = Vec::new();
        if let Some(entry) = mm.entries.first() {
            for (tag, value) in mm.fields(entry)? {
                if let (14, Value::Bytes(vma)) = (tag, value) {
                    vmas.push(mm.fields(vma)?);
                }
            }
        }
        each(pid, &vmas);
    }
    Ok(())
}

/// The ids of the files some task of the image in `dir` mapped shared and writable: written
/// through memory, whatever open flags files.img gives them (CRIU records a mapped file with
/// none: cr-dump.c, dump_filemap).
pub fn shared_writable_mappings(
    dir: &Path,
) -> Result<std::collections::BTreeSet<u64>, CriuImageError> {
    let mut ids = std::collections::BTreeSet::new();
    each_task_vmas(dir, |_, vmas| {
        for v in vmas {
            let shared = varint_field(v, 7).unwrap_or(0) & VMA_FILE_SHARED != 0;
            let writable = varint_field(v, 5).unwrap_or(0) & PROT_WRITE != 0;
            if let (true, true, Some(id)) = (shared, writable, varint_field(v, 4)) {
                ids.insert(id);
            }
        }
    })?;
    Ok(ids)
}

/// A regular file of the image, as CRIU checks it when it restores it (its size must be the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegFile {
    pub id: u64,
    /// The path in the dumped task's mount namespace.
    pub name: String,
    /// The open flags (O_WRONLY, O_RDWR, O_APPEND...).
    pub flags: u64,
    /// The size at the dump.
    pub size: Option<u64>,
    /// Unlinked or otherwise remapped: CRIU restores it from the images, not from its path.
    pub remapped: bool,
    /// Unlinked at the dump: its contents are in the images (ghost file N), and a restore makes
    /// it for a moment at `NAME.cr.N.ghost` (criu/files-reg.c, ghost_path), where a restore
    /// killed then leaves it.
    pub ghost: Option<u64>,
}

impl RegFile {
    /// Opened for writing: the process may have changed it since.
    pub fn writable(&self) -> bool {
        self.flags & O_ACCMODE != 0
    }

    /// Opened write-only for appending, as logs are: CRIU records no size for such a file and
    /// restores it whatever it grew to (files-reg.c, should_check_size).
    pub fn appended(&self) -> bool {
        self.flags & O_ACCMODE == O_WRONLY && self.flags & O_APPEND != 0
    }
}

/// The regular files of the image in `dir` (files.img: reg_file_entry { id = 1; flags = 2;
/// name = 6; size = 8 }; remap-fpath.img: remap_file_path_entry { orig_id = 1 }).
pub fn regular_files(dir: &Path) -> Result<Vec<RegFile>, CriuImageError> {
    let remap = dir.join("remap-fpath.img");
    // orig_id -> (remap_id, remap_type): remap_file_path_entry { orig_id = 1; remap_id = 2;
    // remap_type = 3 } (GHOST = 1)
    let mut remapped = std::collections::HashMap::new();
    if remap.exists() {
        let image = Image::read(&remap, true, REMAP_FPATH_MAGIC, MAX_IMAGE)?;
        for entry in &image.entries {
            let f = image.fields(entry)?;
            if let Some(id) = varint_field(&f, 1) {
                let remap_id = varint_field(&f, 2).unwrap_or(0);
                remapped.insert(id, (remap_id, varint_field(&f, 3).unwrap_or(0)));
            }
        }
    }
    let files = Image::read(&dir.join("files.img"), true, FILES_MAGIC, MAX_IMAGE)?;
    let mut out = Vec::new();
    for entry in &files.entries {
        let f = files.fields(entry)?;
        if varint_field(&f, 1) != Some(FD_REG) {
            continue;
        }
        let Some(reg) = bytes_field(&f, 3) else {
            continue;
        };
        let r = files.fields(reg)?;
        let (Some(id), Some(name)) = (varint_field(&r, 1), bytes_field(&r, 6)) else {
            return Err(files.bad("a regular file without its id or name"));
        };
        out.push(RegFile {
            id,
            name: String::from_utf8_lossy(name).into_owned(),
            flags: varint_field(&r, 2).unwrap_or(0),
            size: varint_field(&r, 8),
            remapped: remapped.contains_key(&id),
            ghost: remapped
                .get(&id)
                .filter(|(_, kind)| *kind == 1)
                .map(|(remap_id, _)| *remap_id),
        });
    }
    Ok(out)
}

/// The image's unlinked files that a restore made at their paths after `since` and left there
/// (a restore killed between making them and its tasks opening them): regular files, changed
/// since then, no larger than they were dumped. Their removal lets the next restore make them.
pub fn leftover_ghosts(
    dir: &Path,
    since: std::time::SystemTime,
) -> Result<Vec<std::path::PathBuf>, CriuImageError> {
    use std::os::unix::fs::MetadataExt;
    let since = since
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(i64::MAX, |d| d.as_secs() as i64);
    Ok(regular_files(dir)?
        .into_iter()
        .filter_map(|f| {
            let path = std::path::PathBuf::from(format!("{}.cr.{:x}.ghost", f.name, f.ghost?));
            let m = std::fs::symlink_metadata(&path).ok()?;
            let made_here = m.file_type().is_file()
                && m.ctime() >= since
                && f.size.is_none_or(|s| m.len() <= s);
            made_here.then_some(path)
        })
        .collect())
}

fn is_libcuda(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|f| f.starts_with("libcuda.so"))
}

/// core-PID.img: core_entry { tc = 3 { comm = 6 } }
fn comm(dir: &Path, pid: u32) -> Option<String> {
    let core = Image::read(
        &dir.join(format!("core-{pid}.img")),
        true,
        CORE_MAGIC,
        MAX_IMAGE,
    )
    .ok()?;
    let tc = bytes_field(&core.fields(core.entries.first()?).ok()?, 3)?;
    let comm = bytes_field(&core.fields(tc).ok()?, 6)?;
    Some(String::from_utf8_lossy(comm).into_owned())
}

/// One CRIU image file: its magic checked, then its (32-bit length, protobuf message) entries.
struct Image {
    path: String,
    entries: Vec<Vec<u8>>,
}

impl Image {
    /// `common`: the image starts with IMG_COMMON_MAGIC (all but the inventory do).
    fn read(path: &Path, common: bool, magic: u32, max: u64) -> Result<Image, CriuImageError> {
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

    fn bad(&self, why: &'static str) -> CriuImageError {
        CriuImageError::Bad {
            path: self.path.clone(),
            why,
        }
    }

    /// The fields of `message`, an entry of this image or a message inside one.
    fn fields<'a>(&self, message: &'a [u8]) -> Result<Vec<(u64, Value<'a>)>, CriuImageError> {
        Fields(message)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| self.bad(why))
    }
}

/// The first varint field numbered `tag`.
fn varint_field(fields: &[(u64, Value<'_>)], tag: u64) -> Option<u64> {
    fields.iter().find_map(|(t, v)| match v {
        Value::Varint(x) if *t == tag => Some(*x),
        _ => None,
    })
}

/// The first length-delimited field numbered `tag`.
fn bytes_field<'a>(fields: &[(u64, Value<'a>)], tag: u64) -> Option<&'a [u8]> {
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
        let with_prot: Vec<(u64, u64, u64)> = vmas.iter().map(|&(id, st)| (id, st, 1)).collect();
        mm_prot(&with_prot)
    }

    /// mm_entry of vmas (shmid, status, prot).
    fn mm_prot(vmas: &[(u64, u64, u64)]) -> Vec<u8> {
        let mut e = Vec::new();
        for &(shmid, status, prot) in vmas {
            let mut vma = varint_field(1, 0x1000);
            vma.extend(varint_field(4, shmid));
            vma.extend(varint_field(5, prot));
            vma.extend(varint_field(7, status));
            e.extend(field(14, &vma));
        }
        e
    }

    #[test]
    fn files_mapped_shared_and_writable_are_found_whatever_their_flags() {
        let d = tempfile::tempdir().unwrap();
        let w = |name: &str, bytes: Vec<u8>| std::fs::write(d.path().join(name), bytes).unwrap();
        w(
            "pstree.img",
            image(PSTREE_MAGIC, &[varint_field(1, 100), varint_field(1, 101)]),
        );
        // 7: shared, read and write; 8: shared, read only; 9: private and writable (copy on
        // write: the file is never written).
        w(
            "mm-100.img",
            image(
                MM_MAGIC,
                &[mm_prot(&[
                    (7, 1 | VMA_FILE_SHARED, 3),
                    (8, 1 | VMA_FILE_SHARED, 1),
                ])],
            ),
        );
        w(
            "mm-101.img",
            image(MM_MAGIC, &[mm_prot(&[(9, 1 | VMA_FILE_PRIVATE, 3)])]),
        );
        let ids: Vec<u64> = shared_writable_mappings(d.path())
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(ids, vec![7]);
    }

    #[test]
    fn a_file_opened_write_only_for_appending_is_the_one_criu_records_no_size_for() {
        let f = |flags| RegFile {
            id: 1,
            name: "/job/train.log".into(),
            flags,
            size: None,
            remapped: false,
            ghost: None,
        };
        // O_WRONLY|O_APPEND (|O_CREAT|O_LARGEFILE): Python's mode "a", `>>`, `tee -a`.
        assert!(f(0o0102001).appended());
        assert!(f(0o2001).appended());
        // O_RDWR|O_APPEND ("a+"): CRIU records its size.
        assert!(!f(0o2002).appended());
        assert!(!f(0o1).appended() && !f(0o2000).appended());
    }

    #[test]
    fn lists_the_regular_files_with_their_sizes_flags_and_remaps() {
        let d = tempfile::tempdir().unwrap();
        let reg = |id: u64, flags: u64, name: &str, size: u64| {
            let mut r = varint_field(1, id);
            r.extend(varint_field(2, flags));
            r.extend(field(6, name.as_bytes()));
            r.extend(varint_field(8, size));
            let mut e = varint_field(1, FD_REG);
            e.extend(varint_field(2, id));
            e.extend(field(3, &r));
            e
        };
        let files = image(
            FILES_MAGIC,
            &[
                reg(5, 0o2101, "/job/rank0.log", 200),
                reg(6, 0, "/dev/shm/nccl-x", 4096),
            ],
        );
        std::fs::write(d.path().join("files.img"), files).unwrap();
        std::fs::write(
            d.path().join("remap-fpath.img"),
            image(
                REMAP_FPATH_MAGIC,
                &[[
                    varint_field(1, 6),
                    varint_field(2, 0x1c),
                    varint_field(3, 1),
                ]
                .concat()],
            ),
        )
        .unwrap();
        let got = regular_files(d.path()).unwrap();
        assert_eq!(
            got,
            vec![
                RegFile {
                    id: 5,
                    name: "/job/rank0.log".into(),
                    flags: 0o2101,
                    size: Some(200),
                    remapped: false,
                    ghost: None
                },
                RegFile {
                    id: 6,
                    name: "/dev/shm/nccl-x".into(),
                    flags: 0,
                    size: Some(4096),
                    remapped: true,
                    ghost: Some(0x1c)
                }
            ]
        );
        assert!(got[0].writable() && !got[1].writable());
    }

    #[test]
    fn a_ghost_left_by_a_killed_restore_is_found_and_nothing_older_or_else() {
        let d = tempfile::tempdir().unwrap();
        let name = d.path().join("nccl-left");
        let older_name = d.path().join("nccl-older");
        let kept = d.path().join("job.log");
        // Where a restore makes them: NAME.cr.REMAP_ID.ghost
        let ghost = d.path().join("nccl-left.cr.b.ghost");
        let older = d.path().join("nccl-older.cr.c.ghost");
        let reg = |id: u64, name: &Path, size: u64| {
            let mut r = varint_field(1, id);
            r.extend(field(6, name.to_str().unwrap().as_bytes()));
            r.extend(varint_field(8, size));
            let mut e = varint_field(1, FD_REG);
            e.extend(field(3, &r));
            e
        };
        std::fs::write(
            d.path().join("files.img"),
            image(
                FILES_MAGIC,
                &[
                    reg(1, &name, 64),
                    reg(2, &older_name, 64),
                    reg(3, &kept, 64),
                ],
            ),
        )
        .unwrap();
        let ghost_of = |id, remap| {
            [
                varint_field(1, id),
                varint_field(2, remap),
                varint_field(3, 1),
            ]
            .concat()
        };
        std::fs::write(
            d.path().join("remap-fpath.img"),
            image(REMAP_FPATH_MAGIC, &[ghost_of(1, 0xb), ghost_of(2, 0xc)]),
        )
        .unwrap();
        std::fs::write(&older, [0u8; 64]).unwrap();
        let since = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        std::fs::write(&ghost, [0u8; 64]).unwrap();
        std::fs::write(&kept, [0u8; 64]).unwrap();
        assert_eq!(
            leftover_ghosts(d.path(), since).unwrap(),
            vec![ghost.clone()]
        );
        std::fs::write(&ghost, [0u8; 65]).unwrap();
        assert!(
            leftover_ghosts(d.path(), since).unwrap().is_empty(),
            "larger than dumped: not the restore's"
        );
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
