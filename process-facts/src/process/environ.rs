//! What a process was started with: its environment, and files as its own root file system shows
//! them (a container's `/etc` is not the host's).

use std::path::{Path, PathBuf};

/// The environment the process was started with (`/proc/PID/environ`): later `setenv` calls
/// inside it are not seen, which is what settings read at start-up need.
pub fn environ(pid: i32) -> std::io::Result<Vec<(String, String)>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ"))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect())
}

/// `path` (absolute) inside the process's root file system.
pub fn in_root(pid: i32, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    Path::new(&format!("/proc/{pid}/root")).join(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_environment() {
        let env = environ(std::process::id() as i32).unwrap();
        assert!(env.iter().any(|(k, _)| k == "PATH"), "{env:?}");
        assert_eq!(
            in_root(7, Path::new("/etc/nccl.conf")),
            PathBuf::from("/proc/7/root/etc/nccl.conf")
        );
    }
}
