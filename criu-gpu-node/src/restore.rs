//! `node restore`: each saved container becomes a checkpoint image (the OCI image CRI-O
//! restores from, written by [`crate::oci`], the layer a hard link to the archive), pushed to a
//! registry; each pod is created again with those images, and the controllers the drain
//! scaled down are scaled back once their pods exist, so they adopt them instead of starting
//! fresh copies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::http::Tls;
use crate::kube::{Api, Controller};
use crate::oci::{self, ImageSpec, CRIO_CHECKPOINT_NAME};
use crate::registry::Registry;
use crate::store::{ContainerRecord, Manifest, PodRecord, Status, Store};
use crate::{Access, NodeError, Outcome, Summary};

/// Why this node cannot restore a checkpoint archive, if it cannot. The command line supplies
/// it: it reads archives and loads the GPU drivers, which this crate does not.
#[derive(Clone)]
pub struct ArchiveCheck(pub Arc<Check>);

/// What an [`ArchiveCheck`] runs: the archive's path in, why not out.
pub type Check = dyn Fn(&Path) -> Result<(), String> + Send + Sync;

impl std::fmt::Debug for ArchiveCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArchiveCheck")
    }
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub access: Access,
    pub store: PathBuf,
    pub registry: Option<String>,
    pub registry_tls: Tls,
    pub registry_credentials: Option<PathBuf>,
    pub tag: String,
    pub node: Option<String>,
    /// `--check`: the restore checks on this node, run on each archive before anything is pushed.
    pub check: Option<ArchiveCheck>,
    /// Restore pods whose controller was not scaled down, as bare pods.
    pub include_owned: bool,
    pub dry_run: bool,
    pub json: bool,
}

pub fn restore(o: &Options) -> (Summary, Result<(), NodeError>) {
    let mut s = Summary::new("restore", o.dry_run);
    let r = run(o, &mut s);
    if let Err(e) = &r {
        s.ok = false;
        s.error = Some(e.to_string());
    }
    (s, r)
}

fn credentials(o: &Options) -> Result<Option<(String, String)>, NodeError> {
    let Some(path) = &o.registry_credentials else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        NodeError::Config(format!("--registry-credentials {}: {e}", path.display()))
    })?;
    let (u, p) = text.trim().split_once(':').ok_or_else(|| {
        NodeError::Config(format!(
            "--registry-credentials {}: expected one line user:password",
            path.display()
        ))
    })?;
    Ok(Some((u.to_owned(), p.to_owned())))
}

fn run(o: &Options, s: &mut Summary) -> Result<(), NodeError> {
    let store = Store::open(&o.store)?;
    s.manifest = Some(store.dir.join(crate::store::MANIFEST).display().to_string());
    let m = store.snapshot();
    say_saved(&store, &m, o, s);
    let location = o.registry.as_deref().ok_or_else(|| {
        NodeError::Config("--registry is needed: where to push the checkpoint images".into())
    })?;
    let registry = Registry::new(location, &o.registry_tls, credentials(o)?)?;
    let api = if o.dry_run {
        None
    } else {
        Some(o.access.api()?)
    };
    let restored = restore_pods(o, &store, &registry, api.as_ref(), &m, s);
    scale_back(o, api.as_ref(), &m, &restored, s)?;
    let failed = s.containers.iter().filter(|c| !c.ok).count();
    if failed > 0 {
        return Err(NodeError::Failed(format!(
            "{failed} container(s) not restored; see above"
        )));
    }
    Ok(())
}

/// How many containers the store holds ready to restore.
fn say_saved(store: &Store, m: &Manifest, o: &Options, s: &mut Summary) {
    let saved: usize = m
        .pods
        .iter()
        .flat_map(|p| &p.containers)
        .filter(|c| c.status == Status::Saved)
        .count();
    s.step(
        format!(
            "{saved} saved GPU container(s) in {} pod(s) in {}",
            m.pods.len(),
            store.dir.display()
        ),
        o.json,
    );
}

/// Restores each pod of the store, going on past the ones that fail; returns those restored
/// (namespace, name).
fn restore_pods(
    o: &Options,
    store: &Store,
    registry: &Registry,
    api: Option<&Api>,
    m: &Manifest,
    s: &mut Summary,
) -> Vec<(String, String)> {
    let mut restored: Vec<(String, String)> = Vec::new();
    for pod in &m.pods {
        let before = s.containers.len();
        let result = restore_pod(o, store, registry, api, &m.scaled_down, pod, s);
        match result {
            Ok(()) => restored.push((pod.namespace.clone(), pod.name.clone())),
            Err(e) => pod_failed(o, pod, before, &e.to_string(), s),
        }
    }
    restored
}

