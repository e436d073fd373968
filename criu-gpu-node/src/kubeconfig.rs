//! Where the API server is and how to authenticate to it: a kubeconfig (`--kubeconfig`,
//! `$KUBECONFIG`, `~/.kube/config`) or, inside a pod, its service account.
//!
//! Supported credentials: bearer tokens (inline or `tokenFile`) and client certificates (inline
//! or files). Exec plugins and auth providers (EKS, GKE, OIDC) are not run: for those, give a
//! service account token with `--token-file`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

use crate::http::Tls;
use crate::NodeError;

const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The API server and our credentials for it.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub server: String,
    pub tls: Tls,
    pub token: Option<String>,
    /// Where this came from, for messages.
    pub source: String,
}

fn config_err(source: &str, why: impl std::fmt::Display) -> NodeError {
    NodeError::Config(format!("{source}: {why}"))
}

/// What the command's environment says about the cluster, read at the edge (the `criu-gpu`
/// command) and passed down: this library reads no environment itself.
#[derive(Debug, Clone, Default)]
pub struct KubeEnv {
    /// `$KUBECONFIG`: a list of kubeconfig files; the first that exists is used.
    pub kubeconfig: Option<OsString>,
    /// `$KUBERNETES_SERVICE_HOST`: set inside a pod.
    pub service_host: Option<String>,
    /// `$KUBERNETES_SERVICE_PORT` (443 when unset).
    pub service_port: Option<String>,
    /// `$HOME`, for `~/.kube/config`.
    pub home: Option<PathBuf>,
    /// `$KUBELET_TOKEN`: the kubelet's bearer token when no `--token-file` is given.
    pub kubelet_token: Option<String>,
}

/// Finds the cluster: `explicit`, else `$KUBECONFIG`, else the pod's service account, else
/// `~/.kube/config`.
pub fn load(explicit: Option<&Path>, env: &KubeEnv) -> Result<Cluster, NodeError> {
    if let Some(p) = explicit {
        return from_file(p);
    }
    if let Some(list) = &env.kubeconfig {
        if let Some(p) = std::env::split_paths(list).find(|p| p.exists()) {
            return from_file(&p);
        }
    }
    if let (Some(host), Ok(token)) = (
        &env.service_host,
        std::fs::read_to_string(Path::new(SERVICE_ACCOUNT).join("token")),
    ) {
        let port = env.service_port.as_deref().unwrap_or("443");
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        return Ok(Cluster {
            server: format!("https://{host}:{port}"),
            tls: Tls {
                ca: std::fs::read(Path::new(SERVICE_ACCOUNT).join("ca.crt")).ok(),
                ..Tls::default()
            },
            token: Some(token.trim().to_owned()),
            source: "the pod's service account".into(),
        });
    }
    let default = env.home.clone().unwrap_or_default().join(".kube/config");
    if default.exists() {
        return from_file(&default);
    }
    Err(NodeError::Config(
        "no Kubernetes credentials: give --kubeconfig FILE (or set KUBECONFIG), or run inside a pod with a service account".into(),
    ))
}

/// YAML (or JSON, which is YAML) as a JSON value.
pub fn yaml_to_json(y: &Yaml) -> Value {
    match y {
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .filter_map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        Yaml::Boolean(b) => b.to_string(),
                        _ => return None,
                    };
                    Some((key, yaml_to_json(v)))
                })
                .collect(),
        ),
        Yaml::Array(a) => Value::Array(a.iter().map(yaml_to_json).collect()),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(r) => r
            .parse::<f64>()
            .map(Value::from)
            .unwrap_or(Value::String(r.clone())),
        Yaml::Boolean(b) => Value::Bool(*b),
        _ => Value::Null,
    }
}

fn from_file(path: &Path) -> Result<Cluster, NodeError> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| config_err(&source, e))?;
    let docs = YamlLoader::load_from_str(&text)
        .map_err(|e| config_err(&source, format!("not YAML: {e}")))?;
    let doc = docs.first().map(yaml_to_json).unwrap_or_default();
    let base = path.parent().unwrap_or(Path::new("."));
    parse(&doc, base, &source)
}

/// The current context of a kubeconfig document; relative file names are under `base`.
pub fn parse(doc: &Value, base: &Path, source: &str) -> Result<Cluster, NodeError> {
    let context_name = doc["current-context"].as_str().unwrap_or_default();
    let context = named(doc, "contexts", context_name).ok_or_else(|| {
        config_err(
            source,
            format!("no context {context_name:?} (current-context)"),
        )
    })?;
    let cluster_name = context["context"]["cluster"].as_str().unwrap_or_default();
    let user_name = context["context"]["user"].as_str().unwrap_or_default();
    let cluster = named(doc, "clusters", cluster_name)
        .ok_or_else(|| config_err(source, format!("no cluster {cluster_name:?}")))?;
    let cluster = &cluster["cluster"];
    let user = named(doc, "users", user_name).unwrap_or_default();
    let user = &user["user"];
    refuse_plugins(user, user_name, source)?;
    let token = token(user, base, source)?;
    let client = client_certificate(user, base, source)?;
    let server = cluster["server"]
        .as_str()
        .ok_or_else(|| config_err(source, format!("cluster {cluster_name:?} has no server")))?;
    Ok(Cluster {
        server: server.to_owned(),
        tls: Tls {
            ca: file_or_data(
                cluster,
                "certificate-authority",
                "certificate-authority-data",
                base,
                source,
            )?,
            insecure: cluster["insecure-skip-tls-verify"]
                .as_bool()
                .unwrap_or(false),
            client,
        },
        token,
        source: source.to_owned(),
    })
}

