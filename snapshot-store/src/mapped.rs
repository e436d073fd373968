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