/// Records a pod's failure: on its containers reported since `before`, and said.
fn pod_failed(o: &Options, pod: &PodRecord, before: usize, why: &str, s: &mut Summary) {
    // Containers not reported yet share the pod's failure.
    for c in &pod.containers {
        if !s.containers[before..].iter().any(|o| o.container == c.name) {
            s.containers
                .push(outcome(pod, &c.name, None, Some(why.to_owned())));
        } else if let Some(x) = s.containers[before..]
            .iter_mut()
            .find(|o| o.container == c.name && o.ok)
        {
            x.ok = false;
            x.error = Some(format!("pod not created: {why}"));
        }
    }
    let line = format!("{}/{}: FAILED: {why}", pod.namespace, pod.name);
    if o.json {
        eprintln!("{line}");
    } else {
        crate::screen::line(line);
    }
}

/// Scales the controllers the drain scaled down back up, each only once all its pods are back
/// (it adopts them then, instead of starting fresh copies).
fn scale_back(
    o: &Options,
    api: Option<&Api>,
    m: &Manifest,
    restored: &[(String, String)],
    s: &mut Summary,
) -> Result<(), NodeError> {
    for c in &m.scaled_down {
        let all_back = m
            .pods
            .iter()
            .filter(|p| p.controller.as_ref() == Some(c))
            .all(|p| restored.contains(&(p.namespace.clone(), p.name.clone())));
        if !all_back {
            s.step(
                format!(
                    "left {} at 0 replicas: not all of its pods were restored",
                    c.label()
                ),
                o.json,
            );
        } else if let Some(api) = api {
            api.scale(c, c.replicas)?;
            s.step(
                format!(
                    "scaled {} back to {} replica(s); it adopts the restored pods",
                    c.label(),
                    c.replicas
                ),
                o.json,
            );
        } else {
            s.step(
                format!(
                    "would scale {} back to {} replica(s)",
                    c.label(),
                    c.replicas
                ),
                o.json,
            );
        }
    }
    Ok(())
}

fn outcome(pod: &PodRecord, container: &str, to: Option<String>, error: Option<String>) -> Outcome {
    Outcome {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        container: container.to_owned(),
        ok: error.is_none(),
        to,
        bytes: None,
        error,
    }
}

fn restore_pod(
    o: &Options,
    store: &Store,
    registry: &Registry,
    api: Option<&Api>,
    scaled_down: &[Controller],
    pod: &PodRecord,
    s: &mut Summary,
) -> Result<(), NodeError> {
    refuse_unrestorable(o, scaled_down, pod)?;
    let mut images = BTreeMap::new();
    for c in &pod.containers {
        let image = checkpoint_image(o, store, registry, pod, c, s)?;
        images.insert(c.name.clone(), image);
    }
    let spec = pod_spec(pod, &images, o.node.as_deref());
    let Some(api) = api else {
        s.step(
            format!(
                "would create pod {}/{}{}",
                pod.namespace,
                pod.name,
                o.node
                    .as_deref()
                    .map(|n| format!(" on {n}"))
                    .unwrap_or_default()
            ),
            o.json,
        );
        for c in &pod.containers {
            s.containers
                .push(outcome(pod, &c.name, images.get(&c.name).cloned(), None));
        }
        return Ok(());
    };
    create_pod(o, store, api, pod, &spec, s)
}

/// A pod a restore would duplicate (its controller still runs it) or cannot make whole (a
/// container not saved).
fn refuse_unrestorable(
    o: &Options,
    scaled_down: &[Controller],
    pod: &PodRecord,
) -> Result<(), NodeError> {
    if let Some(c) = &pod.controller {
        if !scaled_down.contains(c) && !o.include_owned {
            return Err(NodeError::Refused(format!(
                "owned by {}, which was not scaled down (the store comes from `node checkpoint`, or a drain without --scale-down): \
                 the controller keeps its own copy, so a restore would duplicate it. Scale it to 0 first and pass --include-owned",
                c.label()
            )));
        }
    }
    if let Some(c) = pod.containers.iter().find(|c| c.status != Status::Saved) {
        return Err(NodeError::Failed(format!(
            "container {} was not saved ({:?}{})",
            c.name,
            c.status,
            c.error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        )));
    }
    Ok(())
}

