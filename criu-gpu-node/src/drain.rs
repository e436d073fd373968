//! `node checkpoint` and `node drain`.
//!
//! The drain cordons first (no pod lands meanwhile), refuses before changing anything else what
//! would lose or duplicate work (a controller-owned pod without `--scale-down`, a controller
//! with pods on other nodes, a bare pod without `--force`), checkpoints every GPU container at
//! once, and only then scales controllers down and evicts. A failure before that point
//! uncordons the node; after it, the node stays cordoned and the message says why.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::kube::{Api, Controller, Kubelet};
use crate::pods::{self, GpuContainer};
use crate::progress::Board;
use crate::store::{ContainerRecord, Manifest, PodRecord, Store};
use crate::{checkpoint, Access, NodeError, Outcome, Summary};

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub access: Access,
    pub node: Option<String>,
    pub namespace: Option<String>,
    pub resources: Vec<String>,
    /// Checkpoints at once; 0: all.
    pub parallel: usize,
    pub store: Option<PathBuf>,
    pub dry_run: bool,
    pub json: bool,
    pub scale_down: bool,
    pub force: bool,
    pub drain_timeout: Duration,
}

/// The controller of each GPU pod, by (namespace, pod).
type Controllers = BTreeMap<(String, String), Controller>;

/// What the node runs, as the kubelet sees it.
struct Plan {
    pods: Vec<Value>,
    targets: Vec<GpuContainer>,
}

fn plan(kubelet: &Kubelet, o: &Options, s: &mut Summary) -> Result<Plan, NodeError> {
    let pods = kubelet.pods()?;
    let targets = pods::gpu_containers(&pods, o.namespace.as_deref(), &o.resources);
    s.step(
        format!(
            "{} GPU container(s) in {} pod(s) on {}",
            targets.len(),
            pods.len(),
            kubelet.ep.base
        ),
        o.json,
    );
    Ok(Plan { pods, targets })
}

/// `--dry-run`: the kubelet calls a checkpoint of the plan would make.
fn would_checkpoint(plan: &Plan, o: &Options, s: &mut Summary) {
    for t in &plan.targets {
        s.step(
            format!(
                "would POST /checkpoint/{}/{}/{}",
                t.namespace, t.pod, t.container
            ),
            o.json,
        );
    }
}

fn pod_of<'a>(pods: &'a [Value], ns: &str, name: &str) -> Option<&'a Value> {
    pods.iter()
        .find(|p| pods::ns_name(p) == (ns.to_owned(), name.to_owned()))
}

/// `node checkpoint`: every GPU container of the node, nothing else changed.
pub fn checkpoint(o: &Options) -> (Summary, Result<(), NodeError>) {
    let mut s = Summary::new("checkpoint", o.dry_run);
    let r = (|| {
        let kubelet = o.access.kubelet()?;
        let plan = plan(&kubelet, o, &mut s)?;
        if o.dry_run {
            would_checkpoint(&plan, o, &mut s);
            return Ok(());
        }
        let owners = owners_from_metadata(&plan);
        save(o, &kubelet, &plan, &owners, &mut s).map(|_| ())
    })();
    finish(s, r)
}

fn finish(mut s: Summary, r: Result<(), NodeError>) -> (Summary, Result<(), NodeError>) {
    if let Err(e) = &r {
        s.ok = false;
        s.error = Some(e.to_string());
    }
    (s, r)
}

/// Controllers named by the pods' owner references, unresolved (no API server).
fn owners_from_metadata(plan: &Plan) -> Controllers {
    let mut m = BTreeMap::new();
    for t in &plan.targets {
        if let Some(pod) = pod_of(&plan.pods, &t.namespace, &t.pod) {
            if let Some((kind, name)) = crate::kube::controller_ref(pod) {
                m.insert(
                    (t.namespace.clone(), t.pod.clone()),
                    Controller {
                        kind,
                        namespace: t.namespace.clone(),
                        name,
                        replicas: 0,
                        selector: String::new(),
                    },
                );
            }
        }
    }
    m
}

