//! `criu-gpu node checkpoint|drain|restore` as a library: the GPU workloads of a Kubernetes node
//! saved through the kubelet checkpoint API, the node drained, and the workloads restored
//! elsewhere from checkpoint images (OCI images CRI-O restores from, [`oci`], pushed to a
//! registry). A client of the kubelet, the API server and a registry over HTTPS ([`http`],
//! [`kube`], [`kubeconfig`], [`registry`]), with the TLS, YAML and tar code that takes; the
//! `criu-gpu` command only parses its arguments, installs its [`screen`] and checks archives
//! for `--check`.

pub mod checkpoint;
pub mod codec;
pub mod drain;
pub mod http;
pub mod human;
pub mod kube;
pub mod kubeconfig;
pub mod oci;
pub mod pods;
pub mod progress;
pub mod registry;
pub mod restore;
pub mod screen;
pub mod store;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use self::http::{Endpoint, HttpError, Tls};
use self::kube::{Api, Kubelet};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("{0}")]
    Config(String),
    #[error("{path}: {source}")]
    Store {
        path: String,
        source: std::io::Error,
    },
    /// Refused before anything was changed, or a step that cannot be done as asked.
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
}

impl NodeError {
    pub fn store(path: &Path, source: std::io::Error) -> NodeError {
        NodeError::Store {
            path: path.display().to_string(),
            source,
        }
    }
}

/// How to reach the kubelet and the API server.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub kubelet: String,
    pub kubelet_token_file: Option<PathBuf>,
    pub kubelet_ca: Option<PathBuf>,
    pub kubelet_insecure: bool,
    pub kubeconfig: Option<PathBuf>,
    /// The checkpoint timeout per container.
    pub timeout: Duration,
    /// What the command's environment says (`$KUBECONFIG`, `$KUBELET_TOKEN`, ...).
    pub env: kubeconfig::KubeEnv,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, NodeError> {
    std::fs::read(path).map_err(|e| NodeError::Config(format!("{what} {}: {e}", path.display())))
}

impl Access {
    pub fn api(&self) -> Result<Api, NodeError> {
        let c = kubeconfig::load(self.kubeconfig.as_deref(), &self.env)?;
        tracing::debug!("API server {} (credentials from {})", c.server, c.source);
        Ok(Api {
            ep: Endpoint::new(&c.server, &c.tls, c.token, Duration::from_secs(60))?,
        })
    }

    /// The kubelet, with `--token-file`, else `$KUBELET_TOKEN`, else the API server's
    /// credentials where a kubeconfig is found.
    pub fn kubelet(&self) -> Result<Kubelet, NodeError> {
        let mut tls = Tls {
            ca: self
                .kubelet_ca
                .as_deref()
                .map(|p| read(p, "--cacert"))
                .transpose()?,
            insecure: self.kubelet_insecure,
            client: None,
        };
        let token = match (&self.kubelet_token_file, &self.env.kubelet_token) {
            (Some(f), _) => Some(
                String::from_utf8_lossy(&read(f, "--token-file")?)
                    .trim()
                    .to_owned(),
            ),
            (None, Some(t)) if !t.is_empty() => Some(t.clone()),
            _ => match kubeconfig::load(self.kubeconfig.as_deref(), &self.env) {
                Ok(c) => {
                    tls.client = c.tls.client;
                    c.token
                }
                Err(_) => None,
            },
        };
        Ok(Kubelet {
            ep: Endpoint::new(&self.kubelet, &tls, token, Duration::from_secs(60))?,
            timeout: self.timeout,
        })
    }
}

/// One container's outcome, for the summary.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub ok: bool,
    /// The archive or image it went to.
    pub to: Option<String>,
    pub bytes: Option<u64>,
    pub error: Option<String>,
}

/// What a node operation reports at its end, as text or JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub operation: &'static str,
    pub dry_run: bool,
    pub ok: bool,
    pub containers: Vec<Outcome>,
    pub bytes: u64,
    pub seconds: f64,
    pub gb_per_s: f64,
    pub manifest: Option<String>,
    /// What was done besides (cordon, scale-downs, evictions), in order.
    pub steps: Vec<String>,
    pub error: Option<String>,
}

impl Summary {
    pub fn new(operation: &'static str, dry_run: bool) -> Summary {
        Summary {
            operation,
            dry_run,
            ok: true,
            containers: Vec::new(),
            bytes: 0,
            seconds: 0.0,
            gb_per_s: 0.0,
            manifest: None,
            steps: Vec::new(),
            error: None,
        }
    }

    /// Records a step and says it.
    pub fn step(&mut self, text: impl Into<String>, json: bool) {
        let text = text.into();
        if json {
            eprintln!("{text}");
        } else {
            crate::screen::line(&text);
        }
        self.steps.push(text);
    }

    pub fn timing(&mut self, bytes: u64, took: Duration) {
        self.bytes = bytes;
        self.seconds = (took.as_secs_f64() * 100.0).round() / 100.0;
        self.gb_per_s =
            ((bytes as f64 / 1e9 / took.as_secs_f64().max(1e-3)) * 1000.0).round() / 1000.0;
    }

    pub fn print(&self, json: bool) {
        if json {
            crate::screen::json(self);
            return;
        }
        let line = |t: String| crate::screen::line(t);
        line("----".into());
        if self.dry_run {
            line(format!("dry run: nothing was changed ({})", self.operation));
            return;
        }
        let done = self.containers.iter().filter(|c| c.ok).count();
        line(format!(
            "{}: {done} of {} done, {} in {:.1} s ({:.2} GB/s)",
            self.operation,
            self.containers.len(),
            human::bytes(self.bytes),
            self.seconds,
            self.gb_per_s
        ));
        for c in &self.containers {
            match (&c.error, &c.to) {
                (None, to) => line(format!(
                    "  {}/{}/{} -> {}",
                    c.namespace,
                    c.pod,
                    c.container,
                    to.as_deref().unwrap_or("-")
                )),
                (Some(e), _) => line(format!(
                    "  FAILED {}/{}/{}: {e}",
                    c.namespace, c.pod, c.container
                )),
            }
        }
        if let Some(m) = &self.manifest {
            line(format!("manifest: {m}"));
        }
    }
}
