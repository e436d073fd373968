//! The store of a node operation: the archives and `manifest.json`, which is rewritten
//! (atomically) every time an archive lands or fails, so a crash loses nothing recorded.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kube::Controller;
use crate::NodeError;

pub const MANIFEST: &str = "manifest.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    #[default]
    Pending,
    Checkpointing,
    Saved,
    Failed,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerRecord {
    pub name: String,
    pub status: Status,
    /// Where the kubelet wrote it, on the node.
    pub node_archive: Option<String>,
    /// The copy in the store (relative to the store).
    pub archive: Option<String>,
    pub bytes: Option<u64>,
    pub sha256: Option<String>,
    pub seconds: Option<f64>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The pod as a new object (see `pods::clean_pod`).
    pub spec: Value,
    /// Its controller, when it has one.
    pub controller: Option<Controller>,
    pub containers: Vec<ContainerRecord>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Manifest {
    pub version: u32,
    pub node: Option<String>,
    pub kubelet: String,
    pub created: String,
    pub updated: String,
    /// What the operation got to: checkpointing, checkpointed, draining, drained, failed.
    pub state: String,
    pub pods: Vec<PodRecord>,
    /// Controllers the drain scaled down; the restore scales them back.
    pub scaled_down: Vec<Controller>,
}

pub struct Store {
    pub dir: PathBuf,
    manifest: Mutex<Manifest>,
}

fn now() -> String {
    crate::human::rfc3339(std::time::SystemTime::now())
}

impl Store {
    pub fn create(dir: &Path, manifest: Manifest) -> Result<Store, NodeError> {
        std::fs::create_dir_all(dir).map_err(|e| NodeError::store(dir, e))?;
        let s = Store {
            dir: dir.to_path_buf(),
            manifest: Mutex::new(manifest),
        };
        s.update(|m| {
            m.version = 1;
            m.created = now();
        })?;
        Ok(s)
    }

    pub fn open(dir: &Path) -> Result<Store, NodeError> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read(&path).map_err(|e| NodeError::store(&path, e))?;
        let manifest = serde_json::from_slice(&text).map_err(|e| {
            NodeError::Failed(format!(
                "{}: not a manifest of criu-gpu ({e})",
                path.display()
            ))
        })?;
        Ok(Store {
            dir: dir.to_path_buf(),
            manifest: Mutex::new(manifest),
        })
    }

    pub fn snapshot(&self) -> Manifest {
        self.manifest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Changes the manifest and writes it out before returning.
    pub fn update(&self, f: impl FnOnce(&mut Manifest)) -> Result<(), NodeError> {
        let mut m = self.manifest.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut m);
        m.updated = now();
        let text = serde_json::to_vec_pretty(&*m).map_err(|e| NodeError::Failed(e.to_string()))?;
        let tmp = self.dir.join(format!(".{MANIFEST}.tmp"));
        let path = self.dir.join(MANIFEST);
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &text)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| NodeError::store(&path, e))
    }

    /// Changes one container's record.
    pub fn container(
        &self,
        ns: &str,
        pod: &str,
        name: &str,
        f: impl FnOnce(&mut ContainerRecord),
    ) -> Result<(), NodeError> {
        self.update(|m| {
            if let Some(c) = m
                .pods
                .iter_mut()
                .filter(|p| p.namespace == ns && p.name == pod)
                .flat_map(|p| p.containers.iter_mut())
                .find(|c| c.name == name)
            {
                f(c);
            }
        })
    }

    /// A path recorded in the manifest, as a path on this machine.
    pub fn resolve(&self, recorded: &str) -> PathBuf {
        let p = Path::new(recorded);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }
}
