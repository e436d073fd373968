//! Pushing an OCI layout to a registry (the OCI distribution API: blob uploads, then the
//! manifest), with anonymous, basic or token authentication, so restores need no buildah.

use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;

use crate::http::{Endpoint, Reply, Tls};
use crate::oci::{Blob, Layout, MANIFEST};
use crate::NodeError;

pub struct Registry {
    ep: Endpoint,
    /// `host[:port]/prefix`, how pods name images from it.
    pub image_prefix: String,
    /// The repository path prefix inside the registry.
    prefix: String,
    credentials: Option<(String, String)>,
    auth: Mutex<Option<String>>,
}

impl Registry {
    /// `location` is `[https://|http://]host[:port][/prefix]`.
    pub fn new(
        location: &str,
        tls: &Tls,
        credentials: Option<(String, String)>,
    ) -> Result<Registry, NodeError> {
        let (scheme, rest) = match location.split_once("://") {
            Some((s, r)) => (s, r),
            None => ("https", location),
        };
        let rest = rest.trim_end_matches('/');
        let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            return Err(NodeError::Config(format!(
                "--registry {location:?}: no host"
            )));
        }
        Ok(Registry {
            ep: Endpoint::new(
                &format!("{scheme}://{host}"),
                tls,
                None,
                Duration::from_secs(3600),
            )?,
            image_prefix: rest.to_owned(),
            prefix: prefix.to_owned(),
            credentials,
            auth: Mutex::new(None),
        })
    }

    pub fn repository(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// Pushes the image as `repo:tag`; returns the reference pods use.
    pub fn push(&self, layout: &Layout, repo: &str, tag: &str) -> Result<String, NodeError> {
        for blob in [&layout.layer, &layout.config] {
            self.push_blob(repo, blob)?;
        }
        let bytes = std::fs::read(&layout.manifest.path)
            .map_err(|e| NodeError::store(&layout.manifest.path, e))?;
        let path = format!("/v2/{repo}/manifests/{tag}");
        let r =
            self.send(|ep, auth| ep.send("PUT", &path, auth, Some((MANIFEST, bytes.clone()))))?;
        self.expect(&r, &[200, 201], "PUT", &path)?;
        let host = self.image_prefix.split('/').next().unwrap_or_default();
        Ok(format!("{host}/{repo}:{tag}"))
    }

    fn push_blob(&self, repo: &str, blob: &Blob) -> Result<(), NodeError> {
        let head = format!("/v2/{repo}/blobs/{}", blob.digest);
        if self
            .send(|ep, auth| ep.send("HEAD", &head, auth, None))?
            .status
            == 200
        {
            return Ok(());
        }
        let start = format!("/v2/{repo}/blobs/uploads/");
        let r = self.send(|ep, auth| ep.send("POST", &start, auth, None))?;
        self.expect(&r, &[202], "POST", &start)?;
        let location = r.location.ok_or_else(|| {
            NodeError::Failed(format!("the registry gave no upload location for {repo}"))
        })?;
        let sep = if location.contains('?') { '&' } else { '?' };
        let put = format!("{location}{sep}digest={}", blob.digest.replace(':', "%3A"));
        let r = self.send(|ep, auth| {
            let f = std::fs::File::open(&blob.path).map_err(|e| {
                crate::http::HttpError::Unreachable {
                    url: blob.path.display().to_string(),
                    reason: e.to_string(),
                }
            })?;
            ep.put_file(&put, auth, f)
        })?;
        self.expect(&r, &[201, 204], "PUT", &put)
    }

    fn expect(&self, r: &Reply, ok: &[u16], method: &str, path: &str) -> Result<(), NodeError> {
        if ok.contains(&r.status) {
            Ok(())
        } else {
            Err(NodeError::Http(
                self.ep
                    .status_error(method, path, r)
                    .hint("pushing to the registry"),
            ))
        }
    }

    /// Sends with the current authorisation; on a 401, authenticates as the registry asks
    /// and sends once more.
    fn send(
        &self,
        f: impl Fn(&Endpoint, Option<&str>) -> Result<Reply, crate::http::HttpError>,
    ) -> Result<Reply, NodeError> {
        let auth = self.auth.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let r = f(&self.ep, auth.as_deref())?;
        if r.status != 401 {
            return Ok(r);
        }
        let challenge = r.authenticate.clone().unwrap_or_default();
        let fresh = self.authenticate(&challenge)?;
        *self.auth.lock().unwrap_or_else(|p| p.into_inner()) = Some(fresh.clone());
        Ok(f(&self.ep, Some(&fresh))?)
    }

    fn basic(&self) -> Option<String> {
        self.credentials.as_ref().map(|(u, p)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        })
    }

    fn authenticate(&self, challenge: &str) -> Result<String, NodeError> {
        let lower = challenge.to_ascii_lowercase();
        if lower.starts_with("basic") {
            return self.basic().ok_or_else(|| {
                NodeError::Config("the registry wants a user and password: --registry-credentials FILE (one line, user:password)".into())
            });
        }
        if !lower.starts_with("bearer") {
            return Err(NodeError::Config(format!(
                "the registry asks for an authentication this tool does not know: {challenge}"
            )));
        }
        let param = |name: &str| -> Option<String> {
            let at = challenge.find(&format!("{name}=\""))? + name.len() + 2;
            Some(challenge[at..].split('"').next()?.to_owned())
        };
        let realm = param("realm")
            .ok_or_else(|| NodeError::Failed(format!("bad registry challenge: {challenge}")))?;
        let mut url = realm.clone();
        let mut sep = if url.contains('?') { '&' } else { '?' };
        for k in ["service", "scope"] {
            if let Some(v) = param(k) {
                url.push_str(&format!(
                    "{sep}{k}={}",
                    v.replace(':', "%3A")
                        .replace(',', "%2C")
                        .replace('/', "%2F")
                ));
                sep = '&';
            }
        }
        let r = self.ep.send("GET", &url, self.basic().as_deref(), None)?;
        if r.status != 200 {
            return Err(NodeError::Http(
                self.ep
                    .status_error("GET", &url, &r)
                    .hint("getting a registry token: check --registry-credentials"),
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        v["token"]
            .as_str()
            .or(v["access_token"].as_str())
            .map(|t| format!("Bearer {t}"))
            .ok_or_else(|| NodeError::Failed(format!("{realm} gave no token")))
    }
}
