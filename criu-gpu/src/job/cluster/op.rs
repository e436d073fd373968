//! One operation (a dump or a restore) of a job across machines, as its nodes share it in etcd.
//!
//! Keys, under `/criu-gpu/jobs/JOB/`:
//! - `gen`: the last generation (a counter); `open`: the operation that runs now (kind,
//!   generation, node count), under its opener's liveness lease;
//! - `ops/GEN/node/RANK`: each node that joined, with its preflight (under its liveness lease:
//!   gone within a few seconds of the node's death);
//! - `ops/GEN/round/K/RANK`: lock round K's outcome on each node;
//! - `ops/GEN/dumped/RANK`, `ops/GEN/restored/RANK`: the barriers;
//! - `ops/GEN/commit` or `ops/GEN/abort`: the one decision (each written only if the other is
//!   not there).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use criu_gpu_image::cluster::{Answer, Report};
use cuda_checkpoint_ctl::ops::rounds::{Jitter, Next, Outcome, Policy, PAUSE};
use serde::{Deserialize, Serialize};

use super::phase::{self, Phases};
use super::store::{Keys, Store, Swap};
use super::watch::{self, Member};
use super::{ClusterError, Rdzv};
use crate::out;

/// Past a node's time left, its report of a round is late.
const ROUND_SLACK: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Dump,
    Restore,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Dump => "dump",
            Kind::Restore => "restore",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Open {
    kind: Kind,
    gen: u64,
    nnodes: u32,
}

/// A node of the operation, as it told the others when it joined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub rank: u32,
    pub host: String,
    pub addrs: Vec<std::net::IpAddr>,
    /// The address it reaches etcd from: its address on the job's network (moves.rs).
    #[serde(default)]
    pub via: Option<std::net::IpAddr>,
    /// A restore: the moves this node was given (`--address-map`), for every node.
    #[serde(default)]
    pub address_map: criu_gpu_image::addrmap::AddressMap,
    /// A restore: the generation of the part this node restores.
    pub part_gen: Option<u64>,
    /// What this node's preflight refused (empty: ready).
    pub problems: Vec<String>,
}

impl NodeInfo {
    pub fn name(&self) -> String {
        format!("node {} ({})", self.rank, self.host)
    }
}

/// An abort, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Abort {
    rank: u32,
    why: String,
}

/// The operation this node joined.
pub struct Op {
    store: Store,
    pub job: String,
    pub kind: Kind,
    pub gen: u64,
    pub nnodes: u32,
    pub rank: u32,
    /// `/criu-gpu/jobs/JOB/ops/GEN/`.
    prefix: String,
    /// The lock rounds' policy, fed the same outcomes on every node.
    policy: Mutex<Option<Policy>>,
    /// This node's processes, which must all be there when it votes at post-dump.
    members: Mutex<Vec<Member>>,
    /// A commit or an abort was seen.
    decided: AtomicBool,
    phases: Phases,
}

fn json<T: Serialize>(t: &T) -> Vec<u8> {
    serde_json::to_vec(t).unwrap_or_default()
}

fn parse<T: for<'a> Deserialize<'a>>(v: &[u8]) -> Option<T> {
    serde_json::from_slice(v).ok()
}

impl Op {
    /// Joins the job's running operation of this kind, or opens the next generation; registers
    /// this node in it. Refuses another kind running, another node count, a second node of this
    /// rank (a second dump of the job while one runs).
    pub fn join(
        store: Store,
        rdzv: &Rdzv,
        kind: Kind,
        nnodes: u32,
        rank: u32,
        me: &NodeInfo,
    ) -> Result<Op, ClusterError> {
        if rank >= nnodes {
            return Err(ClusterError::Rank { rank, nnodes });
        }
        let job = format!("/criu-gpu/jobs/{}/", rdzv.job);
        let open = open_or_join(&store, &job, kind, nnodes, &rdzv.job)?;
        let prefix = format!("{job}ops/{}/", open.gen);
        let node_key = format!("{prefix}node/{rank}");
        if !store.put_if_absent(&node_key, &json(me), &[&node_key], true)? {
            let (keys, _) = store.keys(&prefix)?;
            let holder = keys
                .get(&format!("node/{rank}"))
                .and_then(|v| parse::<NodeInfo>(v))
                .map_or(String::new(), |n| {
                    format!(" with node rank {rank} on {}", n.host)
                });
            return Err(ClusterError::Busy {
                job: rdzv.job.clone(),
                kind: kind.word().into(),
                gen: open.gen,
                with: holder,
            });
        }
        out::line(format!(
            "cluster: node {rank} of {nnodes} joined the {} of job {} (generation {}) through etcd at {}",
            kind.word(),
            rdzv.job,
            open.gen,
            store.endpoints()
        ));
        let _ = store.put(&format!("{prefix}{}", phase::key(rank)), b"joined", true);
        Ok(Op {
            store,
            job: rdzv.job.clone(),
            kind,
            gen: open.gen,
            nnodes,
            rank,
            prefix,
            policy: Mutex::new(None),
            members: Mutex::new(Vec::new()),
            decided: AtomicBool::new(false),
            phases: Phases::default(),
        })
    }

