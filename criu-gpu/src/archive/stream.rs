//! Tar streams of checkpoints: plain files, or gzip or zstd streams decompressed in this process
//! (a node needs no `zstd` program to read Podman's default `.tar.zst`); contents nobody reads are
//! skipped, by seeking where the source can and by reading past them where not.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::Path;

use super::{io_err, ArchiveError};

pub use criu_gpu_node::codec::Codec;

/// A tar source. Contents of entries nobody reads are skipped: by seeking in plain files, by
/// reading past them in pipes and nested tars ([`Forward`]).
pub trait Source: Read + Seek {}
impl<T: Read + Seek> Source for T {}
pub(super) type Tar<'a> = tar::Archive<Box<dyn Source + 'a>>;

/// A stream that can only "seek" forwards, by reading and dropping bytes.
pub(super) struct Forward<R> {
    pub(super) inner: R,
    pub(super) pos: u64,
}

impl<R: Read> Read for Forward<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read> Seek for Forward<R> {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let target = match to {
            io::SeekFrom::Start(p) => Some(p),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            io::SeekFrom::End(_) => None,
        };
        match target {
            Some(t) if t >= self.pos => {
                let want = t - self.pos;
                let skipped = io::copy(&mut (&mut *self).take(want), &mut io::sink())?;
                if skipped < want {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                Ok(self.pos)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a stream cannot seek backwards",
            )),
        }
    }
}

/// Runs `f` over `path` read as a tar, decompressed when compressed.
pub(super) fn with_tar<T>(
    path: &Path,
    f: impl FnOnce(&mut Tar<'_>) -> io::Result<T>,
) -> Result<T, ArchiveError> {
    let bad = |e: io::Error| ArchiveError::BadImage {
        path: path.display().to_string(),
        why: format!("not a readable tar archive ({e})"),
    };
    let file = File::open(path).map_err(io_err(path))?;
    let source: Box<dyn Source> = match Codec::of(path).map_err(io_err(path))? {
        None => Box::new(file),
        Some(codec) => {
            let inner = codec.decoder(file).map_err(|e| ArchiveError::BadImage {
                path: path.display().to_string(),
                why: format!("not a readable {} stream ({e})", codec.name()),
            })?;
            Box::new(Forward { inner, pos: 0 })
        }
    };
    f(&mut tar::Archive::new(source)).map_err(bad)
}
