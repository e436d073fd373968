//! HTTPS to the kubelet, the API server and registries, through `ureq` with rustls: one static
//! binary that needs neither kubectl nor Python on the node (Talos, Bottlerocket, Flatcar and
//! distroless DaemonSets have neither). Every call is bounded by a timeout.

use std::time::Duration;

use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
use ureq::Agent;

/// How to trust a server and prove who we are.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// PEM CA bundle; the web's roots when absent.
    pub ca: Option<Vec<u8>>,
    /// Skip verifying the server's certificate (kubelets serve self-signed ones).
    pub insecure: bool,
    /// PEM client certificate chain and key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum HttpError {
    #[error("{url} is unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{method} {url}: HTTP {status}: {body}{hint}")]
    Status {
        method: String,
        url: String,
        status: u16,
        body: String,
        hint: String,
    },
    #[error("{0}")]
    Certificates(String),
}

impl HttpError {
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Adds an explanation to an HTTP error.
    pub fn hint(mut self, text: &str) -> HttpError {
        if let HttpError::Status { hint, .. } = &mut self {
            *hint = format!(" ({text})");
        }
        self
    }
}

/// A reply: status, the headers asked for, body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub location: Option<String>,
    pub authenticate: Option<String>,
    pub body: Vec<u8>,
}

/// One server, its credentials and a time limit per call.
#[derive(Clone)]
pub struct Endpoint {
    pub base: String,
    token: Option<String>,
    tls: TlsConfig,
    agent: Agent,
}

fn certificates(
    pem: &[u8],
    what: &str,
) -> Result<(Vec<Certificate<'static>>, Option<PrivateKey<'static>>), HttpError> {
    let mut certs = Vec::new();
    let mut key = None;
    for item in ureq::tls::parse_pem(pem) {
        match item.map_err(|e| HttpError::Certificates(format!("{what}: not valid PEM ({e})")))? {
            PemItem::Certificate(c) => certs.push(c),
            PemItem::PrivateKey(k) => key = Some(k),
            _ => {}
        }
    }
    Ok((certs, key))
}

impl Endpoint {
    pub fn new(
        base: &str,
        tls: &Tls,
        token: Option<String>,
        timeout: Duration,
    ) -> Result<Endpoint, HttpError> {
        let mut b = TlsConfig::builder().disable_verification(tls.insecure);
        if let Some(ca) = &tls.ca {
            let (certs, _) = certificates(ca, "the CA bundle")?;
            if certs.is_empty() {
                return Err(HttpError::Certificates(
                    "the CA bundle holds no certificate".into(),
                ));
            }
            b = b.root_certs(RootCerts::new_with_certs(&certs));
        }
        if let Some((cert, key)) = &tls.client {
            let (chain, _) = certificates(cert, "the client certificate")?;
            let (_, key) = certificates(key, "the client key")?;
            let key = key.ok_or_else(|| {
                HttpError::Certificates("the client key file holds no private key".into())
            })?;
            b = b.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
        }
        let tls = b.build();
        Ok(Endpoint {
            base: base.trim_end_matches('/').to_owned(),
            agent: agent(&tls, timeout),
            tls,
            token,
        })
    }

    /// The same endpoint with another time limit per call.
    pub fn with_timeout(&self, timeout: Duration) -> Endpoint {
        Endpoint {
            agent: agent(&self.tls, timeout),
            ..self.clone()
        }
    }

    pub fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_owned()
        } else {
            format!("{}{path}", self.base)
        }
    }

    /// A call whose reply must be 2xx; returns the body.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Vec<u8>, HttpError> {
        let reply = self.send(method, path, None, body)?;
        if (200..300).contains(&reply.status) {
            Ok(reply.body)
        } else {
            Err(self.status_error(method, path, &reply))
        }
    }

    pub fn status_error(&self, method: &str, path: &str, reply: &Reply) -> HttpError {
        let text = String::from_utf8_lossy(&reply.body);
        // The API server answers with a Status object; its message is what operators need.
        let body = serde_json::from_slice::<serde_json::Value>(&reply.body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| text.trim().chars().take(500).collect());
        HttpError::Status {
            method: method.to_owned(),
            url: self.url(path),
            status: reply.status,
            body,
            hint: String::new(),
        }
    }

    /// A call with any reply; `auth` replaces the endpoint's bearer token.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Reply, HttpError> {
        let (ctype, bytes) = body.unwrap_or(("", Vec::new()));
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(path));
        if !ctype.is_empty() {
            req = req.header("Content-Type", ctype);
        }
        self.run(self.authorise(req, auth), bytes, path)
    }

    /// A PUT of a file as the body.
    pub fn put_file(
        &self,
        path: &str,
        auth: Option<&str>,
        file: std::fs::File,
    ) -> Result<Reply, HttpError> {
        let req = ureq::http::Request::builder()
            .method("PUT")
            .uri(self.url(path))
            .header("Content-Type", "application/octet-stream");
        self.run(self.authorise(req, auth), file, path)
    }

    fn authorise(
        &self,
        req: ureq::http::request::Builder,
        auth: Option<&str>,
    ) -> ureq::http::request::Builder {
        match (auth, &self.token) {
            (Some(a), _) => req.header("Authorization", a),
            (None, Some(t)) => req.header("Authorization", format!("Bearer {t}")),
            (None, None) => req,
        }
    }

    fn run(
        &self,
        req: ureq::http::request::Builder,
        body: impl ureq::AsSendBody,
        path: &str,
    ) -> Result<Reply, HttpError> {
        let url = self.url(path);
        let req = req
            .header("Accept", "application/json, */*")
            .body(body)
            .map_err(|e| HttpError::Unreachable {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let mut resp = self.agent.run(req).map_err(|e| HttpError::Unreachable {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let location = header("location");
        let authenticate = header("www-authenticate");
        let body = resp
            .body_mut()
            .with_config()
            .limit(512 << 20)
            .read_to_vec()
            .map_err(|e| HttpError::Unreachable {
                url,
                reason: format!("reading the reply: {e}"),
            })?;
        Ok(Reply {
            status: resp.status().as_u16(),
            location,
            authenticate,
            body,
        })
    }
}

fn agent(tls: &TlsConfig, timeout: Duration) -> Agent {
    Agent::config_builder()
        .tls_config(tls.clone())
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(10)))
        .timeout_global(Some(timeout))
        .build()
        .into()
}