    /// The preflight barrier: waits for every node's preflight (at most `limit`); all of them,
    /// in rank order.
    pub fn exchange(&self, limit: Duration) -> Result<Vec<NodeInfo>, ClusterError> {
        let n = self.nnodes;
        let got = self.store.wait(&self.prefix, limit, |keys| {
            self.phases.show(keys, n);
            if let Some(a) = aborted(keys) {
                return Some(Err(a));
            }
            let nodes = nodes(keys);
            (nodes.len() as u32 == n).then_some(Ok(nodes))
        })?;
        match got {
            Some(Ok(nodes)) => {
                out::line(format!("cluster: all {n} nodes joined"));
                Ok(nodes)
            }
            Some(Err(a)) => Err(ClusterError::Aborted(a)),
            None => {
                let (keys, _) = self.store.keys(&self.prefix)?;
                let have: Vec<u32> = nodes(&keys).iter().map(|n| n.rank).collect();
                let waiting: Vec<String> = (0..n)
                    .filter(|r| !have.contains(r))
                    .map(|r| r.to_string())
                    .collect();
                let e = ClusterError::Missing {
                    job: self.job.clone(),
                    waiting: format!("node(s) {}", waiting.join(", ")),
                    limit,
                };
                self.abort(&e.to_string());
                Err(e)
            }
        }
    }

    /// This node's processes: a dump is voted complete only while all of them are there.
    pub fn hold_members(&self, members: Vec<Member>) {
        *self.members.lock().unwrap_or_else(|e| e.into_inner()) = members;
    }

    /// A commit or an abort was seen: the operation's outcome is settled.
    pub fn decided(&self) -> bool {
        self.decided.load(Ordering::Relaxed)
    }

    /// Tells the other nodes which phase this node is in (shown in their progress).
    pub fn phase(&self, what: &str) {
        let _ = self.store.put(
            &format!("{}{}", self.prefix, phase::key(self.rank)),
            what.as_bytes(),
            true,
        );
    }

    /// Records that the operation cannot go on (the first reason wins). Before the commit it is
    /// the abort; after it (a restore's steps past post-restore) a failure of those steps.
    pub fn abort(&self, why: &str) {
        self.decided.store(true, Ordering::Relaxed);
        let key = format!("{}abort", self.prefix);
        let commit = format!("{}commit", self.prefix);
        let failed = format!("{}failed", self.prefix);
        let a = Abort {
            rank: self.rank,
            why: why.to_owned(),
        };
        let put = self
            .store
            .put_if_absent(&key, &json(&a), &[&key, &commit], false)
            .and_then(|done| match done {
                true => Ok(true),
                false => self
                    .store
                    .put_if_absent(&failed, &json(&a), &[&key, &failed], false),
            });
        match put {
            Ok(true) => out::line(format!(
                "cluster: stopped the job's {}: {why}",
                self.kind.word()
            )),
            Ok(false) => {}
            Err(e) => out::line(format!(
                "cluster: could not tell the other nodes that this node stopped ({e}); they stop \
                 when its lease lapses"
            )),
        }
    }

    /// A lock round: this node's report in, the next step out, decided from every node's
    /// reports alike.
    pub fn round(&self, report: &Report) -> Answer {
        match self.decide_round(report) {
            Ok(next) => Answer::from(&next),
            Err(why) => {
                self.abort(&why);
                Answer::Stop { why }
            }
        }
    }

