//! Which local GPU takes the place of each GPU of a checkpoint.
//!
//! The rules are those of CRIU's amdgpu plugin, so that a checkpoint restores where it would
//! restore with it: the same number of GPUs (KFD refuses a restore onto another count); XGMI
//! hives matched first, each onto a hive at least as large; GPU properties equal, except those a
//! `KFD_*_CHECK` switch relaxes; no fewer usable links; links to CPUs that keep GPUs of one NUMA
//! node together (`KFD_NUMA_CHECK`); an XGMI link is never replaced by PCIe, nor a two-way link
//! by a one-way one. The search backtracks over the candidates.

use std::collections::BTreeMap;

use super::{Link, LinkView, Node, Topology, LINK_PCIE, LINK_XGMI};

/// The property checks that can be switched off (all on by default, as upstream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    pub capability: bool,
    pub vram_size: bool,
    pub num_gws: bool,
    pub caches_count: bool,
    pub fw_version: bool,
    pub sdma_fw_version: bool,
    pub numa: bool,
}

impl Default for Checks {
    fn default() -> Checks {
        Checks {
            capability: true,
            vram_size: true,
            num_gws: true,
            caches_count: true,
            fw_version: true,
            sdma_fw_version: true,
            numa: true,
        }
    }
}

/// Source gpu_id -> local gpu_id, and the CPU (NUMA) nodes they imply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuMap {
    pub gpus: BTreeMap<u32, u32>,
    pub cpus: BTreeMap<u32, u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatchError {
    #[error(
        "the checkpoint used {checkpoint} GPU(s) but {here} are visible here; KFD restores only \
         onto the same number: make exactly {checkpoint} visible to the restored process (e.g. \
         the container's devices)"
    )]
    Count { checkpoint: usize, here: usize },
    #[error("the checkpoint has {checkpoint} XGMI hive(s) but this machine {here}: restore on a machine with the same XGMI layout")]
    Hives { checkpoint: usize, here: usize },
    #[error("no assignment of local GPUs fits the checkpoint's GPUs: {0}")]
    NoFit(String),
}

struct Side<'a> {
    topo: &'a Topology,
    links: LinkView,
}

impl Side<'_> {
    /// A node of this side (ids come from its own topology: always found).
    fn node(&self, id: u32) -> Option<&Node> {
        self.topo.node(id)
    }
    fn links(&self, id: u32) -> &[Link] {
        self.links.valid.get(&id).map_or(&[], Vec::as_slice)
    }
}

/// Why `dst` cannot stand in for `src` (None: it can, as far as properties go).
fn property_mismatch(src: &Node, dst: &Node, c: &Checks) -> Option<String> {
    let (s, d) = (&src.props, &dst.props);
    macro_rules! equal {
        ($($f:ident),*) => {$(
            if s.$f != d.$f {
                return Some(format!("{} differs ({:#x} vs {:#x})", stringify!($f), s.$f, d.$f));
            }
        )*};
    }
    equal!(
        vendor_id,
        device_id,
        simd_count,
        mem_banks_count,
        io_links_count,
        max_waves_per_simd,
        lds_size_in_kb,
        wave_front_size,
        array_count,
        simd_arrays_per_engine,
        cu_per_simd_array,
        simd_per_cu,
        max_slots_scratch_cu,
        num_sdma_engines,
        num_sdma_xgmi_engines,
        num_sdma_queues_per_engine,
        num_cp_queues
    );
    if s.vram_public != d.vram_public {
        return Some("VRAM visibility differs (public vs private frame buffer)".into());
    }
    macro_rules! at_least {
        ($switch:ident, $f:ident, $var:literal) => {
            if c.$switch && d.$f < s.$f {
                return Some(format!(
                    "{} is lower here ({} < {}; {}=0 allows it)",
                    stringify!($f),
                    d.$f,
                    s.$f,
                    $var
                ));
            }
        };
    }
    if c.capability && s.capability != d.capability {
        return Some(format!(
            "capability differs ({:#x} vs {:#x}; KFD_CAPABILITY_CHECK=0 allows it)",
            s.capability, d.capability
        ));
    }
    at_least!(vram_size, vram_size, "KFD_VRAM_SIZE_CHECK");
    at_least!(num_gws, num_gws, "KFD_NUM_GWS_CHECK");
    at_least!(caches_count, caches_count, "KFD_CACHES_COUNT_CHECK");
    at_least!(fw_version, fw_version, "KFD_FW_VER_CHECK");
    at_least!(sdma_fw_version, sdma_fw_version, "KFD_SDMA_FW_VER_CHECK");
    None
}

