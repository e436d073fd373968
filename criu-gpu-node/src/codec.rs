//! How a checkpoint archive or an image layer is compressed, and its contents decompressed in
//! this process (a node needs no `zstd` or `gzip` program): the archive reader of `criu-gpu` and
//! the OCI layers of [`crate::oci`] both read through it.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

/// How a file is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Gzip,
    Zstd,
}

impl Codec {
    /// The compression of the file at `path`, by its first bytes.
    pub fn of(path: &Path) -> io::Result<Option<Codec>> {
        let mut magic = [0u8; 4];
        let n = File::open(path)?.read(&mut magic)?;
        Ok(match &magic[..n] {
            [0x1f, 0x8b, ..] => Some(Codec::Gzip),
            [0x28, 0xb5, 0x2f, 0xfd] => Some(Codec::Zstd),
            _ => None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::Gzip => "gzip",
            Codec::Zstd => "zstd",
        }
    }

    /// The decompressed contents of `file` (every gzip member or zstd frame, as `gzip -dc` and
    /// `zstd -dc` read them).
    pub fn decoder(self, file: File) -> io::Result<Box<dyn Read>> {
        Ok(match self {
            Codec::Gzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(file))),
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::new(file)?),
        })
    }
}
