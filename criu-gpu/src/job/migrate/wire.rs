//! What the two `criu-gpu`s of a move say to each other on the control connection: one line of
//! JSON per message, and after [`Msg::Images`] the image files as a tar stream of the size it
//! announced. The pages never pass here: they go over the second connection, CRIU's own page
//! server protocol between the dumping CRIU and the receiving lazy-pages daemon.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::preflight::{Preflight, Verdict};
use super::report::Landed;

/// Bumped when a message changes: both sides must speak the same.
pub const VERSION: u32 = 1;

/// Which of the two connections of a move this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The messages below.
    Control,
    /// CRIU's page server protocol, handed to CRIU on both sides (`--ps-socket`).
    Pages,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Msg {
    /// The first line on each connection; `id` ties the two connections of one move.
    Hello {
        version: u32,
        role: Role,
        id: String,
    },
    /// The sender's job and what it needs of the receiver, before anything is frozen.
    Preflight(Box<Preflight>),
    /// The receiver's answer to the preflight.
    Verdict(Verdict),
    /// The image files follow, a tar stream of `bytes` bytes (all but the pages, which follow
    /// CRIU's lazy way).
    Images { bytes: u64 },
    /// The receiver has the images and its CRIU is restoring.
    Restoring,
    /// The receiver's CRIU ended: the tree runs there, or nothing of it does.
    Landed(Box<Landed>),
    /// The sender gave up before it sent the images (its dump failed): nothing comes.
    GaveUp { why: String },
}

/// One side of the control connection.
pub struct Wire {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Wire {
    pub fn new(s: TcpStream) -> std::io::Result<Wire> {
        Ok(Wire {
            writer: s.try_clone()?,
            reader: BufReader::new(s),
        })
    }

    /// Bounds each wait for the peer's next bytes (`None`: only the connection's stall bound).
    pub fn read_limit(&self, limit: Option<std::time::Duration>) -> std::io::Result<()> {
        super::net::read_limit(&self.writer, limit)
    }

    pub fn send(&mut self, m: &Msg) -> std::io::Result<()> {
        let mut line = serde_json::to_string(m).map_err(std::io::Error::other)?;
        line.push('\n');
        self.writer.write_all(line.as_bytes())
    }

    /// The next message; an error when the peer went away or said something unreadable.
    pub fn recv(&mut self) -> std::io::Result<Msg> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the other side closed the connection",
            ));
        }
        serde_json::from_str(&line).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("unreadable message {:?}: {e}", line.trim_end()),
            )
        })
    }

    /// Sends the files of `dir` (not its subdirectories, nor this side's logs) as
    /// [`Msg::Images`] and a tar stream.
    pub fn send_dir(&mut self, dir: &Path) -> std::io::Result<u64> {
        let mut tar = tar::Builder::new(Vec::new());
        let mut names: Vec<_> = std::fs::read_dir(dir)?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name())
            .filter(|n| !n.to_string_lossy().ends_with(".log"))
            .collect();
        names.sort();
        for name in names {
            tar.append_path_with_name(dir.join(&name), &name)?;
        }
        let bytes = tar.into_inner()?;
        self.send(&Msg::Images {
            bytes: bytes.len() as u64,
        })?;
        self.writer.write_all(&bytes)?;
        Ok(bytes.len() as u64)
    }

    /// After [`Msg::Images`]: unpacks its `bytes` of tar into `dir`, plain files only.
    pub fn recv_dir(&mut self, bytes: u64, dir: &Path) -> std::io::Result<usize> {
        let mut archive = tar::Archive::new((&mut self.reader).take(bytes));
        let mut files = 0;
        for entry in archive.entries()? {
            let mut entry = entry?;
            let name = entry.path()?.into_owned();
            let plain = name.components().count() == 1
                && entry.header().entry_type() == tar::EntryType::Regular;
            if !plain {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} is no plain file of an image directory", name.display()),
                ));
            }
            entry.unpack(dir.join(&name))?;
            files += 1;
        }
        // The archive's end blocks: the next message starts after them.
        std::io::copy(&mut archive.into_inner(), &mut std::io::sink())?;
        Ok(files)
    }
}
