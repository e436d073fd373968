//! Which containers of a node hold GPUs, and a pod as a new object for its restore.

use serde_json::{json, Value};

/// Extended resources that mean "a GPU".
pub const GPU_RESOURCES: [&str; 3] = ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915"];

/// A running container that asks for a GPU.
#[derive(Debug, Clone)]
pub struct GpuContainer {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

pub fn ns_name(pod: &Value) -> (String, String) {
    let m = &pod["metadata"];
    (
        m["namespace"].as_str().unwrap_or("default").to_owned(),
        m["name"].as_str().unwrap_or("?").to_owned(),
    )
}

/// Running containers of running pods that request or limit one of `resources`.
pub fn gpu_containers(
    pods: &[Value],
    namespace: Option<&str>,
    resources: &[String],
) -> Vec<GpuContainer> {
    let mut out = Vec::new();
    for pod in pods {
        let (ns, name) = ns_name(pod);
        if namespace.is_some_and(|n| n != ns) || pod["status"]["phase"].as_str() != Some("Running")
        {
            continue;
        }
        let running = |c: &str| {
            pod["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["name"].as_str() == Some(c) && s["state"].get("running").is_some())
        };
        for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
            let cname = c["name"].as_str().unwrap_or_default();
            let wants = resources.iter().any(|r| {
                ["requests", "limits"].iter().any(|k| {
                    let v = &c["resources"][*k][r.as_str()];
                    v.as_str().map_or_else(
                        || v.as_i64().is_some_and(|n| n > 0),
                        |s| !s.is_empty() && s != "0",
                    )
                })
            });
            if wants && running(cname) {
                out.push(GpuContainer {
                    namespace: ns.clone(),
                    pod: name.clone(),
                    container: cname.to_owned(),
                });
            }
        }
    }
    out
}

/// The pod as a new object: name, labels, annotations and spec, without what the cluster
/// filled in (node, owner, uid, status). Its labels stay, so a controller scaled back up
/// adopts it instead of starting a fresh copy.
pub fn clean_pod(pod: &Value) -> Value {
    let m = &pod["metadata"];
    let annotations: serde_json::Map<String, Value> = m["annotations"]
        .as_object()
        .map(|a| {
            a.iter()
                .filter(|(k, _)| {
                    !k.starts_with("kubernetes.io/") && !k.starts_with("kubectl.kubernetes.io/")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let mut spec = pod["spec"].clone();
    if let Some(s) = spec.as_object_mut() {
        s.remove("nodeName");
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": m["name"],
            "namespace": m["namespace"],
            "labels": m["labels"].as_object().cloned().unwrap_or_default(),
            "annotations": annotations,
        },
        "spec": spec,
    })
}

/// Pods a drain leaves alone: DaemonSet pods (their controller ignores cordons) and static
/// pods' mirrors (the kubelet owns them).
pub fn drain_skips(pod: &Value) -> bool {
    let mirror = pod["metadata"]["annotations"]
        .get("kubernetes.io/config.mirror")
        .is_some();
    let daemon = crate::kube::controller_ref(pod).is_some_and(|(k, _)| k == "DaemonSet");
    let done = matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    mirror || daemon || done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_running_gpu_containers_are_selected() {
        let pods = vec![json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"nodeName": "a", "containers": [
                {"name": "gpu", "resources": {"limits": {"nvidia.com/gpu": 1}}},
                {"name": "zero", "resources": {"limits": {"nvidia.com/gpu": "0"}}},
                {"name": "side"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "gpu", "state": {"running": {}}},
                {"name": "zero", "state": {"running": {}}},
                {"name": "side", "state": {"running": {}}}]},
        })];
        let res: Vec<String> = GPU_RESOURCES.iter().map(|s| s.to_string()).collect();
        let got = gpu_containers(&pods, None, &res);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].container, "gpu");
        assert!(gpu_containers(&pods, Some("other"), &res).is_empty());
        let clean = clean_pod(&pods[0]);
        assert!(clean["spec"].get("nodeName").is_none());
    }
}
