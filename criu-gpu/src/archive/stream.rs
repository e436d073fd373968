//! Tar streams of checkpoints: plain files, or through `gzip -dc` / `zstd -dc`; contents nobody
//! reads are skipped, by seeking where the source can and by reading past them where not.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::{io_err, ArchiveError};

/// The compression of a file, by its first bytes.
fn codec(path: &Path) -> Result<Option<(&'static str, &'static str)>, ArchiveError> {
    let mut magic = [0u8; 4];
    let mut f = File::open(path).map_err(io_err(path))?;
    let n = f.read(&mut magic).map_err(io_err(path))?;
    Ok(match &magic[..n] {
        [0x1f, 0x8b, ..] => Some(("gzip", "gzip")),
        [0x28, 0xb5, 0x2f, 0xfd] => Some(("zstd", "zstd")),
        _ => None,
    })
}

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

/// Runs `f` over `path` read as a tar, through `gzip -dc` or `zstd -dc` when compressed.
pub(super) fn with_tar<T>(
    path: &Path,
    f: impl FnOnce(&mut Tar<'_>) -> io::Result<T>,
) -> Result<T, ArchiveError> {
    let wrap = |e: io::Error| ArchiveError::BadImage {
        path: path.display().to_string(),
        why: format!("not a readable tar archive ({e})"),
    };
    match codec(path)? {
        None => {
            let file = File::open(path).map_err(io_err(path))?;
            f(&mut tar::Archive::new(Box::new(file) as Box<dyn Source>)).map_err(wrap)
        }
        Some((codec, tool)) => {
            let mut child = Decompressor::spawn(path, codec, tool)?;
            let stdout = child.0.stdout.take().expect("piped stdout");
            let source = Forward {
                inner: stdout,
                pos: 0,
            };
            let result =
                f(&mut tar::Archive::new(Box::new(source) as Box<dyn Source>)).map_err(wrap);
            child.finish(path, result)
        }
    }
}

/// `gzip -dc FILE` or `zstd -dcq FILE`, killed if the reader stops early.
struct Decompressor(Child);

impl Decompressor {
    fn spawn(
        path: &Path,
        codec: &'static str,
        tool: &'static str,
    ) -> Result<Decompressor, ArchiveError> {
        let args: &[&str] = if tool == "zstd" { &["-dcq"] } else { &["-dc"] };
        Command::new(tool)
            .args(args)
            .arg(path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map(Decompressor)
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => ArchiveError::NoDecompressor {
                    path: path.display().to_string(),
                    codec,
                    tool,
                },
                _ => io_err(path)(e),
            })
    }

    fn finish<T>(
        mut self,
        path: &Path,
        result: Result<T, ArchiveError>,
    ) -> Result<T, ArchiveError> {
        let _ = self.0.kill();
        let out = self.0.wait_with_output();
        match (result, out) {
            (Ok(v), _) => Ok(v),
            (Err(e), Ok(out)) if !out.stderr.is_empty() => Err(ArchiveError::BadImage {
                path: path.display().to_string(),
                why: format!("{e}; {}", String::from_utf8_lossy(&out.stderr).trim()),
            }),
            (Err(e), _) => Err(e),
        }
    }
}
