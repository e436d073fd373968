//! `criu-gpu node checkpoint|drain|restore` against a fake kubelet, API server and registry on
//! loopback (tests/src/kube.rs), over TLS with a test CA: which containers are saved and how
//! (all at once, the manifest written as each lands), the cordon first, controller-owned pods
//! refused or scaled down and back, a failure half-way that uncordons, dry runs, credentials,
//! checkpoint images in CRI-O's format pushed and inspected, JSON errors, a closed stdout.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpu_ckpt_tests::kube::{pod, Cluster};
use gpu_ckpt_tests::*;
use serde_json::{json, Value};

/// A training pod (GPU container and a plain sidecar), an inference pod on AMD GPUs, and a
/// web pod without GPU, all bare.
fn bare_pods() -> Vec<Value> {
    vec![
        pod(
            "train",
            json!([
                {"name": "trainer", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"name": "sidecar", "image": "log:1"}]),
            None,
        ),
        pod(
            "infer",
            json!([{"name": "server", "image": "infer:1", "resources": {"limits": {"amd.com/gpu": 2}}}]),
            None,
        ),
    ]
}

fn web_pod() -> Value {
    pod(
        "web-5d9",
        json!([{"name": "nginx", "image": "nginx"}]),
        Some("web-5d9"),
    )
}

fn criu_gpu(args: &[&str]) -> Output {
    Command::new(artifact("criu-gpu"))
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBELET_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    stdout(o) + &stderr(o)
}

/// `criu-gpu node CMD ... --kubelet URL --token-file T --cacert CA --kubeconfig K EXTRA`.
fn node(c: &Cluster, cmd: &[&str], extra: &[&str]) -> Output {
    let (token, ca, kc) = (c.path("token"), c.path("ca.pem"), c.path("kubeconfig"));
    let mut a = vec!["node"];
    a.extend_from_slice(cmd);
    a.extend([
        "--kubelet",
        &c.url,
        "--token-file",
        token.to_str().unwrap(),
        "--cacert",
        ca.to_str().unwrap(),
        "--kubeconfig",
        kc.to_str().unwrap(),
    ]);
    a.extend_from_slice(extra);
    criu_gpu(&a)
}

fn manifest(store: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(store.join("manifest.json")).unwrap()).unwrap()
}

