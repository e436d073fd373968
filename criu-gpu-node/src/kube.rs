//! The two Kubernetes servers a node operation talks to: the node's kubelet (pod list,
//! checkpoint API) and the API server (cordon, controllers, eviction, pod creation).

use std::time::Duration;

use serde_json::{json, Value};

use crate::http::{Endpoint, HttpError};
use crate::NodeError;

fn parse(bytes: &[u8], what: &str) -> Result<Value, NodeError> {
    serde_json::from_slice(bytes)
        .map_err(|e| NodeError::Failed(format!("{what}: the reply is not JSON ({e})")))
}

/// Percent-encodes a query value (selectors hold `=` and `,`).
fn query(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub struct Kubelet {
    pub ep: Endpoint,
    /// The checkpoint timeout passed to the kubelet (it bounds CRIU's run there).
    pub timeout: Duration,
}

impl Kubelet {
    fn explain(e: HttpError) -> NodeError {
        let e = match e.status() {
            Some(401 | 403) => e.hint("the credentials need the nodes/checkpoint and nodes/proxy permissions on this node"),
            Some(404) => e.hint("is the kubelet's ContainerCheckpoint feature on? (default since Kubernetes 1.30)"),
            _ => e,
        };
        NodeError::Http(e)
    }

    /// The pods the kubelet runs.
    pub fn pods(&self) -> Result<Vec<Value>, NodeError> {
        let body = self.ep.call("GET", "/pods", None).map_err(Self::explain)?;
        Ok(parse(&body, "kubelet /pods")?["items"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// Has the runtime checkpoint one container; returns the archive's path on the node.
    pub fn checkpoint(&self, ns: &str, pod: &str, container: &str) -> Result<String, NodeError> {
        let secs = self.timeout.as_secs();
        let path = format!("/checkpoint/{ns}/{pod}/{container}?timeout={secs}");
        // The kubelet's own limit plus a margin for it to answer.
        let ep = self.ep.with_timeout(self.timeout + Duration::from_secs(30));
        let body = ep.call("POST", &path, None).map_err(Self::explain)?;
        let reply = parse(&body, "kubelet checkpoint")?;
        reply["items"][0]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| {
                NodeError::Failed(format!(
                    "the kubelet returned no checkpoint archive for {ns}/{pod}/{container}"
                ))
            })
    }
}

/// A workload controller that owns pods.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Controller {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Replicas before the drain scaled it down.
    pub replicas: i64,
    /// Its label selector (matchLabels), `k=v,k=v`.
    #[serde(default)]
    pub selector: String,
}

impl Controller {
    pub fn label(&self) -> String {
        format!(
            "{} {}/{}",
            self.kind.to_lowercase(),
            self.namespace,
            self.name
        )
    }

    /// The API path of a kind this tool can scale.
    fn path(&self) -> Option<String> {
        let plural = match self.kind.as_str() {
            "Deployment" => "deployments",
            "StatefulSet" => "statefulsets",
            "ReplicaSet" => "replicasets",
            _ => return None,
        };
        Some(format!(
            "/apis/apps/v1/namespaces/{}/{plural}/{}",
            self.namespace, self.name
        ))
    }
}

/// The owner that controls a pod, as (kind, name).
pub fn controller_ref(pod: &Value) -> Option<(String, String)> {
    pod["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"].as_bool() == Some(true))
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or("?").to_owned(),
                o["name"].as_str().unwrap_or("?").to_owned(),
            )
        })
}

pub struct Api {
    pub ep: Endpoint,
}

impl Api {
    fn get(&self, path: &str) -> Result<Value, NodeError> {
        parse(&self.ep.call("GET", path, None)?, path)
    }

    fn patch(&self, path: &str, body: Value) -> Result<(), NodeError> {
        self.ep.call(
            "PATCH",
            path,
            Some((
                "application/merge-patch+json",
                body.to_string().into_bytes(),
            )),
        )?;
        Ok(())
    }

