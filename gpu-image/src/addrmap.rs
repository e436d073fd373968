//! Where a restore moves a job's connections: pairs of an old address and its new one, as
//! `OLD=NEW[,...]` (`CRIU_GPU_ADDRESS_MAP`, set by `criu-gpu restore --address-map` or derived
//! from every node's new address across machines). The plugin rewrites each TCP socket's two
//! ends with it as CRIU restores them (CRIU's UPDATE_INETSK hook): a node that moved gets its
//! own sockets' source addresses changed, its peers their destinations, on every node alike.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// The setting, in criu's environment.
pub const SETTING: &str = "CRIU_GPU_ADDRESS_MAP";

/// CRIU's address families (AF_INET, AF_INET6 on Linux).
pub const AF_INET: u32 = 2;
pub const AF_INET6: u32 = 10;

/// Old address -> new address. IPv4 pairs also move IPv4-mapped IPv6 ends (`::ffff:a.b.c.d`),
/// which is how a dual-stack listener (torch's TCPStore on `[::]`) sees IPv4 peers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressMap {
    pairs: BTreeMap<IpAddr, IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("{0:?} is not OLD=NEW (two IP addresses, e.g. 10.0.0.1=10.0.0.7)")]
    Pair(String),
    #[error("{0:?} is not an IP address")]
    Address(String),
    #[error("{old} and {new} are not of one family (IPv4 to IPv4, IPv6 to IPv6)")]
    Family { old: IpAddr, new: IpAddr },
    #[error("{old} is moved both to {one} and to {other}")]
    Twice {
        old: IpAddr,
        one: IpAddr,
        other: IpAddr,
    },
    #[error("{new} would take the place of both {one} and {other}")]
    Shared {
        new: IpAddr,
        one: IpAddr,
        other: IpAddr,
    },
}

impl AddressMap {
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    pub fn pairs(&self) -> impl Iterator<Item = (IpAddr, IpAddr)> + '_ {
        self.pairs.iter().map(|(o, n)| (*o, *n))
    }

    /// The new address of `old`, if it moves.
    pub fn new_of(&self, old: IpAddr) -> Option<IpAddr> {
        self.pairs.get(&old).copied()
    }

    /// Adds `old -> new` (a pair whose two sides are equal moves nothing and is left out).
    /// Refuses another family, one old address moved to two places, and two old addresses
    /// moved onto one (the connections of two nodes could no longer be told apart).
    pub fn add(&mut self, old: IpAddr, new: IpAddr) -> Result<(), MapError> {
        if old.is_ipv4() != new.is_ipv4() {
            return Err(MapError::Family { old, new });
        }
        if old == new {
            return Ok(());
        }
        if let Some(one) = self.pairs.get(&old).filter(|n| **n != new) {
            return Err(MapError::Twice {
                old,
                one: *one,
                other: new,
            });
        }
        if let Some((one, _)) = self.pairs.iter().find(|(o, n)| **n == new && **o != old) {
            return Err(MapError::Shared {
                new,
                one: *one,
                other: old,
            });
        }
        self.pairs.insert(old, new);
        Ok(())
    }

    /// Every pair of `other` added to this map.
    pub fn merge(&mut self, other: &AddressMap) -> Result<(), MapError> {
        other.pairs().try_for_each(|(o, n)| self.add(o, n))
    }

    /// Moves one socket end, held as CRIU's image holds it: 1 word (`AF_INET`) or 4
    /// (`AF_INET6`), each in network order. The move made, if any.
    pub fn rewrite(&self, family: u32, words: &mut [u32]) -> Option<(IpAddr, IpAddr)> {
        let old = read(family, words)?;
        let new = match old {
            // An IPv4 peer of a dual-stack socket: moved by its IPv4 pair.
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
                let v4 = v6.to_ipv4_mapped().map(IpAddr::V4)?;
                match self.new_of(v4)? {
                    IpAddr::V4(n) => IpAddr::V6(n.to_ipv6_mapped()),
                    IpAddr::V6(_) => return None,
                }
            }
            _ => self.new_of(old)?,
        };
        write(new, words);
        Some((old, new))
    }
}

/// The address in CRIU's words, or `None` for another family or too few words.
fn read(family: u32, words: &[u32]) -> Option<IpAddr> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    match family {
        AF_INET => {
            let b: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(b)))
        }
        AF_INET6 => {
            let b: [u8; 16] = bytes.get(..16)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

fn write(addr: IpAddr, words: &mut [u32]) {
    let bytes = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    for (w, chunk) in words.iter_mut().zip(bytes.chunks(4)) {
        if let Ok(b) = <[u8; 4]>::try_from(chunk) {
            *w = u32::from_ne_bytes(b);
        }
    }
}

impl std::str::FromStr for AddressMap {
    type Err = MapError;

    fn from_str(s: &str) -> Result<AddressMap, MapError> {
        let mut map = AddressMap::default();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (old, new) = pair
                .split_once('=')
                .ok_or_else(|| MapError::Pair(pair.to_owned()))?;
            let ip = |a: &str| {
                a.trim()
                    .parse::<IpAddr>()
                    .map_err(|_| MapError::Address(a.trim().to_owned()))
            };
            map.add(ip(old)?, ip(new)?)?;
        }
        Ok(map)
    }
}