/// Can link `d` replace link `s`? Not across GPU/CPU, not XGMI by PCIe, not two-way by one-way.
fn link_fits(s: &Link, d: &Link) -> bool {
    let xgmi_by_pcie = s.kind == LINK_XGMI && d.kind == LINK_PCIE;
    s.to_gpu == d.to_gpu && !xgmi_by_pcie && (d.both_ways || !s.both_ways)
}

struct Search<'a> {
    src: Side<'a>,
    dst: Side<'a>,
    checks: Checks,
    map: GpuMap,
    /// First reason each source GPU could not be placed, for the error message.
    why: BTreeMap<u32, String>,
}

impl Search<'_> {
    /// Tries `src` -> `dst`; on success returns the CPU pairs it adds.
    fn fits(&mut self, src: u32, dst: u32) -> Option<Vec<(u32, u32)>> {
        let (Some(s), Some(d)) = (self.src.node(src), self.dst.node(dst)) else {
            return None;
        };
        if let Some(why) = property_mismatch(s, d, &self.checks) {
            self.why
                .entry(s.gpu_id)
                .or_insert(format!("GPU {:#06x} -> {:#06x}: {why}", s.gpu_id, d.gpu_id));
            return None;
        }
        let (sl, dl) = (self.src.links(src), self.dst.links(dst));
        if sl.len() > dl.len() {
            self.why.entry(s.gpu_id).or_insert(format!(
                "GPU {:#06x} -> {:#06x}: fewer usable links ({} < {})",
                s.gpu_id,
                d.gpu_id,
                dl.len(),
                sl.len()
            ));
            return None;
        }
        let mut new_cpus: Vec<(u32, u32)> = Vec::new();
        for l in sl.iter().filter(|l| !l.to_gpu) {
            let ok = if !self.checks.numa {
                dl.iter().any(|d| link_fits(l, d))
            } else {
                let mapped = self
                    .map
                    .cpus
                    .get(&l.to)
                    .copied()
                    .or_else(|| new_cpus.iter().find(|(a, _)| *a == l.to).map(|(_, b)| *b));
                match mapped {
                    Some(cpu) => dl
                        .iter()
                        .any(|d| d.to == cpu && d.kind == l.kind && link_fits(l, d)),
                    None => {
                        let taken = |c: u32| {
                            self.map.cpus.values().any(|v| *v == c)
                                || new_cpus.iter().any(|(_, v)| *v == c)
                        };
                        match dl.iter().find(|d| link_fits(l, d) && !taken(d.to)) {
                            Some(d) => {
                                new_cpus.push((l.to, d.to));
                                true
                            }
                            None => false,
                        }
                    }
                }
            };
            if !ok {
                self.why.entry(s.gpu_id).or_insert(format!(
                    "GPU {:#06x} -> {:#06x}: its link to CPU node {} has no equivalent (KFD_NUMA_CHECK=0 relaxes this)",
                    s.gpu_id, d.gpu_id, l.to
                ));
                return None;
            }
        }
        Some(new_cpus)
    }

    /// Places every GPU of `srcs` on a distinct GPU of `dsts` (node ids), backtracking.
    fn place(&mut self, srcs: &[u32], dsts: &mut Vec<u32>) -> bool {
        let Some((&first, rest)) = srcs.split_first() else {
            return true;
        };
        for i in 0..dsts.len() {
            let dst = dsts[i];
            let Some(cpus) = self.fits(first, dst) else {
                continue;
            };
            let (Some(s), Some(d)) = (self.src.node(first), self.dst.node(dst)) else {
                continue;
            };
            let (sg, dg) = (s.gpu_id, d.gpu_id);
            self.map.gpus.insert(sg, dg);
            self.map.cpus.extend(cpus.iter().copied());
            dsts.remove(i);
            if self.place(rest, dsts) {
                return true;
            }
            dsts.insert(i, dst);
            self.map.gpus.remove(&sg);
            for (a, _) in &cpus {
                self.map.cpus.remove(a);
            }
        }
        false
    }

    /// Maps source hives onto distinct local hives at least as large, backtracking.
    fn place_hives(&mut self, src_hives: &[Vec<u32>], dst_hives: &mut Vec<Vec<u32>>) -> bool {
        let Some((first, rest)) = src_hives.split_first() else {
            return true;
        };
        for i in 0..dst_hives.len() {
            if dst_hives[i].len() < first.len() {
                continue;
            }
            let saved = self.map.clone();
            let mut members = dst_hives[i].clone();
            if self.place(first, &mut members) {
                let hive = dst_hives.remove(i);
                if self.place_hives(rest, dst_hives) {
                    return true;
                }
                dst_hives.insert(i, hive);
            }
            self.map = saved;
        }
        false
    }
}

