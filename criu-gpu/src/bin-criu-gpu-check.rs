//! `criu-gpu-check PATH`: the old name of `criu-gpu check PATH`, kept for scripts that use it.
//! Runs the `criu-gpu` installed next to this binary (or found in PATH) with the same
//! arguments; the output and exit statuses are criu-gpu's (0: can restore, 1: cannot and why,
//! 2: PATH unreadable).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("criu-gpu")))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| PathBuf::from("criu-gpu"));
    let err = Command::new(&program)
        .arg("check")
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!(
        "criu-gpu-check: cannot run {} ({err}): install criu-gpu next to it (scripts/install.sh does)",
        program.display()
    );
    ExitCode::from(2)
}
