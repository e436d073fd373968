//! A restore on other addresses: CRIU hands the plugin each inet socket's two addresses before it
//! creates the socket (the UPDATE_INETSK hook, CRIU patch 0012, criu#2841 upstream), and the
//! address map (`CRIU_GPU_ADDRESS_MAP`) moves them: a node that moved gets its own sockets'
//! source addresses changed, and its peers, restored with the same map, their destinations. Both
//! ends of every connection inside the job then agree, and CRIU binds, connects (in repair mode,
//! so nothing is sent) and locks each at its new addresses.

use std::collections::BTreeMap;
use std::net::IpAddr;

use criu_gpu_host::settings::declared::ADDRESS_MAP;
use criu_gpu_host::settings::Settings;
use criu_gpu_image::addrmap::{self, AddressMap};

/// Why a restore with an address map cannot run.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error(
        "{key}={map} asks to move the job's connections, and this CRIU cannot: it lacks the \
         UPDATE_INETSK plugin hook (the project's CRIU has it, patch 0012 of \
         third_party/criu; install it with scripts/install.sh, or run a CRIU that tells the \
         plugin it has the hook). Nothing was restored",
        key = addrmap::SETTING
    )]
    NoHook { map: AddressMap },
}

/// The moves of one restore.
#[derive(Debug)]
pub struct Remap {
    map: AddressMap,
    /// Sockets moved, and each address pair's count of moved ends.
    sockets: usize,
    ends: BTreeMap<(IpAddr, IpAddr), usize>,
}

impl Remap {
    /// The restore's address map, if one is set; refused where CRIU cannot call the hook
    /// (`offered`: whether the plugin could offer CRIU the hook).
    pub fn load(settings: &Settings, offered: bool) -> Result<Option<Remap>, super::HookError> {
        let Some(map) = settings.get(&ADDRESS_MAP)? else {
            return Ok(None);
        };
        if !offered {
            return Err(super::HookError::Addresses(AddressError::NoHook { map }));
        }
        tracing::info!("moving the job's connections: {map}");
        Ok(Some(Remap {
            map,
            sockets: 0,
            ends: BTreeMap::new(),
        }))
    }

    /// One socket: its source and destination moved where the map says. Whether any was.
    pub fn update(&mut self, family: u32, state: u32, src: &mut [u32], dst: &mut [u32]) -> bool {
        let moved: Vec<(IpAddr, IpAddr)> = [src, dst]
            .into_iter()
            .filter_map(|end| self.map.rewrite(family, end))
            .collect();
        for m in &moved {
            *self.ends.entry(*m).or_default() += 1;
            tracing::debug!(
                "socket (family {family}, state {state}): {} -> {}",
                m.0,
                m.1
            );
        }
        if !moved.is_empty() {
            self.sockets += 1;
        }
        !moved.is_empty()
    }

    /// What the restore moved, for CRIU's log at the end.
    pub fn summary(&self) -> String {
        if self.sockets == 0 {
            return format!(
                "no socket had an address of the map ({}): nothing was moved",
                self.map
            );
        }
        let pairs: Vec<String> = self
            .ends
            .iter()
            .map(|((o, n), k)| format!("{o} -> {n} ({k})"))
            .collect();
        format!(
            "moved {} socket(s) to new addresses, end(s) per address: {}",
            self.sockets,
            pairs.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use criu_gpu_image::addrmap::{AF_INET, AF_INET6};

    fn settings(map: &str) -> Settings {
        let env = vec![(addrmap::SETTING.to_owned(), map.to_owned())];
        Settings::from_sources(&env, "", "/etc/criu/gpu-plugin.conf")
    }

    fn v4(s: &str) -> u32 {
        u32::from_ne_bytes(s.parse::<std::net::Ipv4Addr>().unwrap().octets())
    }

    #[test]
    fn a_map_moves_both_ends_of_a_connection_and_counts_them() {
        let mut r = Remap::load(&settings("10.1.0.1=10.1.0.3"), true)
            .unwrap()
            .unwrap();
        // The moved node's own connection to itself: both ends.
        let (mut s, mut d) = ([v4("10.1.0.1")], [v4("10.1.0.1")]);
        assert!(r.update(AF_INET, 1, &mut s, &mut d));
        assert_eq!((s, d), ([v4("10.1.0.3")], [v4("10.1.0.3")]));
        // A peer's connection to the moved node: its destination.
        let (mut s, mut d) = ([v4("10.1.0.2")], [v4("10.1.0.1")]);
        assert!(r.update(AF_INET, 1, &mut s, &mut d));
        assert_eq!((s, d), ([v4("10.1.0.2")], [v4("10.1.0.3")]));
        // A listener on any address, a connection between others: left alone.
        let (mut s, mut d) = ([0u32], [0u32]);
        assert!(!r.update(AF_INET, 10, &mut s, &mut d));
        let (mut s, mut d) = ([0u32; 4], [0u32; 4]);
        assert!(!r.update(AF_INET6, 10, &mut s, &mut d));
        assert_eq!(
            r.summary(),
            "moved 2 socket(s) to new addresses, end(s) per address: 10.1.0.1 -> 10.1.0.3 (3)"
        );
    }

    #[test]
    fn no_map_no_remap_and_a_map_without_the_hook_is_refused_by_name() {
        assert!(Remap::load(&settings(""), false).unwrap().is_none());
        let e = Remap::load(&settings("10.1.0.1=10.1.0.3"), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("CRIU_GPU_ADDRESS_MAP=10.1.0.1=10.1.0.3")
                && e.contains("UPDATE_INETSK")
                && e.contains("patch 0012"),
            "{e}"
        );
        let e = Remap::load(&settings("10.1.0.1"), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("CRIU_GPU_ADDRESS_MAP"), "{e}");
    }
}