    fn decide_round(&self, report: &Report) -> Result<Next, String> {
        let k = report.round;
        self.phase(&match k {
            0 => "starting the lock rounds".to_owned(),
            k => format!("lock round {k}"),
        });
        let dir = format!("{}round/{k}/", self.prefix);
        self.store
            .put(&format!("{dir}{}", self.rank), &json(report), false)
            .map_err(|e| e.to_string())?;
        let limit = Duration::from_millis(report.left_ms) + ROUND_SLACK;
        let n = self.nnodes;
        let all = self
            .store
            .wait(&self.prefix, limit, |keys| {
                self.phases.show(keys, n);
                if let Some(a) = aborted(keys) {
                    return Some(Err(a));
                }
                let reports: Vec<(u32, Report)> = keys
                    .iter()
                    .filter_map(|(name, v)| {
                        let r = name.strip_prefix(&format!("round/{k}/"))?.parse().ok()?;
                        Some((r, parse::<Report>(v)?))
                    })
                    .collect();
                if reports.len() as u32 == n {
                    return Some(Ok(reports));
                }
                let live: Vec<u32> = nodes(keys).iter().map(|x| x.rank).collect();
                let gone = (0..n).find(|r| !live.contains(r) && !reports.iter().any(|x| x.0 == *r));
                gone.map(|r| Err(format!("node {r} went away during lock round {k}")))
            })
            .map_err(|e| e.to_string())?;
        let reports = match all {
            Some(r) => r?,
            None => return Err(format!("not every node reported lock round {k} in time")),
        };
        Ok(self.next_step(k, &reports))
    }