fn restore(c: &Cluster, store: &Path, extra: &[&str]) -> Output {
    let ca = c.path("ca.pem");
    let kc = c.path("kubeconfig");
    let registry = format!("{}/ckpt", c.url);
    let mut a = vec![
        "node",
        "restore",
        "--store",
        store.to_str().unwrap(),
        "--registry",
        &registry,
        "--registry-cacert",
        ca.to_str().unwrap(),
        "--kubeconfig",
        kc.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    criu_gpu(&a)
}

#[test]
fn checkpoint_saves_every_gpu_container_at_once_with_a_manifest() {
    let c = Cluster::start(bare_pods());
    let store = c.path("store");
    let out = node(&c, &["checkpoint"], &["--store", store.to_str().unwrap()]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let posts: Vec<String> = c
        .log()
        .into_iter()
        .filter(|l| l.starts_with("POST"))
        .collect();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(posts
        .iter()
        .any(|p| p.starts_with("POST /checkpoint/ml/train/trainer?timeout=600")));
    assert_eq!(
        c.with(|s| s.max_inflight),
        2,
        "both checkpoints ran at the same time"
    );
    let m = manifest(&store);
    assert_eq!(m["state"], "checkpointed");
    for p in m["pods"].as_array().unwrap() {
        assert!(
            p["spec"]["spec"].get("nodeName").is_none(),
            "the spec is reusable elsewhere"
        );
        for ctr in p["containers"].as_array().unwrap() {
            assert_eq!(ctr["status"], "saved", "{ctr}");
            let archive = store.join(ctr["archive"].as_str().unwrap());
            let (digest, size) =
                criu_gpu_node::oci::digest_of(std::fs::File::open(&archive).unwrap()).unwrap();
            assert_eq!(ctr["sha256"], digest.as_str());
            assert_eq!(ctr["bytes"], size);
        }
    }
    let t = stdout(&out);
    assert!(
        t.contains("2 GPU container(s) in 2 pod(s)") && t.contains("checkpoint: 2 of 2 done"),
        "{t}"
    );
    assert!(
        t.contains("GB/s") && t.contains("[1/2]"),
        "progress as plain lines: {t}"
    );
    assert!(!t.contains('\x1b'), "no terminal codes into a pipe");
}

#[test]
fn a_dry_run_changes_nothing() {
    let mut pods = bare_pods();
    pods.push(web_pod());
    let c = Cluster::start(pods);
    c.with(|s| s.deployments.insert("web".into(), (1, "web-5d9".into())));
    let store = c.path("store");
    let out = node(&c, &["drain", "node-a"], &["--dry-run"]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    assert!(
        c.log().iter().all(|l| l.starts_with("GET")),
        "{:?}",
        c.log()
    );
    assert!(!store.exists());
    let t = stdout(&out);
    for want in [
        "would cordon node node-a",
        "would POST /checkpoint/ml/train/trainer",
        "would evict ml/web-5d9",
        "dry run: nothing was changed",
    ] {
        assert!(t.contains(want), "{want}: {t}");
    }
}

#[test]
fn a_failure_half_way_uncordons_and_keeps_what_was_saved() {
    let c = Cluster::start(bare_pods());
    c.with(|s| s.fail.insert("trainer".into()));
    let store = c.path("store");
    let out = node(
        &c,
        &["drain", "node-a"],
        &["--store", store.to_str().unwrap()],
    );
    assert_eq!(exit_code(&out), 1, "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("HTTP 500") && t.contains("criu failed"), "{t}");
    assert!(
        t.contains("node node-a is NOT drained (uncordoned again)"),
        "{t}"
    );
    let log = c.log();
    let cordon = c.first("PATCH /api/v1/nodes/node-a").expect("cordoned");
    let first_post = c.first("POST /checkpoint").unwrap();
    assert!(
        cordon < first_post,
        "cordoned before any checkpoint: {log:?}"
    );
    assert!(!c.with(|s| s.unschedulable), "uncordoned");
    assert!(
        !log.iter().any(|l| l.contains("eviction")),
        "nothing evicted: {log:?}"
    );
    let m = manifest(&store);
    assert_eq!(m["state"], "failed");
    let containers: Vec<&Value> = m["pods"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["containers"].as_array().unwrap())
        .collect();
    let trainer = containers.iter().find(|c| c["name"] == "trainer").unwrap();
    assert_eq!(trainer["status"], "failed");
    assert!(trainer["error"].as_str().unwrap().contains("500"));
    let server = containers.iter().find(|c| c["name"] == "server").unwrap();
    assert_eq!(server["status"], "saved", "the other archive is recorded");
}

#[test]
fn a_controller_owned_pod_is_refused_then_scaled_down_and_adopted_back() {
    let owned = pod(
        "train-abc-x1",
        json!([{"name": "trainer", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        Some("train-abc"),
    );
    let c = Cluster::start(vec![owned, web_pod()]);
    c.with(|s| {
        s.deployments
            .insert("train".into(), (1, "train-abc".into()));
        s.deployments.insert("web".into(), (2, "web-5d9".into()));
    });
    let store = c.path("store");
    let s = store.to_str().unwrap();
    // Without --scale-down: refused before any checkpoint, the node uncordoned.
    let out = node(&c, &["drain", "node-a"], &["--store", s]);
    assert_eq!(exit_code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("is owned by deployment ml/train")
            && text(&out).contains("--scale-down"),
        "{}",
        text(&out)
    );
    assert!(c.first("POST /checkpoint").is_none());
    assert!(!c.with(|s| s.unschedulable));

    let out = node(&c, &["drain", "node-a"], &["--store", s, "--scale-down"]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let checkpointed = c.first("POST /checkpoint/ml/train-abc-x1/trainer").unwrap();
    let scaled = c
        .first("PATCH /apis/apps/v1/namespaces/ml/deployments/train/scale")
        .unwrap();
    assert!(
        checkpointed < scaled,
        "scaled down only after the checkpoint"
    );
    assert!(
        c.first("POST /api/v1/namespaces/ml/pods/web-5d9/eviction")
            .is_some(),
        "the rest is evicted"
    );
    assert!(
        c.with(|s| s.unschedulable && s.pods.is_empty()),
        "node drained"
    );
    let m = manifest(&store);
    assert_eq!(m["state"], "drained");
    assert_eq!(m["scaled_down"][0]["name"], "train");
    assert_eq!(m["scaled_down"][0]["replicas"], 1);

    // Restore: image built and pushed, the pod created without its owner, then scaled back.
    let out = restore(&c, &store, &["--node", "node-b"]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let created = c.with(|s| s.created.clone());
    assert_eq!(created.len(), 1);
    let p = &created[0];
    assert!(p["metadata"].get("ownerReferences").is_none());
    assert_eq!(
        p["metadata"]["labels"]["pod-template-hash"], "abc",
        "labels kept for adoption"
    );
    assert_eq!(p["spec"]["nodeName"], "node-b");
    let image = p["spec"]["containers"][0]["image"].as_str().unwrap();
    let host = c.url.trim_start_matches("https://");
    assert_eq!(
        image,
        format!("{host}/ckpt/checkpoint-train-abc-x1-trainer:latest")
    );
    let made = c.first("POST /api/v1/namespaces/ml/pods").unwrap();
    let log = c.log();
    let back = log
        .iter()
        .rposition(|l| l.starts_with("PATCH /apis/apps/v1/namespaces/ml/deployments/train/scale"))
        .unwrap();
    assert!(made < back, "scaled back after the pod exists: {log:?}");
    assert_eq!(c.with(|s| s.deployments["train"].0), 1);
    // The pushed image is CRI-O's checkpoint format, its layer the archive itself.
    let manifest_pushed =
        c.with(|s| s.manifests["ckpt/checkpoint-train-abc-x1-trainer:latest"].clone());
    assert_eq!(
        manifest_pushed["annotations"]["io.kubernetes.cri-o.annotations.checkpoint.name"],
        "trainer"
    );
    let m = manifest(&store);
    let archive = store.join(m["pods"][0]["containers"][0]["archive"].as_str().unwrap());
    let sha = criu_gpu_node::oci::digest_of(std::fs::File::open(&archive).unwrap())
        .unwrap()
        .0;
    assert_eq!(manifest_pushed["layers"][0]["digest"], sha.as_str());
    // And `criu-gpu inspect` reads the image layout the restore wrote.
    let layout = store.join("images/ml-train-abc-x1-trainer");
    let out = criu_gpu(&["inspect", "--json", layout.to_str().unwrap()]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["format"], "oci-image");
    assert_eq!(r["container"]["name"], "trainer");
    assert_eq!(r["container"]["pod"], "train-abc-x1");
    assert_eq!(r["images"]["memory_bytes"], 1 << 20);
    // Restoring again: the pod exists now, and the message says what to do.
    let out = restore(&c, &store, &[]);
    assert_eq!(exit_code(&out), 1);
    assert!(
        text(&out).contains("already exists") && text(&out).contains("delete it first"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_checkpoint_only_store_does_not_duplicate_owned_pods() {
    let owned = pod(
        "train-abc-x1",
        json!([{"name": "trainer", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        Some("train-abc"),
    );
    let c = Cluster::start(vec![owned]);
    let store = c.path("store");
    let out = node(&c, &["checkpoint"], &["--store", store.to_str().unwrap()]);
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let out = restore(&c, &store, &[]);
    assert_eq!(exit_code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("would duplicate it") && text(&out).contains("--include-owned"),
        "{}",
        text(&out)
    );
    assert!(c.with(|s| s.created.is_empty()));
}

#[test]
fn bad_credentials_unreachable_kubelets_and_json_errors() {
    let c = Cluster::start(bare_pods());
    std::fs::write(c.path("bad"), "nope").unwrap();
    let ca = c.path("ca.pem");
    let out = criu_gpu(&[
        "node",
        "checkpoint",
        "--kubelet",
        &c.url,
        "--cacert",
        ca.to_str().unwrap(),
        "--token-file",
        c.path("bad").to_str().unwrap(),
    ]);
    assert_eq!(exit_code(&out), 1);
    assert!(
        text(&out).contains("HTTP 401") && text(&out).contains("nodes/checkpoint"),
        "{}",
        text(&out)
    );
    // The kubelet's certificate is not trusted without its CA.
    let out = criu_gpu(&[
        "node",
        "checkpoint",
        "--kubelet",
        &c.url,
        "--token-file",
        c.path("token").to_str().unwrap(),
    ]);
    assert_eq!(exit_code(&out), 1);
    assert!(text(&out).contains("unreachable"), "{}", text(&out));
    let out = criu_gpu(&[
        "node",
        "checkpoint",
        "--json",
        "--kubelet",
        "https://127.0.0.1:1",
    ]);
    assert_eq!(exit_code(&out), 1);
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert!(v["error"].as_str().unwrap().contains("unreachable"), "{v}");
    assert_eq!(v["ok"], false);
    // Usage errors too.
    let out = criu_gpu(&["node", "drain", "--json"]);
    assert_eq!(exit_code(&out), 2);
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(v["kind"], "usage");
    let out = criu_gpu(&["inspect", "--json", "/nonexistent"]);
    assert_eq!(exit_code(&out), 2);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["error"].as_str().unwrap().contains("/nonexistent"));
}

#[test]
fn a_closed_stdout_ends_the_output_not_the_work() {
    let c = Cluster::start(bare_pods());
    let store = c.path("store");
    let (token, ca) = (c.path("token"), c.path("ca.pem"));
    let mut child = Command::new(artifact("criu-gpu"))
        .args([
            "node",
            "checkpoint",
            "--kubelet",
            &c.url,
            "--token-file",
            token.to_str().unwrap(),
        ])
        .args([
            "--cacert",
            ca.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // `| head -0`
    let out = child.wait_with_output().unwrap();
    assert_eq!(exit_code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    assert_eq!(
        manifest(&store)["state"],
        "checkpointed",
        "the checkpoints went on"
    );
    // The same for a command that prints a lot and stops.
    let mut child = Command::new(artifact("criu-gpu"))
        .arg("--help")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

#[test]
fn a_terminal_gets_a_live_display() {
    let c = Cluster::start(bare_pods());
    let store = c.path("store");
    let cmd = format!(
        "{} node checkpoint --kubelet {} --token-file {} --cacert {} --store {}",
        artifact("criu-gpu").display(),
        c.url,
        c.path("token").display(),
        c.path("ca.pem").display(),
        store.display()
    );
    // `script` gives the command a pseudo-terminal.
    let out = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .unwrap();
    assert_eq!(exit_code(&out), 0, "{}", text(&out));
    let t = stdout(&out);
    assert!(
        t.contains("\x1b[2K[1/2]") && t.contains("\x1b[3A"),
        "redrawn in place: {t:?}"
    );
    assert!(t.contains("2 of 2 saved") && t.contains("GB/s"), "{t:?}");
}