/// The checkpoint image of container `c`, built from its archive and pushed (with a dry run,
/// the reference it would have); returns the image to run.
fn checkpoint_image(
    o: &Options,
    store: &Store,
    registry: &Registry,
    pod: &PodRecord,
    c: &ContainerRecord,
    s: &mut Summary,
) -> Result<String, NodeError> {
    let archive = store.resolve(c.archive.as_deref().unwrap_or_default());
    if !archive.is_file() {
        return Err(NodeError::Failed(format!(
            "the archive {} is missing from the store",
            archive.display()
        )));
    }
    let repo = registry.repository(&format!("checkpoint-{}-{}", pod.name, c.name).to_lowercase());
    let reference = format!(
        "{}/{repo}:{}",
        registry.image_prefix.split('/').next().unwrap_or_default(),
        o.tag
    );
    if o.dry_run {
        s.step(
            format!(
                "would build {reference} from {} and push it",
                archive.display()
            ),
            o.json,
        );
        return Ok(reference);
    }
    if let Some(check) = &o.check {
        (check.0)(&archive).map_err(|why| {
            NodeError::Refused(format!("this node cannot restore {}: {why}", c.name))
        })?;
    }
    let dir = store
        .dir
        .join("images")
        .join(format!("{}-{}-{}", pod.namespace, pod.name, c.name));
    let layout = oci::write_layout(&dir, &archive, None, &image_spec(pod, &c.name, &reference))
        .map_err(|e| NodeError::store(&dir, e))?;
    if let Some(want) = &c.sha256 {
        if &layout.layer.digest != want {
            return Err(NodeError::Failed(format!(
                "{} changed since it was saved (sha256 {}, recorded {want}): copy it again from the node",
                archive.display(),
                layout.layer.digest
            )));
        }
    }
    let pushed = registry.push(&layout, &repo, &o.tag)?;
    s.step(
        format!("{}/{}/{}: pushed {pushed}", pod.namespace, pod.name, c.name),
        o.json,
    );
    s.containers
        .push(outcome(pod, &c.name, Some(pushed.clone()), None));
    Ok(pushed)
}

/// The pod as saved, running the checkpoint images (on `node`, when given).
fn pod_spec(pod: &PodRecord, images: &BTreeMap<String, String>, node: Option<&str>) -> Value {
    let mut spec = pod.spec.clone();
    for c in spec["spec"]["containers"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if let Some(image) = c["name"].as_str().and_then(|n| images.get(n)) {
            c["image"] = Value::String(image.clone());
        }
    }
    if let Some(node) = node {
        spec["spec"]["nodeName"] = Value::String(node.to_owned());
    }
    spec
}

/// Creates the pod, its spec kept in the store first (what was asked of the API server).
fn create_pod(
    o: &Options,
    store: &Store,
    api: &Api,
    pod: &PodRecord,
    spec: &Value,
    s: &mut Summary,
) -> Result<(), NodeError> {
    let saved = store
        .dir
        .join("pods")
        .join(format!("{}-{}.json", pod.namespace, pod.name));
    let _ = std::fs::create_dir_all(store.dir.join("pods"));
    std::fs::write(&saved, serde_json::to_vec_pretty(spec).unwrap_or_default())
        .map_err(|e| NodeError::store(&saved, e))?;
    api.create_pod(&pod.namespace, spec)?;
    s.step(
        format!(
            "created pod {}/{} from its checkpoint images",
            pod.namespace, pod.name
        ),
        o.json,
    );
    Ok(())
}

/// The annotations CRI-O (and checkpointctl-era tools) read from a checkpoint image.
fn image_spec(pod: &PodRecord, container: &str, reference: &str) -> ImageSpec {
    let original = pod.spec["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"].as_str() == Some(container))
        .and_then(|c| c["image"].as_str())
        .unwrap_or_default();
    let mut a = BTreeMap::new();
    a.insert(CRIO_CHECKPOINT_NAME.to_owned(), container.to_owned());
    a.insert(
        "org.criu.checkpoint.container.name".into(),
        container.to_owned(),
    );
    a.insert("org.criu.checkpoint.pod.name".into(), pod.name.clone());
    a.insert(
        "org.criu.checkpoint.pod.namespace".into(),
        pod.namespace.clone(),
    );
    if !original.is_empty() {
        a.insert(
            "org.criu.checkpoint.rootfsImageName".into(),
            original.to_owned(),
        );
    }
    ImageSpec {
        reference: reference.to_owned(),
        annotations: a,
        runtime_config: serde_json::json!({}),
    }
}
