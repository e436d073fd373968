//! A job across machines: `criu-gpu dump|restore --nnodes N --node-rank R --rdzv
//! etcd://HOST:PORT/JOB`, run on every node, checkpoints or restores the node's part of one job,
//! all nodes as one. The nodes meet in etcd, never in a server of ours ([`store`]); each
//! operation of a job is a generation of its own ([`op`]): the nodes join it and exchange
//! their preflights before anything is frozen, decide each GPU lock round together (the plugin
//! asks this node's `criu-gpu` over a unix socket, [`serve`]), and pass barriers at CRIU's
//! post-dump (no node's processes end before every node's dump is complete: a commit or an
//! abort, one for all) and post-restore (every node's sockets are back before any node's
//! network lock goes). Each part carries the job's identity ([`part`]). The protocol is in
//! docs/design.md.

pub mod dump;
pub mod hold;
pub mod liveness;
pub mod moves;
pub mod op;
pub mod part;
pub mod phase;
pub mod restore;
pub mod serve;
pub mod store;
pub mod torchrun;
pub mod watch;

use std::time::Duration;

/// Where the nodes meet: `etcd://HOST:PORT[,HOST:PORT...]/JOB`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rdzv {
    pub endpoints: Vec<String>,
    pub job: String,
}

impl std::str::FromStr for Rdzv {
    type Err = String;

    fn from_str(s: &str) -> Result<Rdzv, String> {
        let rest = s.strip_prefix("etcd://").ok_or_else(|| {
            format!("{s:?}: expected etcd://HOST:PORT/JOB (the job's name in etcd)")
        })?;
        let (hosts, job) = rest
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: no job name: etcd://HOST:PORT/JOB"))?;
        let ok_name = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if job.is_empty() || !job.chars().all(ok_name) {
            return Err(format!(
                "{s:?}: the job's name {job:?} must be letters, digits, '-', '_' or '.'"
            ));
        }
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        if endpoints.is_empty() {
            return Err(format!("{s:?}: no etcd endpoint: etcd://HOST:PORT/JOB"));
        }
        Ok(Rdzv {
            endpoints,
            job: job.to_owned(),
        })
    }
}

/// The options of a job across machines.
#[derive(Debug, Clone)]
pub struct Across {
    pub nnodes: u32,
    /// This node's rank (a restore takes it from its part when not given).
    pub node_rank: Option<u32>,
    pub rdzv: Rdzv,
    /// How long a node waits for the others to join, and at each barrier.
    pub timeout: Duration,
}

/// What goes wrong between the nodes, in the operator's words.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "{0}; start etcd there, or name the right endpoint in --rdzv etcd://HOST:PORT/JOB; \
         nothing was done"
    )]
    Etcd(#[from] store::StoreError),
    #[error(
        "this node was started with --nnodes {mine}, but {who} joined job {job} with --nnodes \
         {theirs}: start every node with the same --nnodes; nothing was done"
    )]
    NodeCount {
        job: String,
        mine: u32,
        theirs: u32,
        who: String,
    },
    #[error(
        "a {kind} of job {job} (generation {gen}) is running{with}: wait for it to end (or for its \
         nodes' leases to lapse, {ttl} s after they are gone), then try again; nothing was done",
        ttl = store::TTL
    )]
    Busy {
        job: String,
        kind: String,
        gen: u64,
        with: String,
    },
    #[error("--node-rank {rank} is not below --nnodes {nnodes}")]
    Rank { rank: u32, nnodes: u32 },
    #[error(
        "{waiting} of job {job} did not join within {} s: start `criu-gpu` on every node \
         (or raise --rdzv-timeout); nothing was done", .limit.as_secs()
    )]
    Missing {
        job: String,
        waiting: String,
        limit: Duration,
    },
    #[error("the job's other nodes stopped it: {0}")]
    Aborted(String),
    #[error("{0}")]
    Part(String),
}

/// This machine's name, as the other nodes see it in messages.
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// This node's addresses (IPv4 and IPv6, loopback left out), from its interfaces.
pub fn addresses() -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    let v4 = std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default();
    // "|-- 10.0.0.1" followed by "/32 host LOCAL": the node's own IPv4 addresses.
    let lines: Vec<&str> = v4.lines().collect();
    for w in lines.windows(2) {
        if w[1].contains("/32 host LOCAL") {
            if let Some(ip) = w[0].trim().strip_prefix("|-- ") {
                if let Ok(ip) = ip.parse::<std::net::IpAddr>() {
                    if !ip.is_loopback() && !out.contains(&ip) {
                        out.push(ip);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_rendezvous_as_torchrun_users_write_it() {
        let r: Rdzv = "etcd://10.0.0.9:2379/train-7".parse().unwrap();
        assert_eq!(r.endpoints, vec!["http://10.0.0.9:2379"]);
        assert_eq!(r.job, "train-7");
        let r: Rdzv = "etcd://a:1,b:2/j".parse().unwrap();
        assert_eq!(r.endpoints.len(), 2);
        for bad in [
            "10.0.0.9:2379/j",
            "etcd://h:1",
            "etcd://h:1/",
            "etcd:///j",
            "etcd://h:1/a/b",
        ] {
            assert!(bad.parse::<Rdzv>().is_err(), "{bad}");
        }
    }
}