impl std::fmt::Display for AddressMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pairs: Vec<String> = self.pairs().map(|(o, n)| format!("{o}={n}")).collect();
        f.write_str(&pairs.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> u32 {
        u32::from_ne_bytes(s.parse::<Ipv4Addr>().unwrap().octets())
    }

    fn v6(s: &str) -> [u32; 4] {
        let o = s.parse::<Ipv6Addr>().unwrap().octets();
        [0, 1, 2, 3].map(|i| u32::from_ne_bytes(o[i * 4..i * 4 + 4].try_into().unwrap()))
    }

    #[test]
    fn reads_and_writes_the_users_spelling() {
        let m: AddressMap = "10.0.0.1=10.0.0.7, fd00::1=fd00::7".parse().unwrap();
        assert_eq!(m.to_string(), "10.0.0.1=10.0.0.7,fd00::1=fd00::7");
        assert_eq!(m.to_string().parse::<AddressMap>().unwrap(), m);
        assert!("".parse::<AddressMap>().unwrap().is_empty());
        assert!("10.0.0.1=10.0.0.1"
            .parse::<AddressMap>()
            .unwrap()
            .is_empty());
        for (bad, says) in [
            ("10.0.0.1", "is not OLD=NEW"),
            ("10.0.0.1=x", "\"x\" is not an IP address"),
            ("10.0.0.1=fd00::1", "not of one family"),
            ("10.0.0.1=10.0.0.7,10.0.0.1=10.0.0.8", "moved both to"),
            (
                "10.0.0.1=10.0.0.7,10.0.0.2=10.0.0.7",
                "take the place of both",
            ),
        ] {
            let e = bad.parse::<AddressMap>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn moves_ipv4_ipv6_and_ipv4_mapped_ends_and_nothing_else() {
        let m: AddressMap = "10.0.0.1=10.0.0.7,fd00::1=fd00::7".parse().unwrap();
        let mut w = [v4("10.0.0.1")];
        let moved = m.rewrite(AF_INET, &mut w);
        assert_eq!(w, [v4("10.0.0.7")]);
        assert_eq!(
            moved,
            Some(("10.0.0.1".parse().unwrap(), "10.0.0.7".parse().unwrap()))
        );
        let mut w = [v4("10.0.0.2")];
        assert_eq!(m.rewrite(AF_INET, &mut w), None);
        assert_eq!(w, [v4("10.0.0.2")]);
        let mut w = v6("::ffff:10.0.0.1");
        assert!(m.rewrite(AF_INET6, &mut w).is_some());
        assert_eq!(w, v6("::ffff:10.0.0.7"));
        let mut w = v6("fd00::1");
        assert!(m.rewrite(AF_INET6, &mut w).is_some());
        assert_eq!(w, v6("fd00::7"));
        // Unbound and loopback ends are no node's address: never in a derived map, left alone.
        let mut w = v6("::");
        assert_eq!(m.rewrite(AF_INET6, &mut w), None);
        // Another family, or too few words: untouched.
        let mut w = [v4("10.0.0.1")];
        assert_eq!(m.rewrite(17, &mut w), None);
        assert_eq!(m.rewrite(AF_INET6, &mut w), None);
        assert_eq!(w, [v4("10.0.0.1")]);
    }

    #[test]
    fn a_map_goes_through_json_as_the_nodes_share_it_in_etcd() {
        let m: AddressMap = "10.0.0.1=10.0.0.7,fd00::1=fd00::7".parse().unwrap();
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<AddressMap>(&text).unwrap(), m);
    }

    #[test]
    fn maps_of_several_nodes_merge_unless_they_disagree() {
        let mut all: AddressMap = "10.0.0.1=10.0.0.7".parse().unwrap();
        all.merge(&"10.0.0.2=10.0.0.8".parse().unwrap()).unwrap();
        all.merge(&"10.0.0.1=10.0.0.7".parse().unwrap()).unwrap();
        assert_eq!(all.to_string(), "10.0.0.1=10.0.0.7,10.0.0.2=10.0.0.8");
        assert!(all.merge(&"10.0.0.1=10.0.0.9".parse().unwrap()).is_err());
    }
}
