//! The regular files of an image as CRIU restores them (their sizes, flags, remaps), and the
//! unlinked ones a killed restore left at their paths.

use std::path::Path;

use super::wire::{bytes_field, varint_field, Image, MAX_IMAGE};
use super::CriuImageError;

pub(super) const FILES_MAGIC: u32 = 0x5630_3138;
pub(super) const REMAP_FPATH_MAGIC: u32 = 0x5913_3954;
/// O_WRONLY, O_APPEND and the access mode's mask (reg_file_entry.flags holds open's flags).
const O_WRONLY: u64 = 1;
const O_ACCMODE: u64 = 3;
const O_APPEND: u64 = 0o2000;
/// fd_types.REG (criu/images/fdinfo.proto).
pub(super) const FD_REG: u64 = 1;

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