/// The entry called `name` of the document's list `list` (contexts, clusters, users).
fn named(doc: &Value, list: &str, name: &str) -> Option<Value> {
    doc[list]
        .as_array()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .cloned()
}

/// Bytes given inline (`data_key`, base64) or in a file (`file_key`, under `base`).
fn file_or_data(
    v: &Value,
    file_key: &str,
    data_key: &str,
    base: &Path,
    source: &str,
) -> Result<Option<Vec<u8>>, NodeError> {
    if let Some(data) = v[data_key].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| config_err(source, format!("{data_key} is not base64: {e}")))?;
        return Ok(Some(bytes));
    }
    match v[file_key].as_str() {
        Some(f) => {
            let p = base.join(f);
            std::fs::read(&p)
                .map(Some)
                .map_err(|e| config_err(source, format!("{file_key} {}: {e}", p.display())))
        }
        None => Ok(None),
    }
}

/// Users that log in through a program criu-gpu would have to run: refused, with what works.
fn refuse_plugins(user: &Value, user_name: &str, source: &str) -> Result<(), NodeError> {
    if user.get("exec").is_some() || user.get("auth-provider").is_some() {
        return Err(config_err(
            source,
            format!(
                "user {user_name:?} authenticates through an exec plugin or auth provider, which criu-gpu does not run; \
                 give a service account token instead: --token-file FILE (kubectl create token NAME)"
            ),
        ));
    }
    Ok(())
}

/// The user's bearer token: inline, or in its `tokenFile`.
fn token(user: &Value, base: &Path, source: &str) -> Result<Option<String>, NodeError> {
    Ok(match (user["token"].as_str(), user["tokenFile"].as_str()) {
        (Some(t), _) => Some(t.to_owned()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(base.join(f))
                .map_err(|e| config_err(source, format!("tokenFile {f}: {e}")))?
                .trim()
                .to_owned(),
        ),
        _ => None,
    })
}

/// A client certificate chain and its key, PEM (what `Tls::client` holds).
type CertAndKey = (Vec<u8>, Vec<u8>);

/// The user's client certificate and key, when it has both.
fn client_certificate(
    user: &Value,
    base: &Path,
    source: &str,
) -> Result<Option<CertAndKey>, NodeError> {
    Ok(
        match (
            file_or_data(
                user,
                "client-certificate",
                "client-certificate-data",
                base,
                source,
            )?,
            file_or_data(user, "client-key", "client-key-data", base, source)?,
        ) {
            (Some(c), Some(k)) => Some((c, k)),
            _ => None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
apiVersion: v1
kind: Config
current-context: admin@lab
clusters:
- name: lab
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: aGVsbG8=
contexts:
- name: admin@lab
  context: {cluster: lab, user: admin}
users:
- name: admin
  user:
    token: abc
- name: eks
  user:
    exec: {command: aws}
"#;

    fn doc(text: &str) -> Value {
        yaml_to_json(&YamlLoader::load_from_str(text).unwrap()[0])
    }

    #[test]
    fn the_current_context_gives_server_ca_and_token() {
        let c = parse(&doc(CONFIG), Path::new("/"), "test").unwrap();
        assert_eq!(c.server, "https://10.0.0.1:6443");
        assert_eq!(c.tls.ca.as_deref(), Some(&b"hello"[..]));
        assert_eq!(c.token.as_deref(), Some("abc"));
    }

    #[test]
    fn exec_plugins_are_refused_with_the_alternative() {
        let text = CONFIG.replace("user: admin}", "user: eks}");
        let e = parse(&doc(&text), Path::new("/"), "test")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("exec plugin") && e.contains("--token-file"),
            "{e}"
        );
    }

    /// The environment comes in as values: `$KUBECONFIG`'s first existing file, else
    /// `~/.kube/config` under the given home, else an error naming the ways to give one.
    #[test]
    fn the_environment_is_what_the_caller_passes() {
        let dir = tempfile::tempdir().unwrap();
        let listed = dir.path().join("listed");
        std::fs::write(&listed, CONFIG.replace("10.0.0.1", "10.0.0.2")).unwrap();
        std::fs::create_dir(dir.path().join(".kube")).unwrap();
        std::fs::write(dir.path().join(".kube/config"), CONFIG).unwrap();
        let missing = dir.path().join("missing");
        let list = std::env::join_paths([&missing, &listed]).unwrap();
        let env = KubeEnv {
            kubeconfig: Some(list),
            home: Some(dir.path().to_owned()),
            ..KubeEnv::default()
        };
        assert_eq!(load(None, &env).unwrap().server, "https://10.0.0.2:6443");
        let home_only = KubeEnv {
            kubeconfig: None,
            ..env
        };
        assert_eq!(
            load(None, &home_only).unwrap().server,
            "https://10.0.0.1:6443"
        );
        let e = load(None, &KubeEnv::default()).unwrap_err().to_string();
        assert!(
            e.contains("--kubeconfig") && e.contains("KUBECONFIG"),
            "{e}"
        );
    }
}
