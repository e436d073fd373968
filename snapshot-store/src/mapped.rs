//! A file's content as memory, without copying it (images in tmpfs are already memory).

use std::fs::File;
use std::path::Path;

use crate::error::{io, Result};

pub struct Mapped {
    map: Option<memmap2::Mmap>,
}

impl Mapped {
    pub fn open(path: &Path) -> Result<Mapped> {
        let what = || format!("reading {}", path.display());
        let file = File::open(path).map_err(io(what()))?;
        let len = file.metadata().map_err(io(what()))?.len();
        if len == 0 {
            return Ok(Mapped { map: None });
        }
        // SAFETY: the mapping is read-only and private to this process; the image trees the
        // store reads are CRIU's output, which nothing changes while they are stored (a file
        // cut short meanwhile would end this process with SIGBUS, never wrong data stored).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(what()))?;
        Ok(Mapped { map: Some(map) })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// A file being written by several threads at once: large files through a shared mapping (a
/// tmpfs file takes pages that way at several GB/s from many threads, where `pwrite` holds
/// the file's lock for each write), small ones with `pwrite`.
pub struct Target {
    file: File,
    map: Option<memmap2::MmapRaw>,
}

impl Target {
    /// Smaller in tests, so that their files take both ways.
    const MAP_FROM: u64 = if cfg!(test) { 1 << 20 } else { 64 << 20 };

    pub fn new(file: File, size: u64) -> std::io::Result<Target> {
        let map = if size >= Self::MAP_FROM {
            Some(memmap2::MmapOptions::new().map_raw(&file)?)
        } else {
            None
        };
        Ok(Target { file, map })
    }

    /// Writes `data` at `offset`; callers write disjoint ranges inside the file's size.
    pub fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        let Some(map) = &self.map else {
            return std::os::unix::fs::FileExt::write_all_at(&self.file, data, offset);
        };
        let end = offset as usize + data.len();
        if end > map.len() {
            return Err(std::io::Error::other(format!(
                "a write of {} bytes at {offset} past the end of a file of {}",
                data.len(),
                map.len()
            )));
        }
        // SAFETY: the range lies inside the mapping (checked above), which lives as long as
        // `self`; the file was created by this process and sized before it was mapped, nothing
        // truncates it meanwhile, and the callers write disjoint ranges, so no two threads
        // touch the same bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                map.as_mut_ptr().add(offset as usize),
                data.len(),
            );
        }
        Ok(())
    }
}
