//! The KFD topology in sysfs (`/sys/class/kfd/kfd/topology/nodes/N/...`): CPU and GPU nodes,
//! their properties, memory banks and IO links; and which links are usable and which GPUs form
//! XGMI hives. Also writes the same layout, for fixtures and the simulated KFD.

mod matching;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use self::matching::{map_gpus, Checks, GpuMap, MatchError};

pub const TOPOLOGY_ROOT: &str = "/sys/class/kfd/kfd/topology/nodes";
pub const LINK_PCIE: u32 = 2;
pub const LINK_XGMI: u32 = 11;
const HEAP_PUBLIC: u64 = 1;
const HEAP_PRIVATE: u64 = 2;

/// Node properties the restore checks compare (sysfs `properties`, and the memory bank).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Props {
    pub cpu_cores_count: u32,
    pub simd_count: u32,
    pub mem_banks_count: u32,
    pub caches_count: u32,
    pub io_links_count: u32,
    pub max_waves_per_simd: u32,
    pub lds_size_in_kb: u32,
    pub num_gws: u32,
    pub wave_front_size: u32,
    pub array_count: u32,
    pub simd_arrays_per_engine: u32,
    pub cu_per_simd_array: u32,
    pub simd_per_cu: u32,
    pub max_slots_scratch_cu: u32,
    pub vendor_id: u32,
    pub device_id: u32,
    pub domain: u32,
    pub drm_render_minor: u32,
    pub hive_id: u64,
    pub num_sdma_engines: u32,
    pub num_sdma_xgmi_engines: u32,
    pub num_sdma_queues_per_engine: u32,
    pub num_cp_queues: u32,
    pub fw_version: u32,
    pub capability: u32,
    pub sdma_fw_version: u32,
    /// From the first public or private frame-buffer memory bank.
    pub vram_public: bool,
    pub vram_size: u64,
}

/// A link as sysfs lists it (PCIe and XGMI only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoLink {
    pub kind: u32,
    pub to: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// sysfs node number.
    pub id: u32,
    /// 0 for a CPU node.
    pub gpu_id: u32,
    pub props: Props,
    pub links: Vec<IoLink>,
}

impl Node {
    pub fn is_gpu(&self) -> bool {
        self.gpu_id != 0
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub nodes: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read the KFD topology at {path}: {reason} (is the amdgpu driver loaded?)")]
    Unreadable { path: String, reason: String },
    #[error("{path}: cannot parse line {line:?}")]
    BadLine { path: String, line: String },
    #[error("{path}: no public or private frame-buffer memory bank with a size")]
    NoVram { path: String },
}

fn unreadable(p: &Path, e: impl ToString) -> TopologyError {
    TopologyError::Unreadable {
        path: p.display().to_string(),
        reason: e.to_string(),
    }
}

/// `name value` lines.
fn read_props(path: &Path) -> Result<Vec<(String, u64)>, TopologyError> {
    let text = fs::read_to_string(path).map_err(|e| unreadable(path, e))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut it = l.split_whitespace();
            match (it.next(), it.next().and_then(|v| v.parse::<u64>().ok())) {
                (Some(k), Some(v)) => Ok((k.to_owned(), v)),
                _ => Err(TopologyError::BadLine {
                    path: path.display().to_string(),
                    line: l.to_owned(),
                }),
            }
        })
        .collect()
}

/// Numeric subdirectories, in numeric order.
fn numbered(dir: &Path) -> Result<Vec<(u32, PathBuf)>, TopologyError> {
    let mut out: Vec<(u32, PathBuf)> = fs::read_dir(dir)
        .map_err(|e| unreadable(dir, e))?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
        .collect();
    out.sort();
    Ok(out)
}

macro_rules! props_table {
    ($($field:ident),* $(,)?) => {
        fn set_prop(p: &mut Props, name: &str, v: u64) {
            match name {
                $(stringify!($field) => p.$field = v as _,)*
                _ => {}
            }
        }
        fn props_lines(p: &Props) -> String {
            let mut s = String::new();
            $(s.push_str(&format!("{} {}\n", stringify!($field), p.$field));)*
            s
        }
    };
}

props_table!(
    cpu_cores_count,
    simd_count,
    mem_banks_count,
    caches_count,
    io_links_count,
    max_waves_per_simd,
    lds_size_in_kb,
    num_gws,
    wave_front_size,
    array_count,
    simd_arrays_per_engine,
    cu_per_simd_array,
    simd_per_cu,
    max_slots_scratch_cu,
    vendor_id,
    device_id,
    domain,
    drm_render_minor,
    hive_id,
    num_sdma_engines,
    num_sdma_xgmi_engines,
    num_sdma_queues_per_engine,
    num_cp_queues,
    fw_version,
    capability,
    sdma_fw_version,
);

