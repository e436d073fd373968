//! What the r580 driver can bring back of an NCCL job (docs/driver-facts.md, F13 and F16, measured
//! on two H200s with NCCL 2.28): ranks that share a node talk through P2P (CUDA IPC, or cuMem
//! handles over NVLink) or shared memory unless NCCL is told not to. The driver checkpoints a rank
//! that talks through P2P (with or without cuMem), or through shared memory with cuMem on, but
//! refuses to restore it (`CUDA_ERROR_NOT_SUPPORTED`, or `CUDA_ERROR_INVALID_VALUE` for legacy
//! IPC), so the rank can never run again: neither after the dump nor after a dump that failed.
//! Sockets (cuMem on or off) and shared memory with cuMem off come back, sockets even onto
//! swapped GPUs.
//!
//! So before anything is locked, the ranks of one node must have P2P off, and SHM or cuMem off.
//! NCCL reads its settings from the environment, then from `NCCL_CONF_FILE` or `~/.nccl.conf`,
//! then from `/etc/nccl.conf` (a file fills in only what is not set yet), all as the process saw
//! them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::process;

/// The settings that make a node's ranks talk through sockets only.
pub const SOCKETS_ONLY: &str = "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0";
/// The other restorable way: shared memory without cuMem (F16).
pub const SHM_WITHOUT_CUMEM: &str = "NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0";

/// An NCCL transport between ranks of one node that the driver cannot restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Transport {
    /// Peer-to-peer over NVLink or PCIe (CUDA IPC or cuMem handles): NCCL_P2P_DISABLE=1.
    P2p,
    /// Shared host memory: NCCL_SHM_DISABLE=1.
    Shm,
    /// cuMem allocations shared between processes: NCCL_CUMEM_ENABLE=0.
    CuMem,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::P2p => "P2P",
            Transport::Shm => "SHM",
            Transport::CuMem => "cuMem",
        })
    }
}

/// NCCL's settings as one process sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    values: BTreeMap<String, String>,
}

fn conf_lines(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
}

impl Config {
    /// From the process's environment and the files NCCL reads, in NCCL's order.
    pub fn from_sources(env: &[(String, String)], files: &[&str]) -> Config {
        let mut values: BTreeMap<String, String> = env
            .iter()
            .filter(|(k, _)| k.starts_with("NCCL_"))
            .cloned()
            .collect();
        for text in files {
            for (k, v) in conf_lines(text) {
                values.entry(k).or_insert(v);
            }
        }
        Config { values }
    }

    /// The settings process `pid` started with.
    pub fn of(pid: i32) -> std::io::Result<Config> {
        let env = process::environ(pid)?;
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let user: Option<PathBuf> = get("NCCL_CONF_FILE")
            .map(PathBuf::from)
            .or_else(|| get("HOME").map(|h| Path::new(&h).join(".nccl.conf")));
        let read = |p: &Path| std::fs::read_to_string(process::in_root(pid, p)).unwrap_or_default();
        let user = user.map(|p| read(&p)).unwrap_or_default();
        let system = read(Path::new("/etc/nccl.conf"));
        Ok(Config::from_sources(&env, &[&user, &system]))
    }

    fn int(&self, key: &str) -> Option<i64> {
        self.values.get(key)?.trim().parse().ok()
    }

    /// The transports left on that make ranks of one node unrestorable: P2P, or SHM with cuMem.
    pub fn unrestorable(&self) -> Vec<Transport> {
        let on = self.transports();
        let p2p = on.contains(&Transport::P2p);
        let shm_cumem = on.contains(&Transport::Shm) && on.contains(&Transport::CuMem);
        on.into_iter()
            .filter(|t| match t {
                Transport::P2p => true,
                Transport::Shm => shm_cumem,
                Transport::CuMem => p2p || shm_cumem,
            })
            .collect()
    }

    /// The transports between ranks of one node that are left on.
    fn transports(&self) -> Vec<Transport> {
        let mut on = Vec::new();
        let p2p_off = self.int("NCCL_P2P_DISABLE").is_some_and(|v| v != 0)
            || self
                .values
                .get("NCCL_P2P_LEVEL")
                .is_some_and(|l| matches!(l.trim(), "LOC" | "0"));
        if !p2p_off {
            on.push(Transport::P2p);
        }
        if self.int("NCCL_SHM_DISABLE").is_none_or(|v| v == 0) {
            on.push(Transport::Shm);
        }
        // NCCL's default (-2, or unset) turns cuMem on where the driver has it: r580 has.
        if self.int("NCCL_CUMEM_ENABLE") != Some(0) {
            on.push(Transport::CuMem);
        }
        on
    }
}