    /// The step after round `k` from all nodes' reports: the same on every node.
    fn next_step(&self, k: u32, reports: &[(u32, Report)]) -> Next {
        let left = reports.iter().map(|(_, r)| r.left_ms).min().unwrap_or(0);
        let left = Duration::from_millis(left);
        let mut policy = self.policy.lock().unwrap_or_else(|e| e.into_inner());
        let next = match reports
            .iter()
            .find(|(_, r)| r.outcome.is_some_and(|o| o.failed))
        {
            Some((r, _)) => Next::Stop(format!("a GPU lock failed on node {r}")),
            None if k == 0 => policy.insert(Policy::new(left)).first(left),
            None => {
                let mut sum = Outcome {
                    limit: Duration::ZERO,
                    locked: 0,
                    of: 0,
                    failed: false,
                };
                for o in reports.iter().filter_map(|(_, r)| r.outcome.as_ref()) {
                    sum.limit = sum.limit.max(Duration::from_millis(o.limit_ms));
                    sum.locked += o.locked;
                    sum.of += o.of;
                }
                let pause = Jitter::seeded(self.gen << 20 ^ k as u64).up_to(PAUSE);
                let p = policy.get_or_insert_with(|| Policy::new(left));
                let next = p.after(&sum, left, pause);
                out::line(format!(
                    "cluster: lock round {k}: {} of {} processes locked on {} nodes ({}); {}",
                    sum.locked,
                    sum.of,
                    reports.len(),
                    reports
                        .iter()
                        .filter_map(|(r, x)| x
                            .outcome
                            .map(|o| format!("node {r}: {}/{}", o.locked, o.of)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    match &next {
                        Next::Done => "every rank of the job is locked".to_owned(),
                        Next::Lock { pause, limit } => format!(
                            "again in {} ms, for up to {} ms",
                            pause.as_millis(),
                            limit.as_millis()
                        ),
                        Next::Stop(why) => why.clone(),
                    }
                ));
                next
            }
        };
        next
    }

    /// A barrier at CRIU's `stage` (post-dump, post-restore): this node is there; waits until
    /// every node is, at most `limit`. At post-dump, passing it is the commit: one for all.
    pub fn barrier(&self, stage: &str, limit: Duration) -> Result<(), String> {
        let name = match stage {
            "post-dump" => "dumped",
            "post-restore" => "restored",
            other => return Err(format!("no barrier at {other}")),
        };
        if stage == "post-dump" {
            let members = self
                .members
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(why) = watch::gone(&members) {
                self.abort(&why);
                return Err(why);
            }
        }
        self.arrive(name, stage, limit, true)
    }

    /// A barrier after the decision (`stage` in words, `name` its key): every node there, or
    /// an abort, or a node gone; at most `limit`.
    pub fn meet(&self, name: &str, stage: &str, limit: Duration) -> Result<(), String> {
        self.arrive(name, stage, limit, false)
    }

    /// This node at the barrier `name`; waits for every node. A `deciding` barrier is passed
    /// by the commit (a node that comes after it passes at once) and commits.
    fn arrive(
        &self,
        name: &str,
        stage: &str,
        limit: Duration,
        deciding: bool,
    ) -> Result<(), String> {
        self.phase(&format!("at {stage}"));
        self.store
            .put(&format!("{}{name}/{}", self.prefix, self.rank), b"1", false)
            .map_err(|e| e.to_string())?;
        out::line(format!(
            "cluster: node {} at {stage}, waiting for the others",
            self.rank
        ));
        let n = self.nnodes;
        let got = self
            .store
            .wait(&self.prefix, limit, |keys| {
                self.phases.show(keys, n);
                if deciding && keys.contains_key("commit") {
                    return Some(Ok(()));
                }
                if let Some(a) = aborted(keys) {
                    return Some(Err(a));
                }
                let there: Vec<u32> = keys
                    .keys()
                    .filter_map(|k| k.strip_prefix(&format!("{name}/"))?.parse().ok())
                    .collect();
                if there.len() as u32 == n {
                    return Some(Ok(()));
                }
                let live: Vec<u32> = nodes(keys).iter().map(|x| x.rank).collect();
                (0..n)
                    .find(|r| !live.contains(r) && !there.contains(r))
                    .map(|r| Err(format!("node {r} went away before {stage}")))
            })
            .map_err(|e| e.to_string());
        let result = match got {
            Ok(Some(Ok(()))) if deciding => self.commit(stage),
            Ok(Some(r)) => r,
            Ok(None) => Err(format!(
                "not every node reached {stage} within {} s",
                limit.as_secs()
            )),
            Err(e) => Err(e),
        };
        match &result {
            Ok(()) => {
                self.phase(&format!("past {stage}"));
                out::line(format!("cluster: every node passed {stage}"))
            }
            Err(why) => {
                out::line(format!("cluster: the job cannot pass {stage}: {why}"));
                self.abort(why);
            }
        }
        result
    }

    /// The decision, once every node passed: a commit, unless an abort came first (after it,
    /// the operation is over for a node that joins later).
    fn commit(&self, _stage: &str) -> Result<(), String> {
        let key = format!("{}commit", self.prefix);
        let abort = format!("{}abort", self.prefix);
        match self.store.put_if_absent(&key, b"1", &[&abort], false) {
            Ok(true) => {
                self.decided.store(true, Ordering::Relaxed);
                Ok(())
            }
            Ok(false) => {
                let (keys, _) = self.store.keys(&self.prefix).map_err(|e| e.to_string())?;
                Err(aborted(&keys).unwrap_or_else(|| "the dump was stopped".into()))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Leaves the operation: this node's liveness keys go; the records stay a while.
    pub fn leave(&self) {
        self.store.close();
    }
}

/// The nodes that joined, in rank order.
fn nodes(keys: &Keys) -> Vec<NodeInfo> {
    keys.iter()
        .filter(|(k, _)| k.starts_with("node/"))
        .filter_map(|(_, v)| parse::<NodeInfo>(v))
        .map(|n| (n.rank, n))
        .collect::<std::collections::BTreeMap<u32, NodeInfo>>()
        .into_values()
        .collect()
}

/// The abort, or a failure after the commit.
fn aborted(keys: &Keys) -> Option<String> {
    let a = parse::<Abort>(keys.get("abort").or_else(|| keys.get("failed"))?)?;
    Some(format!("node {}: {}", a.rank, a.why))
}

/// The running operation of the job, or a new generation opened by this node.
fn open_or_join(
    store: &Store,
    job: &str,
    kind: Kind,
    nnodes: u32,
    name: &str,
) -> Result<Open, ClusterError> {
    let open_key = format!("{job}open");
    let gen_key = format!("{job}gen");
    loop {
        let (keys, _) = store.keys(job)?;
        if let Some(open) = keys.get("open").and_then(|v| parse::<Open>(v)) {
            let over = ["commit", "abort"]
                .iter()
                .any(|k| keys.contains_key(&format!("ops/{}/{k}", open.gen)));
            if !over {
                if open.kind != kind {
                    return Err(ClusterError::Busy {
                        job: name.into(),
                        kind: open.kind.word().into(),
                        gen: open.gen,
                        with: String::new(),
                    });
                }
                if open.nnodes != nnodes {
                    return Err(ClusterError::NodeCount {
                        job: name.into(),
                        mine: nnodes,
                        theirs: open.nnodes,
                        who: format!("the node that opened generation {}", open.gen),
                    });
                }
                return Ok(open);
            }
        }
        let last: Option<&[u8]> = keys.get("gen").map(Vec::as_slice);
        let gen = last
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
            .unwrap_or(0)
            + 1;
        let open = Open { kind, gen, nnodes };
        // The next generation and the running operation (under this node's liveness lease:
        // replaced when it is over) in one transaction: of nodes that open at once, one opens it
        // and the others join it, and no generation number is left unused.
        let prev: Option<&[u8]> = keys.get("open").map(Vec::as_slice);
        let (gen_text, open_json) = (gen.to_string(), json(&open));
        let swaps = [
            Swap {
                key: &gen_key,
                was: last,
                value: gen_text.as_bytes(),
                live: false,
            },
            Swap {
                key: &open_key,
                was: prev,
                value: &open_json,
                live: true,
            },
        ];
        if store.swap_all(&swaps)? {
            return Ok(open);
        }
    }
}
