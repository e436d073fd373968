//! The Kubernetes scripts (scripts/k8s) against a fake kubelet on loopback, with stand-ins for
//! kubectl and buildah that record how they were called.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use gpu_ckpt_tests::*;
use serde_json::{json, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn pod(name: &str, phase: &str, containers: Value) -> Value {
    let names: Vec<Value> = containers
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json!({"name": c["name"], "state": {"running": {}}}))
        .collect();
    json!({
        "metadata": {"name": name, "namespace": "ml", "uid": "x", "resourceVersion": "7", "labels": {"app": name}},
        "spec": {"nodeName": "node-a", "containers": containers},
        "status": {"phase": phase, "containerStatuses": names},
    })
}

/// A node with a training pod (GPU container and a plain sidecar), an inference pod on AMD
/// GPUs, a web pod without GPU, and a GPU pod still pending.
fn node_pods() -> Value {
    json!({"kind": "PodList", "items": [
        pod("train", "Running", json!([
            {"name": "trainer", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "sidecar", "image": "log:1"}])),
        pod("infer", "Running", json!([
            {"name": "server", "image": "infer:1", "resources": {"requests": {"amd.com/gpu": "2"}, "limits": {"amd.com/gpu": "2"}}}])),
        pod("web", "Running", json!([{"name": "nginx", "image": "nginx"}])),
        pod("queued", "Pending", json!([
            {"name": "job", "image": "job:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])),
    ]})
}

struct Node {
    dir: tempfile::TempDir,
    kubelet: Child,
    url: String,
}

impl Node {
    fn start(fail: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("pods.json"), node_pods().to_string()).unwrap();
        std::fs::create_dir_all(p.join("node-checkpoints")).unwrap();
        std::fs::write(p.join("token"), "s3cret\n").unwrap();
        let kubelet = Command::new("python3")
            .arg(repo().join("tests/fixtures/fake_kubelet.py"))
            .args(["--port-file", p.join("port").to_str().unwrap()])
            .args(["--pods", p.join("pods.json").to_str().unwrap()])
            .args(["--archives", p.join("node-checkpoints").to_str().unwrap()])
            .args(["--log", p.join("kubelet.log").to_str().unwrap()])
            .args(["--token", "s3cret", "--fail", fail])
            .spawn()
            .unwrap();
        assert!(wait_until(Duration::from_secs(10), || p
            .join("port")
            .exists()));
        let port = std::fs::read_to_string(p.join("port")).unwrap();
        // kubectl and buildah stand-ins: log their arguments, and print a container name for
        // `buildah from`.
        let bin = p.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for tool in ["kubectl", "buildah"] {
            let script = format!(
                "#!/bin/sh\necho \"{tool} $*\" >> {}\n[ \"$1\" = from ] && echo work-ctr\nexit 0\n",
                p.join("tools.log").display()
            );
            let path = bin.join(tool);
            std::fs::write(&path, script).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Node {
            url: format!("http://127.0.0.1:{}", port.trim()),
            dir,
            kubelet,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn gpuctl(&self, args: &[&str]) -> Output {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap()
        );
        Command::new(repo().join("scripts/k8s/gpuctl.py"))
            .args(args)
            .env("PATH", path)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `gpuctl.py CMD [NODE] --kubelet URL --token-file T --store STORE EXTRA...`
    fn against_kubelet(&self, cmd: &[&str], extra: &[&str]) -> Output {
        let token = self.path("token");
        let store = self.path("store");
        let mut a = cmd.to_vec();
        a.extend([
            "--kubelet",
            &self.url,
            "--token-file",
            token.to_str().unwrap(),
        ]);
        a.extend(["--store", store.to_str().unwrap()]);
        a.extend_from_slice(extra);
        self.gpuctl(&a)
    }

    fn kubelet_requests(&self) -> Vec<String> {
        read_lines(&self.path("kubelet.log"))
    }

    fn tools(&self) -> Vec<String> {
        read_lines(&self.path("tools.log"))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.kubelet.kill();
        let _ = self.kubelet.wait();
    }
}

fn text(o: &Output) -> String {
    stdout(o) + &stderr(o)
}

#[test]
fn checkpoint_saves_every_running_gpu_container_and_a_manifest() {
    let n = Node::start("");
    let store = n.path("store");
    let out = n.against_kubelet(&["checkpoint"], &[]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let posts: Vec<String> = n
        .kubelet_requests()
        .into_iter()
        .filter(|l| l.starts_with("POST"))
        .collect();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(posts[0].starts_with("POST /checkpoint/ml/train/trainer?timeout="));
    assert!(posts[1].starts_with("POST /checkpoint/ml/infer/server?"));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(store.join("manifest.json")).unwrap())
            .unwrap();
    let saved = manifest["containers"].as_array().unwrap();
    assert_eq!(saved.len(), 2);
    for e in saved {
        let archive = Path::new(e["archive"].as_str().unwrap());
        assert!(archive.starts_with(&store) && archive.exists(), "{e}");
        assert_eq!(e["bytes"], 4096);
        assert!(
            e["pod_spec"]["spec"].get("nodeName").is_none(),
            "the spec is reusable elsewhere"
        );
    }
    let t = text(&out);
    assert!(
        t.contains("2 GPU container(s) in 4 pod(s)") && t.contains("checkpoint: 2 of 2 done"),
        "{t}"
    );
}

#[test]
fn a_dry_run_changes_nothing() {
    let n = Node::start("");
    let store = n.path("store");
    let out = n.against_kubelet(&["drain", "node-a"], &["--dry-run"]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    assert!(
        n.kubelet_requests().iter().all(|l| l.starts_with("GET")),
        "no checkpoint requested"
    );
    assert!(!store.exists());
    assert!(n.tools().is_empty(), "neither kubectl nor buildah ran");
    let t = text(&out);
    assert!(
        t.contains("would POST /checkpoint/ml/train/trainer")
            && t.contains("would run: kubectl drain node-a"),
        "{t}"
    );
}

#[test]
fn a_failed_checkpoint_stops_the_drain_with_the_reason() {
    let n = Node::start("trainer");
    let store = n.path("store");
    let out = n.against_kubelet(&["drain", "node-a"], &[]);
    assert_eq!(exit_code(&out), 1, "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("ml/train/trainer: kubelet POST")
            && t.contains("HTTP 500")
            && t.contains("criu failed"),
        "{t}"
    );
    assert!(t.contains("node node-a is NOT drained"), "{t}");
    assert!(
        n.tools().is_empty(),
        "kubectl was not called: {:?}",
        n.tools()
    );
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(store.join("manifest.json")).unwrap())
            .unwrap();
    assert!(manifest["containers"][0]["error"]
        .as_str()
        .unwrap()
        .contains("500"));
    assert!(
        manifest["containers"][1].get("error").is_none(),
        "the other container was saved"
    );
}

#[test]
fn drain_cordons_and_drains_once_everything_is_saved() {
    let n = Node::start("");
    let out = n.against_kubelet(&["drain", "node-a"], &[]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let tools = n.tools();
    assert_eq!(tools.len(), 2, "{tools:?}");
    assert_eq!(tools[0], "kubectl cordon node-a");
    assert!(
        tools[1].starts_with("kubectl drain node-a --ignore-daemonsets"),
        "{tools:?}"
    );
}

#[test]
fn a_bad_token_is_reported() {
    let n = Node::start("");
    std::fs::write(n.path("bad"), "nope").unwrap();
    let out = n.gpuctl(&[
        "checkpoint",
        "--kubelet",
        &n.url,
        "--token-file",
        n.path("bad").to_str().unwrap(),
    ]);
    assert_eq!(exit_code(&out), 1);
    assert!(
        text(&out).contains("HTTP 401") && text(&out).contains("nodes/checkpoint"),
        "{}",
        text(&out)
    );
    let out = n.gpuctl(&["checkpoint", "--kubelet", "http://127.0.0.1:1"]);
    assert_eq!(exit_code(&out), 1);
    assert!(text(&out).contains("unreachable"), "{}", text(&out));
}

#[test]
fn restore_builds_checkpoint_images_and_recreates_the_pods() {
    let n = Node::start("");
    let store = n.path("store");
    let out = n.against_kubelet(&["checkpoint"], &[]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let dry = n.gpuctl(&[
        "restore",
        "--store",
        store.to_str().unwrap(),
        "--registry",
        "reg.example/ckpt",
        "--dry-run",
    ]);
    assert_eq!(exit_code(&dry), 0, "{}", text(&dry));
    assert!(n.tools().is_empty());
    let out = n.gpuctl(&[
        "restore",
        "--store",
        store.to_str().unwrap(),
        "--registry",
        "reg.example/ckpt",
        "--node",
        "node-b",
    ]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let tools = n.tools();
    let image = "reg.example/ckpt/checkpoint-train-trainer:latest";
    assert!(
        tools.contains(&"buildah from scratch".to_string()),
        "{tools:?}"
    );
    assert!(
        tools
            .iter()
            .any(|t| t.starts_with("buildah add work-ctr")
                && t.contains("checkpoint-train_ml-trainer")),
        "{tools:?}"
    );
    assert!(tools.contains(&"buildah config --annotation=io.kubernetes.cri-o.annotations.checkpoint.name=trainer work-ctr".to_string()), "{tools:?}");
    assert!(
        tools.contains(&format!("buildah commit work-ctr {image}")),
        "{tools:?}"
    );
    assert!(
        tools.contains(&format!("buildah push {image}")),
        "{tools:?}"
    );
    let pod: Value =
        serde_json::from_str(&std::fs::read_to_string(store.join("pod-ml-train.json")).unwrap())
            .unwrap();
    assert_eq!(pod["spec"]["nodeName"], "node-b");
    assert_eq!(pod["spec"]["containers"][0]["image"], image);
    assert_eq!(
        pod["spec"]["containers"][1]["image"], "log:1",
        "the sidecar starts from its own image"
    );
    assert!(
        tools
            .iter()
            .filter(|t| t.starts_with("kubectl apply -f"))
            .count()
            == 2
    );
    assert!(
        text(&out).contains("restore: 2 of 2 done"),
        "{}",
        text(&out)
    );
    // A store that lost an archive: the restore says which and fails.
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(store.join("manifest.json")).unwrap())
            .unwrap();
    std::fs::remove_file(manifest["containers"][1]["archive"].as_str().unwrap()).unwrap();
    let out = n.gpuctl(&[
        "restore",
        "--store",
        store.to_str().unwrap(),
        "--registry",
        "reg.example/ckpt",
    ]);
    assert_eq!(exit_code(&out), 1);
    assert!(
        text(&out).contains("is missing from the store"),
        "{}",
        text(&out)
    );
}
