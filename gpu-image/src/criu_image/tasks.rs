//! What the tasks of an image mapped, read from CRIU's pstree, mm and core images: the CUDA
//! driver (what CRIU's C cuda_plugin checkpointed; it records nothing of its own), and files
//! mapped shared and writable.

use std::path::Path;

use super::files::{FD_REG, FILES_MAGIC};
use super::wire::{bytes_field, varint_field, Image, Value, MAX_IMAGE};
use super::CriuImageError;

pub(super) const PSTREE_MAGIC: u32 = 0x5027_3030;
pub(super) const CORE_MAGIC: u32 = 0x5505_3847;
pub(super) const MM_MAGIC: u32 = 0x5749_2820;
/// vma_entry.status bits of a file mapping (criu/include/image.h).
pub(super) const VMA_FILE_PRIVATE: u64 = 1 << 6;
pub(super) const VMA_FILE_SHARED: u64 = 1 << 7;
/// PROT_WRITE (vma_entry.prot holds mmap's prot bits).
const PROT_WRITE: u64 = 2;

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