impl Topology {
    /// The kernel's topology root.
    pub fn default_root() -> PathBuf {
        PathBuf::from(TOPOLOGY_ROOT)
    }

    /// Parses the `nodes` directory. Nodes that cannot be reached (a container's device cgroup
    /// masks them; here: a node entry that cannot be stat'ed) are left out, as the GPUs a
    /// process there can use are the only ones that count.
    pub fn parse(root: &Path) -> Result<Topology, TopologyError> {
        let mut nodes = Vec::new();
        for (id, dir) in numbered(root)? {
            if fs::metadata(&dir).map(|m| !m.is_dir()).unwrap_or(true) {
                tracing::debug!(node = id, "topology node not accessible, skipped");
                continue;
            }
            let gpu_id_path = dir.join("gpu_id");
            let gpu_id: u32 = fs::read_to_string(&gpu_id_path)
                .map_err(|e| unreadable(&gpu_id_path, e))?
                .trim()
                .parse()
                .map_err(|_| TopologyError::BadLine {
                    path: gpu_id_path.display().to_string(),
                    line: "gpu_id".into(),
                })?;
            let mut props = Props::default();
            for (k, v) in read_props(&dir.join("properties"))? {
                set_prop(&mut props, &k, v);
            }
            if gpu_id != 0 {
                let banks = numbered(&dir.join("mem_banks"))?;
                let vram = banks.iter().find_map(|(_, b)| {
                    let kv = read_props(&b.join("properties")).ok()?;
                    let get = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
                    let heap = get("heap_type")?;
                    (heap == HEAP_PUBLIC || heap == HEAP_PRIVATE)
                        .then(|| (heap == HEAP_PUBLIC, get("size_in_bytes").unwrap_or(0)))
                });
                match vram {
                    Some((public, size)) if size > 0 => {
                        props.vram_public = public;
                        props.vram_size = size;
                    }
                    _ => {
                        return Err(TopologyError::NoVram {
                            path: dir.display().to_string(),
                        })
                    }
                }
            }
            let mut links = Vec::new();
            let link_dir = dir.join("io_links");
            if link_dir.exists() {
                for (_, l) in numbered(&link_dir)? {
                    let kv = read_props(&l.join("properties"))?;
                    let get = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| *v as u32);
                    if let (Some(kind @ (LINK_PCIE | LINK_XGMI)), Some(to)) =
                        (get("type"), get("node_to"))
                    {
                        links.push(IoLink { kind, to });
                    }
                }
            }
            nodes.push(Node {
                id,
                gpu_id,
                props,
                links,
            });
        }
        Ok(Topology { nodes })
    }

    /// Writes the sysfs layout (fixtures, the simulated KFD).
    pub fn write(&self, root: &Path) -> std::io::Result<()> {
        for n in &self.nodes {
            let dir = root.join(n.id.to_string());
            fs::create_dir_all(dir.join("mem_banks"))?;
            fs::create_dir_all(dir.join("io_links"))?;
            fs::write(dir.join("gpu_id"), format!("{}\n", n.gpu_id))?;
            fs::write(dir.join("name"), if n.is_gpu() { "gfx942\n" } else { "\n" })?;
            fs::write(dir.join("properties"), props_lines(&n.props))?;
            if n.is_gpu() {
                fs::create_dir_all(dir.join("mem_banks/0"))?;
                fs::write(
                    dir.join("mem_banks/0/properties"),
                    format!(
                        "heap_type {}\nsize_in_bytes {}\nflags 0\nwidth 4096\nmem_clk_max 1300\n",
                        if n.props.vram_public {
                            HEAP_PUBLIC
                        } else {
                            HEAP_PRIVATE
                        },
                        n.props.vram_size
                    ),
                )?;
            }
            for (i, l) in n.links.iter().enumerate() {
                let ld = dir.join(format!("io_links/{i}"));
                fs::create_dir_all(&ld)?;
                fs::write(
                    ld.join("properties"),
                    format!(
                        "type {}\nversion_major 0\nversion_minor 0\nnode_from {}\nnode_to {}\nweight 20\n",
                        l.kind, n.id, l.to
                    ),
                )?;
            }
        }
        Ok(())
    }

    pub fn gpus(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.is_gpu())
    }

    pub fn gpu(&self, gpu_id: u32) -> Option<&Node> {
        self.gpus().find(|n| n.gpu_id == gpu_id)
    }

    pub fn node(&self, id: u32) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The CPUs and only the listed GPUs: what a process used. Links to the others become
    /// invalid, as for nodes a container cannot see.
    pub fn restricted_to(&self, gpu_ids: &[u32]) -> Topology {
        Topology {
            nodes: self
                .nodes
                .iter()
                .filter(|n| !n.is_gpu() || gpu_ids.contains(&n.gpu_id))
                .cloned()
                .collect(),
        }
    }

    /// Usable links and XGMI hives.
    pub fn links(&self) -> LinkView {
        let mut valid: BTreeMap<u32, Vec<Link>> = BTreeMap::new();
        for n in &self.nodes {
            let list = n
                .links
                .iter()
                .filter_map(|l| {
                    let peer = self.node(l.to)?;
                    Some(Link {
                        kind: l.kind,
                        to: l.to,
                        to_gpu: peer.is_gpu(),
                        both_ways: peer.links.iter().any(|b| b.kind == l.kind && b.to == n.id),
                    })
                })
                .collect();
            valid.insert(n.id, list);
        }
        // Hives: GPUs joined by two-way XGMI links (union-find over node ids).
        let mut parent: BTreeMap<u32, u32> = self.gpus().map(|g| (g.id, g.id)).collect();
        fn root(parent: &mut BTreeMap<u32, u32>, mut x: u32) -> u32 {
            while parent[&x] != x {
                let up = parent[&parent[&x]];
                parent.insert(x, up);
                x = up;
            }
            x
        }
        for (id, list) in &valid {
            for l in list
                .iter()
                .filter(|l| l.kind == LINK_XGMI && l.both_ways && l.to_gpu)
            {
                if parent.contains_key(id) {
                    let (a, b) = (root(&mut parent, *id), root(&mut parent, l.to));
                    parent.insert(a.max(b), a.min(b));
                }
            }
        }
        let mut groups: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for id in parent.keys().copied().collect::<Vec<_>>() {
            let r = root(&mut parent, id);
            groups.entry(r).or_default().push(id);
        }
        LinkView {
            valid,
            hives: groups.into_values().filter(|g| g.len() > 1).collect(),
        }
    }
}

