//! A simulated AMD machine: the simulated KFD's root with a topology, and ROCm-like apps on it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use amd_kfd::topology::Topology;

use crate::{signal, start_app, App, Machine};

static SEQ: AtomicU32 = AtomicU32::new(0);

pub struct AmdSim {
    pub dir: PathBuf,
    pub root: PathBuf,
    apps: Vec<i32>,
}

impl AmdSim {
    pub fn new(topology: &Topology) -> AmdSim {
        let dir = std::env::temp_dir().join(format!(
            "gpu-ckpt-amd-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.join("kfd");
        topology.write(&root.join("topology")).unwrap();
        AmdSim {
            dir,
            root,
            apps: Vec::new(),
        }
    }

    /// Replaces the machine's GPUs (another machine, as far as restore can tell).
    pub fn swap_topology(&self, topology: &Topology) {
        let t = self.root.join("topology");
        std::fs::remove_dir_all(&t).unwrap();
        topology.write(&t).unwrap();
    }

    pub fn app(&mut self, name: &str, args: &[&str]) -> App {
        let log = self.dir.join(format!("{name}.log"));
        let mut all = vec!["--root", self.root.to_str().unwrap()];
        all.extend_from_slice(args);
        let app = start_app("amd-kfd-sim-app", &log, &all, Vec::new());
        self.apps.push(app.pid);
        app
    }

    pub fn adopt(&mut self, pid: i32) {
        self.apps.push(pid);
    }

    /// Whether the KFD has the GPU queues of `pid` paused (a dump that did not end).
    pub fn paused(&self, pid: i32) -> bool {
        amd_kfd::device::sim::SimKfd::new(self.root.clone())
            .load(pid as u32)
            .is_some_and(|p| p.paused)
    }

    pub fn image_of(dir: &Path) -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("amdgpu-kfd-"))
            })
    }
}

impl Machine for AmdSim {
    fn env(&self) -> Vec<(String, String)> {
        vec![(
            amd_kfd::device::sim::ROOT_ENV.into(),
            self.root.display().to_string(),
        )]
    }
    fn scratch(&self) -> &Path {
        &self.dir
    }
}

impl Drop for AmdSim {
    fn drop(&mut self) {
        for &pid in &self.apps {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
        }
        if std::env::var_os("KEEP_TEST_DIRS").is_none() {
            let _ = Command::new("rm").arg("-rf").arg(&self.dir).status();
        }
    }
}