/// A rank that would talk to another rank of its node through a transport the driver cannot
/// restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unrestorable {
    pub pid: i32,
    pub transports: Vec<Transport>,
}

/// Of `ranks` (CUDA processes of one node with NCCL loaded), those whose settings leave a
/// transport the driver cannot restore on. A rank alone on its node talks to none: nothing then.
/// A process whose settings cannot be read counts as one with NCCL's defaults.
pub fn unrestorable(ranks: &[i32]) -> Vec<Unrestorable> {
    check(ranks, |pid| Config::of(pid).unwrap_or_default())
}

/// [`unrestorable`] with each rank's settings from `config`.
pub fn check(ranks: &[i32], config: impl Fn(i32) -> Config) -> Vec<Unrestorable> {
    if ranks.len() < 2 {
        return Vec::new();
    }
    ranks
        .iter()
        .filter_map(|&pid| {
            let transports = config(pid).unrestorable();
            (!transports.is_empty()).then_some(Unrestorable { pid, transports })
        })
        .collect()
}

/// The transports, for messages ("P2P, SHM and cuMem").
pub fn names(t: &[Transport]) -> String {
    let names: Vec<String> = t.iter().map(Transport::to_string).collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_leave_every_transport_on() {
        let c = Config::from_sources(&env(&[("PATH", "/bin")]), &[]);
        assert_eq!(
            c.unrestorable(),
            vec![Transport::P2p, Transport::Shm, Transport::CuMem]
        );
        assert_eq!(names(&c.unrestorable()), "P2P, SHM and cuMem");
    }

    #[test]
    fn sockets_only_from_the_environment_or_a_file() {
        let all = env(&[
            ("NCCL_P2P_DISABLE", "1"),
            ("NCCL_SHM_DISABLE", "1"),
            ("NCCL_CUMEM_ENABLE", "0"),
        ]);
        assert!(Config::from_sources(&all, &[]).unrestorable().is_empty());
        let file = "# sockets only\nNCCL_P2P_LEVEL=LOC\nNCCL_SHM_DISABLE = 1\n";
        let c = Config::from_sources(&env(&[("NCCL_CUMEM_ENABLE", "0")]), &["", file]);
        assert!(c.unrestorable().is_empty(), "{c:?}");
    }

    #[test]
    fn the_environment_wins_over_files_and_the_user_file_over_the_system_one() {
        let c = Config::from_sources(
            &env(&[("NCCL_SHM_DISABLE", "0")]),
            &[
                "NCCL_SHM_DISABLE=1\nNCCL_P2P_DISABLE=1",
                "NCCL_P2P_DISABLE=0",
            ],
        );
        assert_eq!(c.unrestorable(), vec![Transport::Shm, Transport::CuMem]);
    }

    /// F13 and F16 (two H200s, r580, NCCL 2.28.9): what came back and what did not.
    #[test]
    fn what_the_driver_restores() {
        let of = |pairs: &[(&str, &str)]| Config::from_sources(&env(pairs), &[]).unrestorable();
        let on = ("NCCL_P2P_DISABLE", "1");
        // Sockets, cuMem on or off, and SHM without cuMem came back.
        assert!(of(&[on, ("NCCL_SHM_DISABLE", "1")]).is_empty());
        assert!(of(&[on, ("NCCL_CUMEM_ENABLE", "0")]).is_empty());
        // SHM with cuMem: NOT_SUPPORTED; P2P over legacy IPC: INVALID_VALUE.
        assert_eq!(of(&[on]), vec![Transport::Shm, Transport::CuMem]);
        assert_eq!(
            of(&[("NCCL_SHM_DISABLE", "1"), ("NCCL_CUMEM_ENABLE", "0")]),
            vec![Transport::P2p]
        );
    }

    #[test]
    fn one_rank_alone_talks_to_nobody() {
        assert!(unrestorable(&[std::process::id() as i32]).is_empty());
    }
}