/// Assigns each GPU of `src` (the checkpoint) a GPU of `dst` (this machine).
pub fn map_gpus(src: &Topology, dst: &Topology, checks: &Checks) -> Result<GpuMap, MatchError> {
    let (ns, nd) = (src.gpus().count(), dst.gpus().count());
    if ns != nd {
        return Err(MatchError::Count {
            checkpoint: ns,
            here: nd,
        });
    }
    let mut s = Search {
        src: Side {
            topo: src,
            links: src.links(),
        },
        dst: Side {
            topo: dst,
            links: dst.links(),
        },
        checks: *checks,
        map: GpuMap::default(),
        why: BTreeMap::new(),
    };
    let src_hives = s.src.links.hives.clone();
    let mut dst_hives = s.dst.links.hives.clone();
    if src_hives.len() > dst_hives.len() {
        return Err(MatchError::Hives {
            checkpoint: src_hives.len(),
            here: dst_hives.len(),
        });
    }
    let explain = |s: &Search| {
        if s.why.is_empty() {
            "the XGMI hives do not fit".to_owned()
        } else {
            s.why.values().cloned().collect::<Vec<_>>().join("; ")
        }
    };
    if !s.place_hives(&src_hives, &mut dst_hives) {
        return Err(MatchError::NoFit(explain(&s)));
    }
    let rest: Vec<u32> = src
        .gpus()
        .filter(|g| !s.map.gpus.contains_key(&g.gpu_id))
        .map(|g| g.id)
        .collect();
    let mut free: Vec<u32> = dst
        .gpus()
        .filter(|g| !s.map.gpus.values().any(|v| *v == g.gpu_id))
        .map(|g| g.id)
        .collect();
    if !s.place(&rest, &mut free) {
        return Err(MatchError::NoFit(explain(&s)));
    }
    Ok(s.map)
}

#[cfg(test)]
mod tests {
    use super::super::fixture::*;
    use super::*;

    fn all_mapped(src: &Topology, m: &GpuMap) {
        assert_eq!(m.gpus.len(), src.gpus().count());
        let mut targets: Vec<u32> = m.gpus.values().copied().collect();
        targets.sort();
        targets.dedup();
        assert_eq!(
            targets.len(),
            m.gpus.len(),
            "each source GPU on its own GPU"
        );
    }

    #[test]
    fn same_machine_maps_onto_itself() {
        for t in [single_gpu(), mi300x_8_xgmi(), two_hives_of_four()] {
            let m = map_gpus(&t, &t, &Checks::default()).unwrap();
            all_mapped(&t, &m);
        }
    }

    #[test]
    fn another_machine_with_other_gpu_ids_and_swapped_hives() {
        // Hives of different models, in the opposite order on the destination.
        let src = machine(
            2,
            &[MI300X, MI300X, MI300X, MI300X, MI210, MI210, MI210, MI210],
            &[&[0, 1, 2, 3], &[4, 5, 6, 7]],
            0,
        );
        let dst = machine(
            2,
            &[MI210, MI210, MI210, MI210, MI300X, MI300X, MI300X, MI300X],
            &[&[0, 1, 2, 3], &[4, 5, 6, 7]],
            7,
        );
        let m = map_gpus(&src, &dst, &Checks::default()).unwrap();
        all_mapped(&src, &m);
        for (s, d) in &m.gpus {
            assert_eq!(
                src.gpu(*s).unwrap().props.device_id,
                dst.gpu(*d).unwrap().props.device_id
            );
        }
    }

