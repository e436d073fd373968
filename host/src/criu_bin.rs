//! The CRIU binary this node runs: where it is and which version.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// CRIU's binary: $CRIU, then PATH, then where scripts/install-criu.sh puts it.
pub fn find_criu() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("CRIU")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("criu")));
    }
    candidates.extend(["/usr/local/sbin/criu", "/usr/sbin/criu"].map(PathBuf::from));
    candidates.into_iter().find(|p| p.is_file())
}

pub fn version_of(criu: &Path) -> Option<(u32, u32, String)> {
    let out = Command::new(criu).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))?
        .trim()
        .to_owned();
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    Some((parts.next()?, parts.next().unwrap_or(0), v))
}

/// Whether the CRIU at `criu` has `feature`: `criu check --feature FEATURE`. Without
/// CRIU_KILL_AT (the project's CRIU kills itself at a chosen instant, patch 0011; the tests aim
/// it at the dump or restore): a probe killed half-way would leave the child it forked stopped.
pub fn has_feature(criu: &Path, feature: &str) -> bool {
    Command::new(criu)
        .args(["check", "--feature", feature])
        .env_remove("CRIU_KILL_AT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
