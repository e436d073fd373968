//! GPU UUIDs as NVIDIA prints them (`GPU-8c4d3b1e-...`) and restore-time device maps.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A GPU's 16-byte UUID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuUuid(pub [u8; 16]);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("{0:?} is not a GPU UUID (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
    Uuid(String),
    #[error("{0:?} is not a device map entry (expected OLD_UUID=NEW_UUID)")]
    Pair(String),
    #[error("GPU {0} appears twice on the old side of the device map")]
    DuplicateOld(GpuUuid),
    #[error("GPU {0} appears twice on the new side of the device map")]
    DuplicateNew(GpuUuid),
}

impl FromStr for GpuUuid {
    type Err = ParseError;

    /// Accepts `GPU-` + 32 hex digits with or without dashes, as nvidia-smi and NVML print them.
    fn from_str(s: &str) -> Result<GpuUuid, ParseError> {
        let t = s.trim();
        let hex: String = t
            .strip_prefix("GPU-")
            .unwrap_or(t)
            .chars()
            .filter(|c| *c != '-')
            .collect();
        if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(ParseError::Uuid(s.to_owned()));
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| ParseError::Uuid(s.to_owned()))?;
        }
        Ok(GpuUuid(out))
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(f, "GPU-")?;
        for (i, byte) in b.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                write!(f, "-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for GpuUuid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GpuUuid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<GpuUuid, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Restore-time GPU remapping: each old GPU's state goes onto the paired new GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMap(Vec<(GpuUuid, GpuUuid)>);

impl DeviceMap {
    pub fn new(pairs: Vec<(GpuUuid, GpuUuid)>) -> Result<DeviceMap, ParseError> {
        for (i, (old, new)) in pairs.iter().enumerate() {
            if pairs[..i].iter().any(|(o, _)| o == old) {
                return Err(ParseError::DuplicateOld(*old));
            }
            if pairs[..i].iter().any(|(_, n)| n == new) {
                return Err(ParseError::DuplicateNew(*new));
            }
        }
        Ok(DeviceMap(pairs))
    }

    pub fn pairs(&self) -> &[(GpuUuid, GpuUuid)] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Where `old` goes (itself when the map does not mention it).
    pub fn target(&self, old: GpuUuid) -> GpuUuid {
        self.0
            .iter()
            .find(|(o, _)| *o == old)
            .map_or(old, |(_, n)| *n)
    }

    /// The map restricted to `gpus`, with identity pairs for the ones it does not move: the
    /// driver wants every checkpointed device listed once a map is given.
    /// Fails when two GPUs would land on the same new GPU.
    pub fn complete_for(&self, gpus: &[GpuUuid]) -> Result<DeviceMap, ParseError> {
        if self.is_empty() {
            return Ok(DeviceMap::default());
        }
        DeviceMap::new(gpus.iter().map(|g| (*g, self.target(*g))).collect())
    }
}

impl FromStr for DeviceMap {
    type Err = ParseError;

    /// `OLD=NEW[,OLD=NEW...]`, the syntax of `cuda-checkpoint --device-map`.
    fn from_str(s: &str) -> Result<DeviceMap, ParseError> {
        let mut pairs = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (old, new) = entry
                .split_once('=')
                .ok_or_else(|| ParseError::Pair(entry.to_owned()))?;
            pairs.push((old.parse()?, new.parse()?));
        }
        DeviceMap::new(pairs)
    }
}

impl fmt::Display for DeviceMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (o, n)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{o}={n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "GPU-8c4d3b1e-0b7a-4f1e-9c3d-1a2b3c4d5e6f";
    const B: &str = "GPU-00000000-0000-0000-0000-0000000000ff";

    #[test]
    fn uuid_round_trips_in_nvidia_format() {
        let u: GpuUuid = A.parse().unwrap();
        assert_eq!(u.to_string(), A);
        let bare: GpuUuid = "8c4d3b1e0b7a4f1e9c3d1a2b3c4d5e6f".parse().unwrap();
        assert_eq!(bare, u);
        assert!("GPU-1234".parse::<GpuUuid>().is_err());
        assert!("GPU-zz4d3b1e-0b7a-4f1e-9c3d-1a2b3c4d5e6f"
            .parse::<GpuUuid>()
            .is_err());
    }

    #[test]
    fn device_map_parses_and_completes() {
        let m: DeviceMap = format!("{A}={B}").parse().unwrap();
        let a: GpuUuid = A.parse().unwrap();
        let b: GpuUuid = B.parse().unwrap();
        assert_eq!(m.target(a), b);
        assert_eq!(m.target(b), b);
        let c: GpuUuid = "GPU-11111111-2222-3333-4444-555555555555".parse().unwrap();
        let full = m.complete_for(&[a, c]).unwrap();
        assert_eq!(full.pairs(), &[(a, b), (c, c)]);
        assert!(matches!(
            m.complete_for(&[a, b]),
            Err(ParseError::DuplicateNew(_))
        ));
        assert_eq!(m.to_string(), format!("{A}={B}"));
        assert!(DeviceMap::default().complete_for(&[a]).unwrap().is_empty());
    }

    #[test]
    fn device_map_rejects_bad_input() {
        assert!(matches!(A.parse::<DeviceMap>(), Err(ParseError::Pair(_))));
        assert!(matches!(
            format!("{A}={B},{A}={B}").parse::<DeviceMap>(),
            Err(ParseError::DuplicateOld(_))
        ));
        assert!(matches!(
            format!("{A}={B},{B}={B}").parse::<DeviceMap>(),
            Err(ParseError::DuplicateNew(_))
        ));
    }
}