    #[test]
    fn a_hive_lands_inside_one_hive() {
        let src = machine(1, &[MI300X; 4], &[&[0, 1], &[2, 3]], 0);
        let dst = machine(1, &[MI300X; 4], &[&[0, 1, 2, 3]], 3);
        // Two hives need two hives here.
        assert!(matches!(
            map_gpus(&src, &dst, &Checks::default()),
            Err(MatchError::Hives { .. })
        ));
        // A hive of four beside four single GPUs, placed at the other end of the machine.
        let src = machine(2, &[MI300X; 8], &[&[0, 1, 2, 3]], 0);
        let dst = machine(2, &[MI300X; 8], &[&[4, 5, 6, 7]], 3);
        let m = map_gpus(&src, &dst, &Checks::default()).unwrap();
        all_mapped(&src, &m);
        for s in src.links().hives[0]
            .iter()
            .map(|id| src.node(*id).unwrap().gpu_id)
        {
            let d = dst.gpu(m.gpus[&s]).unwrap();
            assert_ne!(d.props.hive_id, 0, "hive members stay in a hive");
        }
    }

    #[test]
    fn xgmi_is_not_replaced_by_pcie() {
        let src = machine(1, &[MI300X; 2], &[&[0, 1]], 0);
        // The same machine with a PCIe peer link instead of XGMI (same link count).
        let mut dst = machine(1, &[MI300X; 2], &[], 3);
        let (a, b) = (dst.nodes[1].id, dst.nodes[2].id);
        dst.nodes[1].links.push(super::super::IoLink {
            kind: LINK_PCIE,
            to: b,
        });
        dst.nodes[2].links.push(super::super::IoLink {
            kind: LINK_PCIE,
            to: a,
        });
        for n in &mut dst.nodes[1..] {
            n.props.io_links_count = 2;
        }
        assert!(matches!(
            map_gpus(&src, &dst, &Checks::default()),
            Err(MatchError::Hives { .. })
        ));
        // The other way round is fine: XGMI may replace PCIe.
        let m = map_gpus(&dst, &src, &Checks::default()).unwrap();
        all_mapped(&dst, &m);
    }

    #[test]
    fn property_checks_and_their_switches() {
        let src = single_gpu();
        let mut dst = single_gpu();
        dst.nodes[1].props.fw_version -= 1;
        let e = map_gpus(&src, &dst, &Checks::default()).unwrap_err();
        assert!(e.to_string().contains("KFD_FW_VER_CHECK=0"), "{e}");
        let relaxed = Checks {
            fw_version: false,
            ..Checks::default()
        };
        assert!(map_gpus(&src, &dst, &relaxed).is_ok());
        // More VRAM is fine, less is not.
        let mut dst = single_gpu();
        dst.nodes[1].props.vram_size /= 2;
        assert!(map_gpus(&src, &dst, &Checks::default())
            .unwrap_err()
            .to_string()
            .contains("vram_size"));
        assert!(map_gpus(&dst, &src, &Checks::default()).is_ok());
        // Another model never fits.
        let mut dst = single_gpu();
        dst.nodes[1].props.device_id = MI300X;
        assert!(map_gpus(&src, &dst, &Checks::default())
            .unwrap_err()
            .to_string()
            .contains("device_id"));
    }

    #[test]
    fn numa_placement_keeps_gpus_of_a_socket_together() {
        // Source: GPUs 0,1 on socket 0 and 2,3 on socket 1. Destination: same.
        let src = machine(2, &[MI300X; 4], &[], 0);
        let dst = machine(2, &[MI300X; 4], &[], 5);
        let m = map_gpus(&src, &dst, &Checks::default()).unwrap();
        all_mapped(&src, &m);
        assert_eq!(m.cpus.len(), 2);
        // Destination: all four GPUs on one socket.
        let lopsided = machine(1, &[MI300X; 4], &[], 5);
        assert!(map_gpus(&src, &lopsided, &Checks::default()).is_err());
        let no_numa = Checks {
            numa: false,
            ..Checks::default()
        };
        assert!(map_gpus(&src, &lopsided, &no_numa).is_ok());
    }

    #[test]
    fn counts_must_match() {
        let e = map_gpus(&mi300x_8_xgmi(), &single_gpu(), &Checks::default()).unwrap_err();
        assert_eq!(
            e,
            MatchError::Count {
                checkpoint: 8,
                here: 1
            }
        );
        // A container that sees one GPU of an 8-GPU machine restores a 1-GPU checkpoint.
        let big = mi300x_8_xgmi();
        let one = big.restricted_to(&[big.gpus().next().unwrap().gpu_id]);
        let other = machine(2, &[MI300X; 8], &[&[0, 1, 2, 3, 4, 5, 6, 7]], 9);
        let src = other.restricted_to(&[other.gpus().nth(3).unwrap().gpu_id]);
        let m = map_gpus(&src, &one, &Checks::default()).unwrap();
        all_mapped(&src, &m);
    }
}
