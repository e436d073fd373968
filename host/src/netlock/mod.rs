//! CRIU's network lock, in one place: CRIU takes it while it dumps a network namespace (every
//! container with one of its own) or TCP connections. Which methods this node can take and which
//! one to use (here: one rule, used by `criu-gpu dump`, by `criu-gpu runtime-config`, the
//! runtimes' settings files that `scripts/install.sh` writes through it, and by `criu-gpu
//! doctor`), and taking a run's nftables lock back when CRIU cannot ([`nftables`]), with what
//! the operator reads of it ([`release`]: the guardian and `criu-gpu dump`).

mod nftables;
mod release;

pub use self::nftables::{is_locked, table};
pub use self::release::{release, release_dumped, Released};

use std::path::Path;
use std::process::Command;

use serde::Serialize;

/// A value of CRIU's `--network-lock` (`network-lock` in its settings files).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkLock {
    /// Rules loaded with `iptables-restore` and `ip6tables-restore` (CRIU's default).
    Iptables,
    /// A table made through CRIU's own libnftables (no tool needed).
    Nftables,
    /// No lock (the user vouches that no packet matters meanwhile).
    Skip,
}

/// What CRIU takes when nothing names a method (its build default, unchanged in 4.x).
pub const CRIU_DEFAULT: NetworkLock = NetworkLock::Iptables;

impl NetworkLock {
    pub fn word(self) -> &'static str {
        match self {
            NetworkLock::Iptables => "iptables",
            NetworkLock::Nftables => "nftables",
            NetworkLock::Skip => "skip",
        }
    }

    /// CRIU's own spelling; anything else makes CRIU refuse its settings.
    pub fn parse(word: &str) -> Option<NetworkLock> {
        match word {
            "iptables" => Some(NetworkLock::Iptables),
            "nftables" => Some(NetworkLock::Nftables),
            "skip" => Some(NetworkLock::Skip),
            _ => None,
        }
    }
}

impl std::fmt::Display for NetworkLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

/// The methods this node can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct NodeLocks {
    /// `criu check --feature network_lock_nftables`: CRIU was built with libnftables and the
    /// kernel has nf_tables with set concatenations.
    pub nftables: bool,
    /// `iptables-restore` and `ip6tables-restore` run (CRIU runs both; the IPv6 one whenever the
    /// kernel has IPv6).
    pub iptables: bool,
}

impl NodeLocks {
    /// Asks this node's CRIU and tools.
    pub fn probe(criu: &Path) -> NodeLocks {
        let ok = |cmd: &mut Command| cmd.output().is_ok_and(|o| o.status.success());
        let nodes = NodeLocks {
            nftables: crate::criu_bin::has_feature(criu, "network_lock_nftables"),
            iptables: ok(Command::new("iptables-restore").arg("--version"))
                && ok(Command::new("ip6tables-restore").arg("--version")),
        };
        tracing::debug!(criu = %criu.display(), ?nodes, "network locks this node can take");
        nodes
    }

    /// The method to use: nftables where CRIU has it (it needs no tool, and it is what a node
    /// without the iptables binaries can take), else iptables where its tools run, else none.
    pub fn choose(self) -> Option<NetworkLock> {
        if self.nftables {
            Some(NetworkLock::Nftables)
        } else if self.iptables {
            Some(NetworkLock::Iptables)
        } else {
            None
        }
    }

    pub fn can_take(self, lock: NetworkLock) -> bool {
        match lock {
            NetworkLock::Iptables => self.iptables,
            NetworkLock::Nftables => self.nftables,
            NetworkLock::Skip => true,
        }
    }

    /// Why `lock` cannot be taken here (empty when it can).
    pub fn why_not(self, lock: NetworkLock) -> &'static str {
        match lock {
            _ if self.can_take(lock) => "",
            NetworkLock::Iptables => "iptables-restore or ip6tables-restore is missing",
            NetworkLock::Nftables => {
                "this CRIU was built without libnftables, or the kernel lacks nf_tables \
                 (`criu check --feature network_lock_nftables` fails)"
            }
            NetworkLock::Skip => "",
        }
    }

    /// What to do on a node that can take neither method.
    pub const NO_LOCK_FIX: &'static str =
        "install iptables (iptables-restore and ip6tables-restore), or a CRIU built with \
         libnftables (scripts/install-criu.sh builds one)";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nftables_first_then_iptables_then_none() {
        let n = |nftables, iptables| NodeLocks { nftables, iptables };
        assert_eq!(n(true, true).choose(), Some(NetworkLock::Nftables));
        // The GPU machines: CRIU with libnftables, no iptables binaries.
        assert_eq!(n(true, false).choose(), Some(NetworkLock::Nftables));
        assert_eq!(n(false, true).choose(), Some(NetworkLock::Iptables));
        assert_eq!(n(false, false).choose(), None);
    }

    #[test]
    fn what_a_node_can_take_and_why_not() {
        let gpu_node = NodeLocks {
            nftables: true,
            iptables: false,
        };
        assert!(!gpu_node.can_take(CRIU_DEFAULT));
        assert!(gpu_node
            .why_not(NetworkLock::Iptables)
            .contains("ip6tables-restore"));
        assert!(gpu_node.can_take(NetworkLock::Nftables));
        assert_eq!(gpu_node.why_not(NetworkLock::Nftables), "");
        assert!(NodeLocks::default().can_take(NetworkLock::Skip));
        assert!(NodeLocks::default()
            .why_not(NetworkLock::Nftables)
            .contains("network_lock_nftables"));
    }

    #[test]
    fn words_are_criu_s() {
        for l in [
            NetworkLock::Iptables,
            NetworkLock::Nftables,
            NetworkLock::Skip,
        ] {
            assert_eq!(NetworkLock::parse(l.word()), Some(l));
        }
        assert_eq!(NetworkLock::parse("nft"), None);
    }
}
