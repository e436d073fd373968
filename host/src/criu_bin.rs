//! The CRIU binary this node runs: where it is and which version.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// CRIU's binary: `named` (the caller's $CRIU or option), then each directory of `search` (a
/// PATH), then where scripts/install-criu.sh puts it, then the distribution's.
pub fn find_criu(named: Option<PathBuf>, search: Option<&OsStr>) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = named.into_iter().collect();
    if let Some(path) = search {
        candidates.extend(std::env::split_paths(path).map(|d| d.join("criu")));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_binary_comes_before_the_search_path() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        for dir in [&a, &b] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("criu"), "").unwrap();
        }
        let search = std::env::join_paths([&a, &b]).unwrap();
        let named = d.path().join("named-criu");
        std::fs::write(&named, "").unwrap();
        assert_eq!(find_criu(Some(named.clone()), Some(&search)), Some(named));
        assert_eq!(find_criu(None, Some(&search)), Some(a.join("criu")));
        // A name that is no file is passed over, not returned.
        let gone = d.path().join("gone");
        assert_eq!(find_criu(Some(gone), Some(&search)), Some(a.join("criu")));
    }
}