/// A usable link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub kind: u32,
    pub to: u32,
    pub to_gpu: bool,
    /// The peer links back with the same kind.
    pub both_ways: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkView {
    /// node id -> its usable links
    pub valid: BTreeMap<u32, Vec<Link>>,
    /// XGMI hives as lists of GPU node ids.
    pub hives: Vec<Vec<u32>>,
}

pub mod fixture;

#[cfg(test)]
mod tests {
    use super::fixture::*;
    use super::*;

    #[test]
    fn parse_reads_back_what_write_wrote() {
        for topo in [single_gpu(), mi300x_8_xgmi()] {
            let d = tempfile::tempdir().unwrap();
            topo.write(d.path()).unwrap();
            assert_eq!(Topology::parse(d.path()).unwrap(), topo);
        }
    }

    #[test]
    fn hives_and_link_validity() {
        let t = two_hives_of_four();
        let v = t.links();
        assert_eq!(v.hives.len(), 2);
        assert!(v.hives.iter().all(|h| h.len() == 4));
        // Hide one GPU (as a container's device cgroup does): its links become invalid.
        let hidden = t.restricted_to(&t.gpus().skip(1).map(|g| g.gpu_id).collect::<Vec<_>>());
        let v = hidden.links();
        assert_eq!(v.hives.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 4]);
        let first = t.gpus().nth(1).unwrap().id;
        assert_eq!(v.valid[&first].iter().filter(|l| l.to_gpu).count(), 2);
    }

    #[test]
    fn unreachable_nodes_are_skipped_and_bad_files_refused() {
        let d = tempfile::tempdir().unwrap();
        let t = mi300x_8_xgmi();
        t.write(d.path()).unwrap();
        // A node the container cannot reach: its entry exists but cannot be followed.
        let gone = d.path().join("9");
        fs::rename(&gone, d.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink("/nonexistent-node", &gone).unwrap();
        let seen = Topology::parse(d.path()).unwrap();
        assert_eq!(seen.gpus().count(), 7);
        fs::write(d.path().join("2/properties"), "simd_count many\n").unwrap();
        assert!(matches!(
            Topology::parse(d.path()),
            Err(TopologyError::BadLine { .. })
        ));
        fs::write(d.path().join("2/properties"), "simd_count 4\n").unwrap();
        fs::write(d.path().join("2/mem_banks/0/properties"), "heap_type 0\n").unwrap();
        assert!(matches!(
            Topology::parse(d.path()),
            Err(TopologyError::NoVram { .. })
        ));
        assert!(matches!(
            Topology::parse(Path::new("/nonexistent")),
            Err(TopologyError::Unreadable { .. })
        ));
    }
}
