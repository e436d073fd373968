//! A real NVIDIA machine the scenarios run on: the driver installed on this host, its GPUs as
//! NVML reports them, and CUDA applications built here with nvcc (scripts/gpu/containers/ct-app.cu,
//! which logs in the simulated application's protocol). Selected only by
//! `GPU_CKPT_MACHINE=nvidia` (see [`crate::scenario`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::{kill_trees, Machine};

/// The environment variable naming the repository whose CUDA sources are built (default: the
/// tree the test binary was built from).
pub const SOURCE_ENV: &str = "GPU_CKPT_SOURCE";

static SEQ: AtomicU32 = AtomicU32::new(0);

/// This host with its NVIDIA GPUs; every process started on it is killed on drop.
pub struct Nvidia {
    pub dir: PathBuf,
    apps: Vec<i32>,
}

impl Nvidia {
    /// A scratch directory on this host, after checking that NVML answers.
    pub fn start() -> Nvidia {
        let dir = std::env::temp_dir().join(format!(
            "gpu-ckpt-nvidia-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        ct_app();
        Nvidia {
            dir,
            apps: Vec::new(),
        }
    }

    /// Remembers a pid whose tree is killed at the end.
    pub fn adopt(&mut self, pid: i32) {
        self.apps.push(pid);
    }
}

impl Machine for Nvidia {
    /// Nothing selects another driver: the processes load the host's. The scratch directory is
    /// named so that the guardians of this machine's CRIU runs can be told apart
    /// ([`crate::criu::guardians`]). The plugin's settings file is the test's own, as on the
    /// simulation (absent unless a test writes it): never the host's /etc/criu/gpu-plugin.conf.
    fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "GPU_CKPT_MACHINE_DIR".into(),
                self.dir.display().to_string(),
            ),
            (
                "CRIU_GPU_CONFIG".into(),
                self.dir.join("gpu-plugin.conf").display().to_string(),
            ),
        ]
    }
    fn scratch(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Nvidia {
    fn drop(&mut self) {
        kill_trees(&self.apps);
        if std::env::var_os("KEEP_TEST_DIRS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// ct-app, built once per test process with nvcc (for this GPU's architecture where nvcc knows
/// it), into a directory shared by the test processes of this host.
pub fn ct_app() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build_ct_app).clone()
}

fn build_ct_app() -> PathBuf {
    let source = std::env::var(SOURCE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .join("scripts/gpu/containers/ct-app.cu");
    assert!(
        source.exists(),
        "{} is missing: set {SOURCE_ENV} to the repository's working tree",
        source.display()
    );
    let dir = std::env::temp_dir().join("gpu-ckpt-nvidia-apps");
    fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("ct-app");
    // Built under a name of its own, then renamed: concurrent test processes never run a
    // half-written binary.
    let part = dir.join(format!("ct-app.{}", std::process::id()));
    let nvcc = |arch: &[&str]| {
        Command::new("nvcc")
            .args(["-O2"])
            .args(arch)
            .arg("-o")
            .arg(&part)
            .arg(&source)
            .output()
    };
    let out = nvcc(&["-arch=native"])
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(|| nvcc(&[]), Ok)
        .unwrap_or_else(|e| panic!("nvcc not found ({e}): the NVIDIA machine builds ct-app.cu"));
    assert!(
        out.status.success(),
        "nvcc {}: {}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    fs::rename(&part, &bin).unwrap();
    bin
}
