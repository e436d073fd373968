//! A fake Kubernetes node on loopback for the `criu-gpu node` tests: the kubelet's API (pod
//! list, checkpoint), the API server's (nodes, pods, evictions, ReplicaSets, Deployments and
//! their scale) and a registry's (OCI distribution pushes), over real TLS with a test CA, a
//! bearer token and client certificates. Controllers act as Kubernetes' do where the tests
//! look: scaling a Deployment to 0 deletes its pods; an eviction deletes the pod.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

pub const TOKEN: &str = "s3cret";

/// What the fake cluster holds and has been asked.
#[derive(Default)]
pub struct State {
    pub pods: Vec<Value>,
    pub unschedulable: bool,
    /// Deployments by name: replicas and the ReplicaSet they own.
    pub deployments: BTreeMap<String, (i64, String)>,
    /// "METHOD path" per request, in order.
    pub log: Vec<String>,
    /// Containers whose checkpoint fails with the runtime's error.
    pub fail: BTreeSet<String>,
    /// How long each checkpoint takes.
    pub delay: Duration,
    pub inflight: usize,
    pub max_inflight: usize,
    /// Registry: blobs by digest, manifests by "repo:tag".
    pub blobs: BTreeMap<String, Vec<u8>>,
    pub manifests: BTreeMap<String, Value>,
    /// Pods created through the API.
    pub created: Vec<Value>,
}

pub struct Cluster {
    pub url: String,
    pub dir: tempfile::TempDir,
    pub state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

struct Pki {
    ca_pem: String,
    server: (Vec<u8>, Vec<u8>),
    client_pem: (String, String),
}

fn pki() -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "criu-gpu test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let mut sp = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    sp.subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::V4(
            std::net::Ipv4Addr::LOCALHOST,
        )));
    let server = sp.signed_by(&server_key, &ca_cert, &ca_key).unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut cp = CertificateParams::new(Vec::<String>::new()).unwrap();
    cp.distinguished_name
        .push(rcgen::DnType::CommonName, "admin");
    cp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = cp.signed_by(&client_key, &ca_cert, &ca_key).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        server: (server.der().to_vec(), server_key.serialize_der()),
        client_pem: (client.pem(), client_key.serialize_pem()),
    }
}

