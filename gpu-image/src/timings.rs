//! The plugin's phase timings as data: what each GPU phase of a dump or a restore took, written
//! by the plugin at its `exit` (a dump's beside its record in the image directory, a restore's
//! in CRIU's work directory: a restore leaves the images as they were), read by `criu-gpu
//! inspect --json` and by the benchmarks (which must not depend on the wording of log lines).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::record::{self, RecordError};

pub const FORMAT: &str = "criu-gpu-timings";
pub const VERSION: u32 = 1;

/// The files of the dump's timings (image directory) and the restore's (work directory).
pub const FILES: [&str; 2] = ["gpu-timings-dump.json", "gpu-timings-restore.json"];

/// The file of one command's timings.
pub fn file(command: Command) -> &'static str {
    match command {
        Command::Dump => FILES[0],
        Command::Restore => FILES[1],
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Command {
    Dump,
    Restore,
}

impl Command {
    /// As the file and its JSON name it.
    pub fn name(self) -> &'static str {
        match self {
            Command::Dump => "dump",
            Command::Restore => "restore",
        }
    }
}

/// A named phase: `lock`, `checkpoint`, `digests` (dump); `verify`, `restore` (restore).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub seconds: f64,
    pub processes: usize,
    /// Device memory (checkpoint, restore) or image bytes (digests, verify).
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub command: Command,
    /// Whether CRIU reported the command successful.
    pub success: bool,
    pub phases: Vec<Phase>,
    /// Time spent inside the plugin's hooks, all of them.
    pub hook_seconds: f64,
    pub hook_calls: u64,
}

impl Timings {
    /// The phase named `name`, if the command got that far.
    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }
}

/// Writes `t` into `dir`; the file's path.
pub fn write(dir: &Path, t: &Timings) -> Result<PathBuf, RecordError> {
    record::write(dir, file(t.command), FORMAT, VERSION, t)?;
    Ok(dir.join(file(t.command)))
}

/// `Ok(None)` when the command wrote none (no GPU work, or another plugin).
pub fn read(dir: &Path, command: Command) -> Result<Option<Timings>, RecordError> {
    record::read(dir, file(command), FORMAT, VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_are_read_back_as_written() {
        let d = tempfile::tempdir().unwrap();
        let t = Timings {
            command: Command::Restore,
            success: true,
            phases: vec![Phase {
                name: "restore".into(),
                seconds: 1.25,
                processes: 2,
                bytes: 1 << 30,
            }],
            hook_seconds: 1.5,
            hook_calls: 9,
        };
        write(d.path(), &t).unwrap();
        assert_eq!(read(d.path(), Command::Restore).unwrap(), Some(t));
        assert_eq!(read(d.path(), Command::Dump).unwrap(), None);
    }
}
