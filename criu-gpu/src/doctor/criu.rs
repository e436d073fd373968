//! CRIU and its plugin directory: a CRIU with the device hooks, our plugin where it looks, no
//! older CRIU or other GPU plugin reading the same directory.

use std::path::{Path, PathBuf};

use super::{ok, problem, Finding, Status};
use criu_gpu_host::criu_bin;

/// The plugin directory CRIU uses: a `lib` line of its settings, else its default.
fn plugin_dir() -> (PathBuf, String) {
    for conf in ["/etc/criu/default.conf", "/etc/criu/runc.conf"] {
        if let Ok(text) = std::fs::read_to_string(conf) {
            if let Some(dir) = text.lines().find_map(|l| l.trim().strip_prefix("lib ")) {
                return (PathBuf::from(dir.trim()), format!("from {conf}"));
            }
        }
    }
    (PathBuf::from("/usr/lib/criu"), "CRIU's default".into())
}

pub(super) fn criu() -> Vec<Finding> {
    let Some(bin) = crate::find_criu() else {
        return vec![problem(
            "criu",
            Status::Fail,
            "criu not found (PATH, /usr/local/sbin, /usr/sbin)",
            "sudo scripts/install.sh (installs CRIU 4.2.1 when the system's is older)",
        )];
    };
    let (dir, why) = plugin_dir();
    let mut f = vec![criu_version(&bin), plugin(&dir, &why)];
    f.extend(older_criu_reading(&dir, &bin));
    f.extend(other_gpu_plugins(&dir));
    f
}

/// Whether the CRIU found has the device hooks the plugin needs (4.0), and is the tested 4.2.
fn criu_version(bin: &Path) -> Finding {
    match criu_bin::version_of(bin) {
        None => problem(
            "criu",
            Status::Fail,
            format!("{} does not answer --version", bin.display()),
            "reinstall CRIU: sudo scripts/install-criu.sh",
        ),
        Some((major, _, v)) if major < 4 => problem(
            "criu",
            Status::Fail,
            format!(
                "{} is CRIU {v}: it has no device hooks for GPU plugins",
                bin.display()
            ),
            "install CRIU 4.2 or later: sudo scripts/install-criu.sh (puts it in /usr/local/sbin)",
        ),
        Some((4, minor, v)) if minor < 2 => problem(
            "criu",
            Status::Warn,
            format!("{} is CRIU {v}", bin.display()),
            "CRIU 4.2 or later is what this project tests: sudo scripts/install-criu.sh",
        ),
        Some((_, _, v)) => ok("criu", format!("{} (CRIU {v})", bin.display())),
    }
}

/// The plugin in CRIU's plugin directory, and that it is one (its descriptor symbol).
fn plugin(dir: &Path, why: &str) -> Finding {
    let plugin = dir.join("criu_gpu_plugin.so");
    match std::fs::read(&plugin) {
        Err(e) => problem(
            "plugin",
            Status::Fail,
            format!(
                "{}: {e} (plugin directory {}, {why})",
                plugin.display(),
                dir.display()
            ),
            "sudo scripts/install.sh installs it there",
        ),
        Ok(elf) if !contains(&elf, b"CR_PLUGIN_DESC") => problem(
            "plugin",
            Status::Fail,
            format!(
                "{} is not a CRIU plugin (no CR_PLUGIN_DESC symbol)",
                plugin.display()
            ),
            "reinstall it: sudo scripts/install.sh",
        ),
        Ok(_) => ok("plugin", format!("{} ({why})", plugin.display())),
    }
}

/// A distribution's older CRIU reads the same plugin directory: it refuses a plugin with more
/// hooks than it knows ("Corrupted plugin"), and with it every command.
fn older_criu_reading(dir: &Path, bin: &Path) -> Vec<Finding> {
    let mut f = Vec::new();
    for c in ["/usr/sbin/criu", "/usr/bin/criu"].map(PathBuf::from) {
        if c == bin {
            continue;
        }
        if let Some((_, _, v)) = criu_bin::version_of(&c).filter(|(m, _, _)| *m < 4) {
            f.push(problem(
                "criu",
                Status::Warn,
                format!(
                    "{} is CRIU {v}, older than 4.0: it loads {} too and fails on \
                     criu_gpu_plugin.so (\"Corrupted plugin\")",
                    c.display(),
                    dir.display()
                ),
                format!(
                    "remove that package, or give it another plugin directory (CRIU_LIBS_DIR); \
                     {} is the one to use",
                    bin.display()
                ),
            ));
        }
    }
    f
}

/// Other GPU plugins beside ours: CRIU offers a GPU process to the first that takes it.
fn other_gpu_plugins(dir: &Path) -> Vec<Finding> {
    let mut f = Vec::new();
    for other in ["cuda_plugin.so", "amdgpu_plugin.so"] {
        if dir.join(other).exists() {
            f.push(problem(
                "plugin",
                Status::Warn,
                format!(
                    "{} is installed too: CRIU offers GPU processes to plugins in directory order",
                    dir.join(other).display()
                ),
                format!(
                    "remove {} so that criu_gpu handles every GPU process",
                    dir.join(other).display()
                ),
            ));
        }
    }
    f
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