impl Cluster {
    /// Starts the fake with `pods` on node "node-a".
    pub fn start(pods: Vec<Value>) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        std::fs::write(dir.path().join("ca.pem"), &pki.ca_pem).unwrap();
        std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();
        std::fs::create_dir_all(dir.path().join("node-checkpoints")).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        // The API server is reached with a client certificate, as admin kubeconfigs do.
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: fake\n  cluster:\n    server: {url}\n    certificate-authority-data: {}\ncontexts:\n- name: test\n  context: {{cluster: fake, user: admin}}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&pki.ca_pem),
            b64(&pki.client_pem.0),
            b64(&pki.client_pem.1)
        );
        std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
        let state = Arc::new(Mutex::new(State {
            pods,
            delay: Duration::from_millis(300),
            ..State::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let config = server_config(&pki);
        let (st, sp, archives) = (
            state.clone(),
            stop.clone(),
            dir.path().join("node-checkpoints"),
        );
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((tcp, _)) => {
                        let (st, cfg, archives) = (st.clone(), config.clone(), archives.clone());
                        std::thread::spawn(move || serve(tcp, cfg, &st, &archives));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Cluster {
            url,
            dir,
            state,
            stop,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    pub fn log(&self) -> Vec<String> {
        self.with(|s| s.log.clone())
    }

    /// The position of the first request starting with `prefix`.
    pub fn first(&self, prefix: &str) -> Option<usize> {
        self.log().iter().position(|l| l.starts_with(prefix))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn server_config(pki: &Pki) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(pki.ca_pem.as_bytes()) {
        let c: CertificateDer<'static> = c.unwrap();
        roots.add(c).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from(pki.server.0.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.server.1.clone())),
        )
        .unwrap();
    Arc::new(cfg)
}

struct Request {
    method: String,
    path: String,
    query: String,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
    client_cert: bool,
}

fn read_request(
    tls: &mut rustls::StreamOwned<rustls::ServerConnection, TcpStream>,
) -> Option<Request> {
    let mut r = BufReader::new(&mut *tls);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    drop(r);
    let (path, query) = target
        .split_once('?')
        .map_or((target.clone(), String::new()), |(p, q)| {
            (p.to_owned(), q.to_owned())
        });
    Some(Request {
        method,
        path,
        query,
        headers,
        body,
        client_cert: tls.conn.peer_certificates().is_some_and(|c| !c.is_empty()),
    })
}

struct Response {
    status: u16,
    body: Vec<u8>,
    headers: Vec<(String, String)>,
}

fn reply(status: u16, body: impl Into<Vec<u8>>) -> Response {
    Response {
        status,
        body: body.into(),
        headers: Vec::new(),
    }
}

fn status(code: u16, message: &str) -> Response {
    reply(
        code,
        json!({"kind": "Status", "status": "Failure", "message": message, "code": code})
            .to_string(),
    )
}

fn serve(tcp: TcpStream, cfg: Arc<rustls::ServerConfig>, state: &Mutex<State>, archives: &Path) {
    let _ = tcp.set_nonblocking(false);
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(conn) = rustls::ServerConnection::new(cfg) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let Some(req) = read_request(&mut tls) else {
        return;
    };
    state.lock().unwrap().log.push(format!(
        "{} {}{}",
        req.method,
        req.path,
        if req.query.is_empty() {
            String::new()
        } else {
            format!("?{}", req.query)
        }
    ));
    let resp = route(&req, state, archives);
    let mut head = format!("HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\nContent-Type: application/json\r\n", resp.status, resp.body.len());
    for (k, v) in &resp.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = tls.write_all(head.as_bytes());
    if req.method != "HEAD" {
        let _ = tls.write_all(&resp.body);
    }
    let _ = tls.flush();
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

fn route(req: &Request, state: &Mutex<State>, archives: &Path) -> Response {
    let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    if parts.first() == Some(&"v2") {
        return registry(req, &parts[1..], state);
    }
    let authorised = req.client_cert
        || req.headers.get("authorization").map(String::as_str) == Some(&format!("Bearer {TOKEN}"));
    if !authorised {
        return reply(401, "Unauthorized");
    }
    match (req.method.as_str(), parts.as_slice()) {
        ("GET", ["pods"]) => {
            let pods = state.lock().unwrap().pods.clone();
            reply(200, json!({"kind": "PodList", "items": pods}).to_string())
        }
        ("POST", ["checkpoint", ns, pod, container]) => {
            checkpoint(state, archives, ns, pod, container)
        }
        ("GET", ["api", "v1", "nodes", "node-a"]) => {
            let u = state.lock().unwrap().unschedulable;
            reply(
                200,
                json!({"metadata": {"name": "node-a"}, "spec": {"unschedulable": u}}).to_string(),
            )
        }
        ("GET", ["api", "v1", "nodes", _]) => status(404, "nodes not found"),
        ("PATCH", ["api", "v1", "nodes", "node-a"]) => {
            let v: Value = serde_json::from_slice(&req.body).unwrap_or_default();
            state.lock().unwrap().unschedulable =
                v["spec"]["unschedulable"].as_bool().unwrap_or(false);
            reply(200, "{}")
        }
        ("GET", ["api", "v1", "pods"]) => {
            let pods = state.lock().unwrap().pods.clone();
            reply(200, json!({"items": pods}).to_string())
        }
        ("GET", ["api", "v1", "namespaces", _, "pods"]) => {
            // The tests' selectors are app=NAME.
            let app = req
                .query
                .split("app%3D")
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            let pods: Vec<Value> = state
                .lock()
                .unwrap()
                .pods
                .iter()
                .filter(|p| p["metadata"]["labels"]["app"] == app.as_str())
                .cloned()
                .collect();
            reply(200, json!({"items": pods}).to_string())
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            match find(&state.lock().unwrap().pods, ns, name) {
                Some(p) => reply(200, p.to_string()),
                None => status(404, &format!("pods \"{name}\" not found")),
            }
        }
        ("POST", ["api", "v1", "namespaces", ns, "pods", name, "eviction"]) => {
            let mut s = state.lock().unwrap();
            let before = s.pods.len();
            s.pods
                .retain(|p| !(p["metadata"]["namespace"] == *ns && p["metadata"]["name"] == *name));
            if s.pods.len() == before {
                status(404, "not found")
            } else {
                reply(201, "{}")
            }
        }
        ("POST", ["api", "v1", "namespaces", ns, "pods"]) => {
            let mut pod: Value = serde_json::from_slice(&req.body).unwrap_or_default();
            let name = pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let mut s = state.lock().unwrap();
            if find(&s.pods, ns, &name).is_some() {
                return status(409, &format!("pods \"{name}\" already exists"));
            }
            s.created.push(pod.clone());
            pod["status"] = json!({"phase": "Pending"});
            s.pods.push(pod);
            reply(201, "{}")
        }
        ("GET", ["apis", "apps", "v1", "namespaces", ns, "replicasets", name]) => {
            let s = state.lock().unwrap();
            match s.deployments.iter().find(|(_, (_, rs))| rs == name) {
                Some((d, _)) => reply(200, json!({"metadata": {"name": name, "namespace": ns, "ownerReferences": [{"kind": "Deployment", "name": d, "controller": true}]}}).to_string()),
                None => status(404, "replicasets not found"),
            }
        }
        ("GET", ["apis", "apps", "v1", "namespaces", _, "deployments", name]) => match state
            .lock()
            .unwrap()
            .deployments
            .get(*name)
        {
            Some((replicas, _)) => reply(
                200,
                json!({"spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}}})
                    .to_string(),
            ),
            None => status(404, "deployments not found"),
        },
        ("PATCH", ["apis", "apps", "v1", "namespaces", ns, "deployments", name, "scale"]) => {
            let v: Value = serde_json::from_slice(&req.body).unwrap_or_default();
            let replicas = v["spec"]["replicas"].as_i64().unwrap_or(-1);
            let mut s = state.lock().unwrap();
            let Some(d) = s.deployments.get_mut(*name) else {
                return status(404, "not found");
            };
            d.0 = replicas;
            let rs = d.1.clone();
            if replicas == 0 {
                // The controller deletes its pods.
                s.pods.retain(|p| {
                    !(p["metadata"]["namespace"] == *ns && super_owner(p) == Some(rs.clone()))
                });
            }
            reply(200, "{}")
        }
        _ => status(404, &format!("no route for {} {}", req.method, req.path)),
    }
}

fn super_owner(p: &Value) -> Option<String> {
    p["metadata"]["ownerReferences"][0]["name"]
        .as_str()
        .map(str::to_owned)
}

fn find<'a>(pods: &'a [Value], ns: &str, name: &str) -> Option<&'a Value> {
    pods.iter()
        .find(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name)
}

/// A checkpoint archive as the kubelet writes it: a tar holding CRIU images.
fn checkpoint(
    state: &Mutex<State>,
    archives: &Path,
    ns: &str,
    pod: &str,
    container: &str,
) -> Response {
    let (delay, fail) = {
        let mut s = state.lock().unwrap();
        s.inflight += 1;
        s.max_inflight = s.max_inflight.max(s.inflight);
        (s.delay, s.fail.contains(container))
    };
    std::thread::sleep(delay);
    state.lock().unwrap().inflight -= 1;
    if fail {
        return reply(
            500,
            format!(
                "checkpointing container {container}: rpc error: criu failed: type DUMP errno 0"
            ),
        );
    }
    let path = archives.join(format!(
        "checkpoint-{pod}_{ns}-{container}-2024-01-01T00:00:00Z.tar"
    ));
    let mut b = tar::Builder::new(Vec::new());
    let pages: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    for (name, data) in [
        ("config.dump", json!({"name": container}).to_string().into_bytes()),
        ("spec.dump", json!({"annotations": {"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": ns, "io.kubernetes.container.name": container}}).to_string().into_bytes()),
        ("checkpoint/inventory.img", b"inventory".to_vec()),
        ("checkpoint/pages-1.img", pages),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, &data[..]).unwrap();
    }
    std::fs::write(&path, b.into_inner().unwrap()).unwrap();
    reply(200, json!({"items": [path]}).to_string())
}

fn registry(req: &Request, parts: &[&str], state: &Mutex<State>) -> Response {
    let mut s = state.lock().unwrap();
    let n = parts.len();
    if n >= 3 && parts[n - 2] == "blobs" && req.method == "HEAD" {
        return if s.blobs.contains_key(parts[n - 1]) {
            reply(200, "")
        } else {
            reply(404, "")
        };
    }
    if n >= 3 && parts[n - 2] == "blobs" && parts[n - 1] == "uploads" && req.method == "POST" {
        let repo = parts[..n - 2].join("/");
        let mut r = reply(202, "");
        r.headers
            .push(("Location".into(), format!("/v2/{repo}/blobs/uploads/u1")));
        return r;
    }
    if n >= 4 && parts[n - 3] == "blobs" && parts[n - 2] == "uploads" && req.method == "PUT" {
        let digest = req
            .query
            .split("digest=")
            .nth(1)
            .unwrap_or_default()
            .replace("%3A", ":");
        let actual = criu_gpu_node::oci::digest_of(&req.body[..]).unwrap().0;
        if actual != digest {
            return reply(400, format!("digest mismatch: {actual} != {digest}"));
        }
        s.blobs.insert(digest, req.body.clone());
        return reply(201, "");
    }
    if n >= 3 && parts[n - 2] == "manifests" && req.method == "PUT" {
        let manifest: Value = serde_json::from_slice(&req.body).unwrap_or_default();
        for d in manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .chain([&manifest["config"]])
        {
            if !s
                .blobs
                .contains_key(d["digest"].as_str().unwrap_or_default())
            {
                return reply(400, "manifest blob unknown");
            }
        }
        let repo = parts[..n - 2].join("/");
        s.manifests
            .insert(format!("{repo}:{}", parts[n - 1]), manifest);
        return reply(201, "");
    }
    reply(404, "no such registry route")
}

/// A running pod on node-a.
pub fn pod(name: &str, containers: Value, owner: Option<&str>) -> Value {
    let statuses: Vec<Value> = containers
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json!({"name": c["name"], "state": {"running": {}}}))
        .collect();
    let mut meta = json!({"name": name, "namespace": "ml", "uid": format!("uid-{name}"), "labels": {"app": name}});
    if let Some(rs) = owner {
        meta["ownerReferences"] = json!([{"kind": "ReplicaSet", "name": rs, "controller": true}]);
        meta["labels"] =
            json!({"app": rs.rsplit_once('-').map_or(rs, |(d, _)| d), "pod-template-hash": "abc"});
    }
    json!({
        "metadata": meta,
        "spec": {"nodeName": "node-a", "containers": containers},
        "status": {"phase": "Running", "containerStatuses": statuses},
    })
}