    /// Whether the node is cordoned.
    pub fn unschedulable(&self, node: &str) -> Result<bool, NodeError> {
        let n = self
            .get(&format!("/api/v1/nodes/{node}"))
            .map_err(|e| match e {
                NodeError::Http(h) if h.status() == Some(404) => {
                    NodeError::Refused(format!("the API server has no node {node:?}"))
                }
                e => e,
            })?;
        Ok(n["spec"]["unschedulable"].as_bool().unwrap_or(false))
    }

    pub fn set_unschedulable(&self, node: &str, on: bool) -> Result<(), NodeError> {
        self.patch(
            &format!("/api/v1/nodes/{node}"),
            json!({"spec": {"unschedulable": on}}),
        )
    }

    pub fn pods_on(&self, node: &str) -> Result<Vec<Value>, NodeError> {
        let v = self.get(&format!(
            "/api/v1/pods?fieldSelector={}",
            query(&format!("spec.nodeName={node}"))
        ))?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// The controller at the top of a pod's owner chain (a ReplicaSet's Deployment).
    pub fn controller_of(&self, pod: &Value) -> Result<Option<Controller>, NodeError> {
        let Some((mut kind, mut name)) = controller_ref(pod) else {
            return Ok(None);
        };
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        if kind == "ReplicaSet" {
            let rs = self.get(&format!("/apis/apps/v1/namespaces/{ns}/replicasets/{name}"))?;
            if let Some((k, n)) = controller_ref(&rs) {
                (kind, name) = (k, n);
            }
        }
        let mut c = Controller {
            kind,
            namespace: ns,
            name,
            replicas: 0,
            selector: String::new(),
        };
        if let Some(path) = c.path() {
            let obj = self.get(&path)?;
            c.replicas = obj["spec"]["replicas"].as_i64().unwrap_or(1);
            c.selector = obj["spec"]["selector"]["matchLabels"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
        }
        Ok(Some(c))
    }

    /// True for kinds `scale` handles.
    pub fn can_scale(c: &Controller) -> bool {
        c.path().is_some()
    }

    /// The nodes of a controller's pods.
    pub fn nodes_of(&self, c: &Controller) -> Result<Vec<String>, NodeError> {
        let v = self.get(&format!(
            "/api/v1/namespaces/{}/pods?labelSelector={}",
            c.namespace,
            query(&c.selector)
        ))?;
        Ok(v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
            .collect())
    }

    pub fn scale(&self, c: &Controller, replicas: i64) -> Result<(), NodeError> {
        let path = c.path().ok_or_else(|| {
            NodeError::Refused(format!("{} cannot be scaled by criu-gpu", c.label()))
        })?;
        self.patch(
            &format!("{path}/scale"),
            json!({"spec": {"replicas": replicas}}),
        )
    }

    /// Asks for a pod's eviction. Ok(false): a disruption budget refuses it for now.
    pub fn evict(&self, ns: &str, name: &str) -> Result<bool, NodeError> {
        let body = json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        });
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}/eviction");
        match self.ep.call(
            "POST",
            &path,
            Some(("application/json", body.to_string().into_bytes())),
        ) {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(true),
            Err(e) if e.status() == Some(429) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the pod with this uid still exists.
    pub fn pod_exists(&self, ns: &str, name: &str, uid: &str) -> Result<bool, NodeError> {
        match self.get(&format!("/api/v1/namespaces/{ns}/pods/{name}")) {
            Ok(p) => Ok(uid.is_empty() || p["metadata"]["uid"].as_str() == Some(uid)),
            Err(NodeError::Http(e)) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn create_pod(&self, ns: &str, pod: &Value) -> Result<(), NodeError> {
        let path = format!("/api/v1/namespaces/{ns}/pods");
        match self.ep.call("POST", &path, Some(("application/json", pod.to_string().into_bytes()))) {
            Ok(_) => Ok(()),
            Err(e) if e.status() == Some(409) => Err(NodeError::Refused(format!(
                "a pod {ns}/{} already exists (re-created by a controller, or restored before?): delete it first, or leave this pod out",
                pod["metadata"]["name"].as_str().unwrap_or("?")
            ))),
            Err(e) => Err(e.into()),
        }
    }
}