/// Checkpoints the plan's containers into the store, recording each as it lands.
fn save(
    o: &Options,
    kubelet: &Kubelet,
    plan: &Plan,
    controllers: &Controllers,
    s: &mut Summary,
) -> Result<Option<Store>, NodeError> {
    let store = match &o.store {
        Some(dir) => {
            let store = Store::create(dir, manifest(o, kubelet, plan, controllers))?;
            s.manifest = Some(dir.join(crate::store::MANIFEST).display().to_string());
            Some(store)
        }
        None => None,
    };
    let failed = checkpoint_targets(o, kubelet, store.as_ref(), plan, s);
    if let Some(st) = &store {
        st.update(|m| {
            m.state = if failed == 0 {
                "checkpointed".into()
            } else {
                "failed".into()
            }
        })?;
    }
    if failed > 0 {
        return Err(NodeError::Failed(format!(
            "{failed} GPU container(s) could not be checkpointed"
        )));
    }
    Ok(store)
}

/// The store's manifest before the checkpoints: each pod once (its spec and controller, for the
/// restore), with its containers to checkpoint.
fn manifest(o: &Options, kubelet: &Kubelet, plan: &Plan, controllers: &Controllers) -> Manifest {
    let mut m = Manifest {
        node: o.node.clone(),
        kubelet: kubelet.ep.base.clone(),
        state: "checkpointing".into(),
        ..Manifest::default()
    };
    for t in &plan.targets {
        let key = (t.namespace.clone(), t.pod.clone());
        let idx = match m
            .pods
            .iter()
            .position(|p| (p.namespace.clone(), p.name.clone()) == key)
        {
            Some(i) => i,
            None => {
                let pod = pod_of(&plan.pods, &t.namespace, &t.pod)
                    .cloned()
                    .unwrap_or_default();
                m.pods.push(PodRecord {
                    namespace: t.namespace.clone(),
                    name: t.pod.clone(),
                    uid: pod["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    spec: pods::clean_pod(&pod),
                    controller: controllers.get(&key).cloned(),
                    containers: Vec::new(),
                });
                m.pods.len() - 1
            }
        };
        m.pods[idx].containers.push(ContainerRecord {
            name: t.container.clone(),
            ..ContainerRecord::default()
        });
    }
    m
}

/// Checkpoints every target (`o.parallel` at a time, with a progress board) and records each
/// outcome in the summary; returns how many failed.
fn checkpoint_targets(
    o: &Options,
    kubelet: &Kubelet,
    store: Option<&Store>,
    plan: &Plan,
    s: &mut Summary,
) -> usize {
    let labels = plan
        .targets
        .iter()
        .map(|t| format!("{}/{}/{}", t.namespace, t.pod, t.container))
        .collect();
    let board = Board::new(labels, o.json);
    let results = checkpoint::all(kubelet, store, &plan.targets, o.parallel, &board);
    let (bytes, took) = board.finish();
    s.timing(bytes, took);
    let mut failed = 0;
    for (t, r) in plan.targets.iter().zip(results) {
        let (ok, to, size, error) = match r {
            Ok(saved) => (true, Some(saved.archive), Some(saved.bytes), None),
            Err(e) => {
                failed += 1;
                (false, None, None, Some(e.to_string()))
            }
        };
        s.containers.push(Outcome {
            namespace: t.namespace.clone(),
            pod: t.pod.clone(),
            container: t.container.clone(),
            ok,
            to,
            bytes: size,
            error,
        });
    }
    failed
}

/// `node drain NODE`.
pub fn drain(o: &Options) -> (Summary, Result<(), NodeError>) {
    let mut s = Summary::new("drain", o.dry_run);
    let node = o.node.clone().unwrap_or_default();
    let r = (|| {
        let api = o.access.api()?;
        let kubelet = o.access.kubelet()?;
        let was_cordoned = api.unschedulable(&node)?;
        if o.dry_run {
            return dry_run(o, &api, &kubelet, &node, was_cordoned, &mut s);
        }
        if was_cordoned {
            s.step(
                format!("node {node} was cordoned already (it stays cordoned whatever happens)"),
                o.json,
            );
        } else {
            api.set_unschedulable(&node, true)?;
            s.step(format!("cordoned node {node}"), o.json);
        }
        let undo = |s: &mut Summary, e: NodeError| -> NodeError {
            if was_cordoned {
                return e;
            }
            match api.set_unschedulable(&node, false) {
                Ok(()) => {
                    s.step(format!("uncordoned node {node}: nothing was evicted"), o.json);
                    NodeError::Failed(format!("{e}; node {node} is NOT drained (uncordoned again)"))
                }
                Err(u) => NodeError::Failed(format!(
                    "{e}; node {node} is NOT drained, and uncordoning it failed ({u}): kubectl uncordon {node}"
                )),
            }
        };
        let (plan, controllers) = match prepare(o, &api, &kubelet, &node, &mut s) {
            Ok(v) => v,
            Err(e) => return Err(undo(&mut s, e)),
        };
        if let Err(e) = save(o, &kubelet, &plan, &controllers, &mut s) {
            return Err(undo(&mut s, e));
        }
        let store = Store::open(o.store.as_deref().expect("drain has a store"))?;
        let stays = |e: NodeError| {
            NodeError::Failed(format!(
                "{e}; node {node} stays cordoned: its GPU workloads are checkpointed in {} (restore them with `criu-gpu node restore --store ...`); `kubectl uncordon {node}` when done",
                store.dir.display()
            ))
        };
        let mut scaled: Vec<Controller> = controllers.values().cloned().collect();
        scaled.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        scaled.dedup();
        for c in &scaled {
            // Recorded before it is done: a crash in between still leaves the record.
            store
                .update(|m| m.scaled_down.push(c.clone()))
                .map_err(stays)?;
            api.scale(c, 0).map_err(stays)?;
            s.step(
                format!("scaled {} from {} to 0 replicas", c.label(), c.replicas),
                o.json,
            );
        }
        store
            .update(|m| m.state = "draining".into())
            .map_err(stays)?;
        evict_all(o, &api, &node, &controllers, &mut s).map_err(stays)?;
        store
            .update(|m| m.state = "drained".into())
            .map_err(stays)?;
        s.step(format!("node {node} drained"), o.json);
        Ok(())
    })();
    finish(s, r)
}

/// After the cordon: the plan, each GPU pod's controller, and the refusals.
fn prepare(
    o: &Options,
    api: &Api,
    kubelet: &Kubelet,
    node: &str,
    s: &mut Summary,
) -> Result<(Plan, Controllers), NodeError> {
    let plan = plan(kubelet, o, s)?;
    let controllers = controllers_of(api, &plan)?;
    refusals(o, api, node, &plan, &controllers)?;
    Ok((plan, controllers))
}

fn controllers_of(api: &Api, plan: &Plan) -> Result<Controllers, NodeError> {
    let mut m = BTreeMap::new();
    for t in &plan.targets {
        let key = (t.namespace.clone(), t.pod.clone());
        if m.contains_key(&key) {
            continue;
        }
        if let Some(pod) = pod_of(&plan.pods, &t.namespace, &t.pod) {
            if let Some(c) = api.controller_of(pod)? {
                m.insert(key, c);
            }
        }
    }
    Ok(m)
}

/// What a drain must not do, found before anything but the cordon has changed.
fn refusals(
    o: &Options,
    api: &Api,
    node: &str,
    plan: &Plan,
    controllers: &Controllers,
) -> Result<(), NodeError> {
    let mut why = Vec::new();
    for ((ns, pod), c) in controllers {
        if !o.scale_down {
            why.push(format!(
                "{ns}/{pod} is owned by {}: evicted, its controller would start a fresh copy while the restore brings back the saved one. \
                 Pass --scale-down to scale {} to 0 after the checkpoint (the restore scales it back and it adopts the restored pod)",
                c.label(),
                c.name
            ));
        } else if !Api::can_scale(c) {
            why.push(format!("{ns}/{pod} is owned by {}, which criu-gpu cannot scale down (Deployments, StatefulSets and ReplicaSets only)", c.label()));
        } else {
            let elsewhere: Vec<String> =
                api.nodes_of(c)?.into_iter().filter(|n| n != node).collect();
            if !elsewhere.is_empty() {
                why.push(format!(
                    "{} also has pods on {}: scaling it down would stop them without a checkpoint; drain those nodes together or move the workload first",
                    c.label(),
                    elsewhere.join(", ")
                ));
            }
        }
    }
    let gpu_pods: Vec<(String, String)> = plan
        .targets
        .iter()
        .map(|t| (t.namespace.clone(), t.pod.clone()))
        .collect();
    let bare: Vec<String> = api
        .pods_on(node)?
        .iter()
        .filter(|p| !pods::drain_skips(p) && crate::kube::controller_ref(p).is_none())
        .map(pods::ns_name)
        .filter(|k| !gpu_pods.contains(k))
        .map(|(ns, n)| format!("{ns}/{n}"))
        .collect();
    if !bare.is_empty() && !o.force {
        why.push(format!(
            "pods without a controller would be deleted for good: {}; --force evicts them anyway",
            bare.join(", ")
        ));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(NodeError::Refused(format!(
            "drain refused: {}",
            why.join("; ")
        )))
    }
}

/// Evicts what is left on the node and waits until it is gone, within the drain timeout.
fn evict_all(
    o: &Options,
    api: &Api,
    node: &str,
    controllers: &Controllers,
    s: &mut Summary,
) -> Result<(), NodeError> {
    let deadline = Instant::now() + o.drain_timeout;
    let mut waiting: Vec<(String, String, String)> = Vec::new();
    for p in api.pods_on(node)? {
        if pods::drain_skips(&p) {
            continue;
        }
        let (ns, name) = pods::ns_name(&p);
        let uid = p["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        // Pods of scaled-down controllers are being deleted by them: only wait.
        if !controllers.contains_key(&(ns.clone(), name.clone())) {
            loop {
                if api.evict(&ns, &name)? {
                    s.step(format!("evicted {ns}/{name}"), o.json);
                    break;
                }
                if Instant::now() > deadline {
                    return Err(NodeError::Failed(format!(
                        "a PodDisruptionBudget kept refusing the eviction of {ns}/{name} for {} s",
                        o.drain_timeout.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        }
        waiting.push((ns, name, uid));
    }
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for (ns, name, uid) in waiting {
            if api.pod_exists(&ns, &name, &uid)? {
                still.push((ns, name, uid));
            }
        }
        waiting = still;
        if waiting.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let names: Vec<String> = waiting
                .iter()
                .map(|(ns, n, _)| format!("{ns}/{n}"))
                .collect();
            return Err(NodeError::Failed(format!(
                "pods still on the node after {} s: {}",
                o.drain_timeout.as_secs(),
                names.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

fn dry_run(
    o: &Options,
    api: &Api,
    kubelet: &Kubelet,
    node: &str,
    was_cordoned: bool,
    s: &mut Summary,
) -> Result<(), NodeError> {
    if !was_cordoned {
        s.step(format!("would cordon node {node}"), o.json);
    }
    let plan = plan(kubelet, o, s)?;
    let controllers = controllers_of(api, &plan)?;
    refusals(o, api, node, &plan, &controllers)?;
    would_checkpoint(&plan, o, s);
    for c in controllers.values() {
        s.step(
            format!(
                "would scale {} from {} to 0 replicas",
                c.label(),
                c.replicas
            ),
            o.json,
        );
    }
    for p in api.pods_on(node)? {
        let (ns, name) = pods::ns_name(&p);
        if !pods::drain_skips(&p) && !controllers.contains_key(&(ns.clone(), name.clone())) {
            s.step(format!("would evict {ns}/{name}"), o.json);
        }
    }
    s.step(format!("would drain node {node}"), o.json);
    Ok(())
}
