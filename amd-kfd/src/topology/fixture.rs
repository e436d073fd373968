//! Made-up topologies for tests and the simulated KFD, shaped like real ones: CPU nodes first,
//! GPUs with a PCIe link to their CPU (and back), XGMI links both ways inside a hive.

use super::{IoLink, Node, Props, Topology, LINK_PCIE, LINK_XGMI};

pub const MI300X: u32 = 0x74a1;
pub const MI210: u32 = 0x740f;

fn cpu(id: u32) -> Node {
    Node {
        id,
        gpu_id: 0,
        props: Props {
            cpu_cores_count: 48,
            simd_count: 0,
            mem_banks_count: 1,
            caches_count: 3,
            io_links_count: 0,
            ..Props::default()
        },
        links: Vec::new(),
    }
}

/// A GPU node, its gpu_id derived from the node id and a per-machine salt.
pub fn gpu(id: u32, device_id: u32, salt: u32) -> Node {
    Node {
        id,
        gpu_id: 0x1000 + id * 0x101 + salt,
        props: Props {
            simd_count: 1216,
            mem_banks_count: 1,
            caches_count: 433,
            max_waves_per_simd: 8,
            lds_size_in_kb: 64,
            num_gws: 64,
            wave_front_size: 64,
            array_count: 32,
            simd_arrays_per_engine: 1,
            cu_per_simd_array: 10,
            simd_per_cu: 4,
            max_slots_scratch_cu: 32,
            vendor_id: 0x1002,
            device_id,
            domain: 0,
            drm_render_minor: 128 + id,
            num_sdma_engines: 2,
            num_sdma_xgmi_engines: 14,
            num_sdma_queues_per_engine: 8,
            num_cp_queues: 24,
            fw_version: 157,
            capability: 0x2f48_6280,
            sdma_fw_version: 24,
            vram_public: true,
            vram_size: 192 << 30,
            ..Props::default()
        },
        links: Vec::new(),
    }
}

fn link(t: &mut Topology, a: u32, b: u32, kind: u32) {
    for (x, y) in [(a, b), (b, a)] {
        for n in t.nodes.iter_mut().filter(|n| n.id == x) {
            n.links.push(IoLink { kind, to: y });
        }
    }
}

/// Builds a machine: `cpus` CPU nodes, then GPUs (device ids) spread over the CPUs, then XGMI
/// hives given as lists of indices into the GPU list.
pub fn machine(cpus: u32, gpus: &[u32], hives: &[&[usize]], salt: u32) -> Topology {
    let mut t = Topology {
        nodes: (0..cpus).map(cpu).collect(),
    };
    let per_cpu = gpus.len().div_ceil(cpus as usize).max(1);
    for (i, dev) in gpus.iter().enumerate() {
        let id = cpus + i as u32;
        t.nodes.push(gpu(id, *dev, salt));
        link(&mut t, id, (i / per_cpu) as u32, LINK_PCIE);
    }
    for (h, members) in hives.iter().enumerate() {
        for (a, &i) in members.iter().enumerate() {
            for &j in &members[a + 1..] {
                link(&mut t, cpus + i as u32, cpus + j as u32, LINK_XGMI);
            }
            t.nodes[cpus as usize + i].props.hive_id = 0xabc0 + h as u64;
        }
    }
    for n in &mut t.nodes {
        n.props.io_links_count = n.links.len() as u32;
    }
    t
}

pub fn single_gpu() -> Topology {
    machine(1, &[MI210], &[], 0)
}

/// Eight MI300X in one XGMI hive on two sockets.
pub fn mi300x_8_xgmi() -> Topology {
    machine(2, &[MI300X; 8], &[&[0, 1, 2, 3, 4, 5, 6, 7]], 0)
}

/// Eight GPUs in two hives of four.
pub fn two_hives_of_four() -> Topology {
    machine(2, &[MI300X; 8], &[&[0, 1, 2, 3], &[4, 5, 6, 7]], 0)
}
