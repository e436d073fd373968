//! A node's part of a job across machines: which job, which generation (the dump that made
//! it), which node of how many, and the other nodes as they were. A restore refuses a part of
//! another job, or parts of different dumps, by name. Checksummed like the other records.

use std::path::Path;

use criu_gpu_image::record::{self, RecordError};
use serde::{Deserialize, Serialize};

use super::op::NodeInfo;
use super::torchrun::Agent;

pub const FILE: &str = "criu-gpu-cluster.json";
const FORMAT: &str = "criu-gpu/cluster-part";
const VERSION: u32 = 1;

/// A node as the part remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub rank: u32,
    pub host: String,
    pub addrs: Vec<std::net::IpAddr>,
    /// Its address on the job's network (none in parts of older dumps).
    #[serde(default)]
    pub via: Option<std::net::IpAddr>,
}

impl From<&NodeInfo> for Node {
    fn from(n: &NodeInfo) -> Node {
        Node {
            rank: n.rank,
            host: n.host.clone(),
            addrs: n.addrs.clone(),
            via: n.via,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub job: String,
    pub generation: u64,
    pub nnodes: u32,
    pub node_rank: u32,
    /// Every node of the job at the dump, this one included, in rank order.
    pub nodes: Vec<Node>,
    /// A snapshot: the job went on after it.
    pub leave_running: bool,
    /// Seconds since the epoch.
    pub dumped_at: u64,
    /// This node's torchrun agents of a dynamic rendezvous, whose heartbeats a restore makes
    /// fresh before they run (torchrun.rs).
    #[serde(default)]
    pub agents: Vec<Agent>,
}

impl Part {
    pub fn write(&self, dir: &Path) -> Result<(), RecordError> {
        record::write(dir, FILE, FORMAT, VERSION, self)
    }

    pub fn read(dir: &Path) -> Result<Option<Part>, RecordError> {
        record::read(dir, FILE, FORMAT, VERSION)
    }

    /// "part 1 of 2 of job J, generation G".
    pub fn name(&self) -> String {
        format!(
            "node {}'s part (of {}) of job {}, generation {}",
            self.node_rank, self.nnodes, self.job, self.generation
        )
    }

    /// The other nodes, for `criu-gpu inspect`.
    pub fn others(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.rank != self.node_rank)
            .map(|n| {
                let addrs: Vec<String> = n.addrs.iter().map(|a| a.to_string()).collect();
                format!("node {} ({}, {})", n.rank, n.host, addrs.join(" "))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_reads_back_and_names_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let p = Part {
            job: "j".into(),
            generation: 3,
            nnodes: 2,
            node_rank: 0,
            nodes: vec![
                Node {
                    rank: 0,
                    host: "a".into(),
                    addrs: vec!["10.1.0.1".parse().unwrap()],
                    via: None,
                },
                Node {
                    rank: 1,
                    host: "b".into(),
                    addrs: vec!["10.1.0.2".parse().unwrap()],
                    via: None,
                },
            ],
            leave_running: false,
            dumped_at: 1,
            agents: Vec::new(),
        };
        p.write(dir.path()).unwrap();
        assert_eq!(Part::read(dir.path()).unwrap(), Some(p.clone()));
        assert_eq!(p.others(), vec!["node 1 (b, 10.1.0.2)"]);
    }
}
