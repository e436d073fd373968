//! A restore where some nodes are somewhere else (a Kubernetes pod rescheduled onto another node
//! gets another IP address): the connections between the job's nodes move with them, on both
//! ends. Each node's address on the job's network is the one it reaches etcd from (its `via`):
//! the part remembers every node's at the dump, and each node tells the others its own at the
//! restore. A node whose old address is not among its addresses now has moved, from its old
//! `via` to its new one; every node derives the same address map from the same exchanged
//! records, and hands it to the plugin (`CRIU_GPU_ADDRESS_MAP`), which moves the source of the
//! moved node's own sockets and the destination of its peers' as CRIU restores them. A torchrun
//! user types nothing; `--address-map OLD=NEW[,...]`, on any node, names moves this cannot tell
//! (a node with several addresses, connections on another network), and wins over a derived
//! pair.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};

use criu_gpu_image::addrmap::AddressMap;

use super::op::NodeInfo;
use super::part::{Node, Part};
use super::torchrun::Agent;
use super::{ClusterError, Rdzv};
use crate::job::plan::Problem;

/// The address this node reaches etcd from: the kernel's choice of source address for the
/// first endpoint (a UDP socket's connect sends nothing). `None` for loopback (etcd on this
/// node says nothing of the job's network) or an endpoint that does not resolve.
pub fn via(rdzv: &Rdzv) -> Option<IpAddr> {
    let endpoint = rdzv.endpoints.first()?;
    let host_port = endpoint
        .split_once("://")
        .map_or(endpoint.as_str(), |(_, rest)| rest);
    let to: SocketAddr = host_port.to_socket_addrs().ok()?.next()?;
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().ok()?,
        SocketAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect(to).ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// A node's address on the job's network: the one it reached etcd from, or its only one.
fn job_address(via: Option<IpAddr>, addrs: &[IpAddr]) -> Option<IpAddr> {
    via.or(match addrs {
        [one] => Some(*one),
        _ => None,
    })
}

impl Node {
    pub fn job_address(&self) -> Option<IpAddr> {
        job_address(self.via, &self.addrs)
    }
}

impl NodeInfo {
    pub fn job_address(&self) -> Option<IpAddr> {
        job_address(self.via, &self.addrs)
    }
}

/// This node's preflight: where its part's connections go when its old address is not here.
/// A problem when the old address is gone and neither `given` nor this node's own addresses
/// say which takes its place.
pub fn own_problem(part: &Part, given: &AddressMap, me: &NodeInfo) -> Option<Problem> {
    let was = part.nodes.iter().find(|n| n.rank == part.node_rank)?;
    let old = was.job_address()?;
    if me.addrs.contains(&old) {
        return None;
    }
    let list = |a: &[IpAddr]| {
        a.iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match given.new_of(old) {
        Some(new) if !me.addrs.contains(&new) => Some(Problem {
            what: format!(
                "--address-map moves {old} (this part's node's address) to {new}, which this \
                 node does not have (it has {})",
                list(&me.addrs)
            ),
            fix: "name one of this node's addresses".into(),
        }),
        Some(_) => None,
        None if me.job_address().is_some() => None,
        None => Some(Problem {
            what: format!(
                "the part's node was at {old}, which this node does not have, and it cannot tell \
                 which of its addresses ({}) takes its place: none is the one it reaches etcd \
                 from",
                list(&me.addrs)
            ),
            fix: format!("name it: --address-map {old}=NEW"),
        }),
    }
}

/// The job's address map, the same on every node: the pairs any node was given, then, for each
/// node that is not at its old address, its old address moved to its new one.
pub fn derive(part: &Part, nodes: &[NodeInfo]) -> Result<AddressMap, ClusterError> {
    let mut map = AddressMap::default();
    let bad = |e: criu_gpu_image::addrmap::MapError| {
        ClusterError::Part(format!(
            "the nodes' --address-map pairs do not agree: {e}; give every node the same pairs"
        ))
    };
    for n in nodes {
        map.merge(&n.address_map).map_err(bad)?;
    }
    for was in &part.nodes {
        let (Some(now), Some(old)) = (nodes.iter().find(|n| n.rank == was.rank), was.job_address())
        else {
            continue;
        };
        if now.addrs.contains(&old) || map.new_of(old).is_some() {
            continue;
        }
        let new = now.job_address().ok_or_else(|| {
            ClusterError::Part(format!(
                "{} is no longer at {old} and cannot tell which of its addresses takes its place: \
                 name it there with --address-map {old}=NEW",
                now.name()
            ))
        })?;
        map.add(old, new).map_err(|e| {
            ClusterError::Part(format!(
                "{} moved from {old} to {new}, which cannot be: {e}",
                now.name()
            ))
        })?;
    }
    Ok(map)
}

/// torchrun's agents as they are after the move: the rendezvous store they name by an address
/// of the map is at its new address now (where the heartbeats are refreshed, by the node that
/// serves it). A store named by a host name is left to the name's owner (a Kubernetes Service
/// follows the pod).
pub fn agents(agents: &[Agent], map: &AddressMap) -> Vec<Agent> {
    agents
        .iter()
        .map(|a| {
            let moved = a.host.parse::<IpAddr>().ok().and_then(|ip| map.new_of(ip));
            Agent {
                host: moved.map_or_else(|| a.host.clone(), |ip| ip.to_string()),
                ..a.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node(rank: u32, addrs: &[&str], via: Option<&str>) -> Node {
        Node {
            rank,
            host: format!("n{rank}"),
            addrs: addrs.iter().map(|a| ip(a)).collect(),
            via: via.map(ip),
        }
    }

    fn now(rank: u32, addrs: &[&str], via: Option<&str>, given: &str) -> NodeInfo {
        NodeInfo {
            rank,
            host: format!("m{rank}"),
            addrs: addrs.iter().map(|a| ip(a)).collect(),
            via: via.map(ip),
            part_gen: Some(1),
            problems: Vec::new(),
            address_map: given.parse().unwrap(),
        }
    }

    fn part(rank: u32) -> Part {
        Part {
            job: "j".into(),
            generation: 1,
            nnodes: 2,
            node_rank: rank,
            nodes: vec![
                node(0, &["10.1.0.1", "172.17.0.1"], Some("10.1.0.1")),
                node(1, &["10.1.0.2"], None),
            ],
            leave_running: false,
            dumped_at: 0,
            agents: Vec::new(),
        }
    }

    #[test]
    fn a_moved_node_moves_from_its_old_address_to_its_new_one_on_every_node() {
        let nodes = [
            now(0, &["10.1.0.3", "172.18.0.1"], Some("10.1.0.3"), ""),
            now(1, &["10.1.0.2"], Some("10.1.0.2"), ""),
        ];
        // Both nodes' parts name the same nodes: the same map on both.
        for r in 0..2 {
            let map = derive(&part(r), &nodes).unwrap();
            assert_eq!(map.to_string(), "10.1.0.1=10.1.0.3");
        }
        // Nobody moved: no map.
        let stay = [
            now(0, &["10.1.0.1"], None, ""),
            now(1, &["10.1.0.2"], None, ""),
        ];
        assert!(derive(&part(0), &stay).unwrap().is_empty());
        // Both swapped hosts: each moves onto the other's old address.
        let swapped = [
            now(0, &["10.1.0.2"], None, ""),
            now(1, &["10.1.0.1"], None, ""),
        ];
        let map = derive(&part(0), &swapped).unwrap();
        assert_eq!(map.to_string(), "10.1.0.1=10.1.0.2,10.1.0.2=10.1.0.1");
    }

    #[test]
    fn a_given_pair_wins_and_given_pairs_must_agree() {
        let nodes = [
            now(0, &["10.1.0.3", "10.9.0.3"], Some("10.1.0.3"), ""),
            now(1, &["10.1.0.2"], None, "10.1.0.1=10.9.0.3"),
        ];
        let map = derive(&part(0), &nodes).unwrap();
        assert_eq!(map.to_string(), "10.1.0.1=10.9.0.3");
        let nodes = [
            now(0, &["10.1.0.3"], None, "10.1.0.1=10.1.0.3"),
            now(1, &["10.1.0.2"], None, "10.1.0.1=10.1.0.4"),
        ];
        let e = derive(&part(1), &nodes).unwrap_err().to_string();
        assert!(e.contains("do not agree"), "{e}");
    }

    #[test]
    fn the_preflight_names_a_move_it_cannot_tell_and_a_given_address_that_is_not_here() {
        let me = now(0, &["10.1.0.3", "10.9.0.3"], None, "");
        let p = own_problem(&part(0), &AddressMap::default(), &me).unwrap();
        assert!(
            p.what.contains("was at 10.1.0.1") && p.fix.contains("--address-map 10.1.0.1=NEW"),
            "{p:?}"
        );
        let given: AddressMap = "10.1.0.1=10.1.0.4".parse().unwrap();
        let p = own_problem(&part(0), &given, &me).unwrap();
        assert!(p.what.contains("which this node does not have"), "{p:?}");
        let given: AddressMap = "10.1.0.1=10.9.0.3".parse().unwrap();
        assert!(own_problem(&part(0), &given, &me).is_none());
        // At its old address, or with one address to move to: nothing to say.
        assert!(own_problem(
            &part(0),
            &AddressMap::default(),
            &now(0, &["10.1.0.1"], None, "")
        )
        .is_none());
        assert!(own_problem(
            &part(0),
            &AddressMap::default(),
            &now(0, &["10.1.0.3"], None, "")
        )
        .is_none());
    }

    #[test]
    fn torchruns_store_is_reached_at_its_new_address() {
        let map: AddressMap = "10.1.0.1=10.1.0.3".parse().unwrap();
        let agent = |host: &str| Agent {
            pid: 7,
            host: host.into(),
            port: 29500,
            run_id: "j".into(),
        };
        let moved = agents(
            &[agent("10.1.0.1"), agent("10.1.0.2"), agent("node0")],
            &map,
        );
        let hosts: Vec<&str> = moved.iter().map(|a| a.host.as_str()).collect();
        assert_eq!(hosts, ["10.1.0.3", "10.1.0.2", "node0"]);
    }

    #[test]
    fn etcd_on_this_node_says_nothing_of_the_jobs_network() {
        let local: Rdzv = "etcd://127.0.0.1:2379/j".parse().unwrap();
        assert_eq!(via(&local), None);
    }
}
