//! What the CUDA part of a checkpoint records about its GPUs, and the check before a restore:
//! does this machine have the GPUs (or the ones the operator maps them to) and the free memory?
//! Pure functions over the record and NVML's inventory.

use std::collections::BTreeMap;

use cuda_checkpoint_ctl::driver::{DeviceMap, DriverInfo, GpuUuid, ProcessState};
use cuda_checkpoint_ctl::inventory::{Gpu, Inventory};
use serde::{Deserialize, Serialize};

use crate::core::config::GpuPlacement;

/// The file in the image directory.
pub const RECORD: &str = "gpu-cuda.json";
pub const FORMAT: &str = "criu-gpu/cuda";

/// The CUDA part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaImage {
    pub driver: DriverInfo,
    /// NVML's driver version of the dumping machine, when known.
    pub driver_version: Option<String>,
    /// The dumping machine's GPUs.
    pub gpus: Vec<Gpu>,
    pub processes: Vec<ProcessRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// The pid inside the process's own pid namespace: what CRIU restores it as.
    pub ns_pid: i32,
    /// The pid at dump time, in CRIU's namespace (for messages).
    pub pid: i32,
    pub comm: String,
    /// The CUDA state before the dump; restore returns the process to it.
    pub initial_state: ProcessState,
    /// GPU memory held per GPU; empty when NVML could not tell.
    pub gpus: Vec<Usage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub uuid: GpuUuid,
    pub memory: Option<u64>,
}

/// How each process is restored: the GPU pairs to pass to the driver (empty: same GPUs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub maps: BTreeMap<i32, DeviceMap>,
    /// One line per GPU, for the log.
    pub notes: Vec<String>,
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn describe(gpus: &[Gpu]) -> String {
    gpus.iter()
        .map(|g| format!("{} ({}, {} free)", g.uuid, g.name, gib(g.memory_free)))
        .collect::<Vec<_>>()
        .join(", ")
}

impl CudaImage {
    /// The GPUs a process used; all of the machine's when NVML did not say.
    fn used_by(&self, p: &ProcessRecord) -> Vec<GpuUuid> {
        if p.gpus.is_empty() {
            self.gpus.iter().map(|g| g.uuid).collect()
        } else {
            p.gpus.iter().map(|u| u.uuid).collect()
        }
    }

    fn used(&self) -> Vec<GpuUuid> {
        let mut all: Vec<GpuUuid> = self
            .processes
            .iter()
            .filter(|p| p.initial_state != ProcessState::Checkpointed)
            .flat_map(|p| self.used_by(p))
            .collect();
        all.sort();
        all.dedup();
        all
    }

    fn name_of(&self, uuid: GpuUuid) -> &str {
        self.gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .map_or("?", |g| g.name.as_str())
    }
}

/// Decides where each process's GPU state goes, or says why it cannot be restored here.
pub fn plan(
    image: &CudaImage,
    here: Option<&Inventory>,
    placement: &GpuPlacement,
) -> Result<Plan, String> {
    let used = image.used();
    let Some(here) = here else {
        // Without NVML nothing can be checked; the driver will refuse what it cannot do.
        return match placement {
            GpuPlacement::Auto => Err(
                "CRIU_GPU_DEVICE_MAP=auto needs NVML (libnvidia-ml.so.1) to see this machine's GPUs; \
                 give an explicit OLD=NEW map instead"
                    .into(),
            ),
            GpuPlacement::Same => Ok(Plan::default()),
            GpuPlacement::Map(m) => maps_for(image, &|u| m.target(u)),
        };
    };
    if used.len() > here.gpus.len() {
        return Err(format!(
            "the checkpoint used {} GPU(s), this machine has {} ({}); restore on a machine with \
             at least {} GPU(s)",
            used.len(),
            here.gpus.len(),
            describe(&here.gpus),
            used.len()
        ));
    }
    let mut target: BTreeMap<GpuUuid, GpuUuid> = BTreeMap::new();
    for &src in &used {
        let dst = match placement {
            GpuPlacement::Same => src,
            GpuPlacement::Map(m) => m.target(src),
            GpuPlacement::Auto if here.gpu(src).is_some() => src,
            GpuPlacement::Auto => {
                let name = image.name_of(src);
                let taken: Vec<GpuUuid> = target.values().copied().collect();
                let mut free: Vec<&Gpu> = here
                    .gpus
                    .iter()
                    .filter(|g| !taken.contains(&g.uuid) && !used.contains(&g.uuid))
                    .collect();
                // Same model first, then the most free memory.
                free.sort_by_key(|g| (g.name != name, std::cmp::Reverse(g.memory_free)));
                free.first().map(|g| g.uuid).ok_or_else(|| {
                    format!("no free GPU here to take the checkpoint's GPU {src} ({name})")
                })?
            }
        };
        if here.gpu(dst).is_none() {
            return Err(format!(
                "the checkpoint's GPU {src} ({}) {} is not on this machine (GPUs here: {}); \
                 restore onto other GPUs with CRIU_GPU_DEVICE_MAP=OLD=NEW[,...] or \
                 CRIU_GPU_DEVICE_MAP=auto",
                image.name_of(src),
                if dst == src {
                    String::new()
                } else {
                    format!("mapped to {dst}")
                },
                describe(&here.gpus)
            ));
        }
        if let Some((other, _)) = target.iter().find(|(_, d)| **d == dst) {
            return Err(format!(
                "GPUs {other} and {src} of the checkpoint would both go to {dst}: each needs a GPU of its own"
            ));
        }
        target.insert(src, dst);
    }
    // Memory: what the restored processes need on each GPU against what is free there.
    let mut need: BTreeMap<GpuUuid, u64> = BTreeMap::new();
    for p in image
        .processes
        .iter()
        .filter(|p| p.initial_state != ProcessState::Checkpointed)
    {
        for u in &p.gpus {
            *need.entry(target[&u.uuid]).or_default() += u.memory.unwrap_or(0);
        }
    }
    let mut notes = Vec::new();
    for (dst, bytes) in &need {
        let g = here.gpu(*dst).expect("checked above");
        if *bytes > g.memory_free {
            return Err(format!(
                "GPU {dst} ({}) has {} free but the restored processes need {} on it: stop what \
                 uses it (see nvidia-smi), or restore onto another GPU with CRIU_GPU_DEVICE_MAP",
                g.name,
                gib(g.memory_free),
                gib(*bytes)
            ));
        }
        notes.push(format!(
            "GPU {dst}: {} needed, {} free",
            gib(*bytes),
            gib(g.memory_free)
        ));
    }
    let mut plan = maps_for(image, &|u| target.get(&u).copied().unwrap_or(u))?;
    plan.notes = notes;
    Ok(plan)
}

/// Per-process driver maps: none when nothing moves (older drivers accept no pairs at all).
fn maps_for(image: &CudaImage, target: &dyn Fn(GpuUuid) -> GpuUuid) -> Result<Plan, String> {
    let mut plan = Plan::default();
    for p in &image.processes {
        let gpus = image.used_by(p);
        if gpus.iter().all(|g| target(*g) == *g) {
            continue;
        }
        let map = DeviceMap::new(gpus.iter().map(|g| (*g, target(*g))).collect())
            .map_err(|e| format!("device map for process {} ({}): {e}", p.pid, p.comm))?;
        plan.maps.insert(p.ns_pid, map);
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid(n: u8) -> GpuUuid {
        GpuUuid([n; 16])
    }

    fn gpu(n: u8, name: &str, free_gib: u64) -> Gpu {
        Gpu {
            index: n as u32,
            uuid: uuid(n),
            name: name.into(),
            memory_total: 80 << 30,
            memory_used: (80 - free_gib) << 30,
            memory_free: free_gib << 30,
        }
    }

    fn image(uses: &[(u8, u64)]) -> CudaImage {
        CudaImage {
            driver: DriverInfo {
                library: "libcuda.so.1".into(),
                cuda_version: Some(13000),
                simulated: None,
            },
            driver_version: Some("580.159.04".into()),
            gpus: vec![gpu(1, "H100", 40), gpu(2, "H100", 40)],
            processes: uses
                .iter()
                .enumerate()
                .map(|(i, (g, gib))| ProcessRecord {
                    ns_pid: 10 + i as i32,
                    pid: 100 + i as i32,
                    comm: "train".into(),
                    initial_state: ProcessState::Running,
                    gpus: vec![Usage {
                        uuid: uuid(*g),
                        memory: Some(gib << 30),
                    }],
                })
                .collect(),
        }
    }

    fn inv(gpus: Vec<Gpu>) -> Inventory {
        Inventory {
            nvml_library: "x".into(),
            driver_version: "580".into(),
            cuda_version: Some(13000),
            gpus,
            processes: vec![],
        }
    }

    #[test]
    fn same_machine_needs_no_map() {
        let img = image(&[(1, 10), (2, 10)]);
        let here = inv(vec![gpu(1, "H100", 80), gpu(2, "H100", 80)]);
        let p = plan(&img, Some(&here), &GpuPlacement::Same).unwrap();
        assert!(p.maps.is_empty());
        assert_eq!(p.notes.len(), 2);
    }

    #[test]
    fn missing_gpus_are_named_with_the_fix() {
        let img = image(&[(1, 10)]);
        let here = inv(vec![gpu(7, "H100", 80)]);
        let e = plan(&img, Some(&here), &GpuPlacement::Same).unwrap_err();
        assert!(
            e.contains(&uuid(1).to_string()) && e.contains("CRIU_GPU_DEVICE_MAP"),
            "{e}"
        );
    }

    #[test]
    fn too_few_gpus() {
        let img = image(&[(1, 1), (2, 1)]);
        let e = plan(
            &img,
            Some(&inv(vec![gpu(1, "H100", 80)])),
            &GpuPlacement::Same,
        )
        .unwrap_err();
        assert!(e.contains("used 2 GPU(s), this machine has 1"), "{e}");
    }

    #[test]
    fn not_enough_free_memory() {
        let img = image(&[(1, 30), (1, 30)]);
        let here = inv(vec![gpu(1, "H100", 50), gpu(2, "H100", 80)]);
        let e = plan(&img, Some(&here), &GpuPlacement::Same).unwrap_err();
        assert!(
            e.contains("60.00 GiB") && e.contains("50.00 GiB free"),
            "{e}"
        );
    }

    #[test]
    fn explicit_and_automatic_maps() {
        let img = image(&[(1, 10), (2, 10)]);
        let here = inv(vec![
            gpu(8, "H100", 80),
            gpu(9, "A100", 80),
            gpu(7, "H100", 20),
        ]);
        let m: DeviceMap = format!("{}={},{}={}", uuid(1), uuid(8), uuid(2), uuid(9))
            .parse()
            .unwrap();
        let p = plan(&img, Some(&here), &GpuPlacement::Map(m)).unwrap();
        assert_eq!(p.maps[&10].pairs(), &[(uuid(1), uuid(8))]);
        assert_eq!(p.maps[&11].pairs(), &[(uuid(2), uuid(9))]);
        // auto prefers the same model, then free memory: 8 (H100, 80) and 7 (H100, 20).
        let p = plan(&img, Some(&here), &GpuPlacement::Auto).unwrap();
        assert_eq!(p.maps[&10].pairs(), &[(uuid(1), uuid(8))]);
        assert_eq!(p.maps[&11].pairs(), &[(uuid(2), uuid(7))]);
    }

    #[test]
    fn two_gpus_onto_one_is_refused() {
        let img = image(&[(1, 1), (2, 1)]);
        let here = inv(vec![gpu(1, "H100", 80), gpu(2, "H100", 80)]);
        let m: DeviceMap = format!("{}={}", uuid(1), uuid(2)).parse().unwrap();
        let e = plan(&img, Some(&here), &GpuPlacement::Map(m)).unwrap_err();
        assert!(e.contains("each needs a GPU of its own"), "{e}");
    }

    #[test]
    fn without_nvml_only_explicit_maps_apply() {
        let img = image(&[(1, 10)]);
        assert!(plan(&img, None, &GpuPlacement::Same)
            .unwrap()
            .maps
            .is_empty());
        assert!(plan(&img, None, &GpuPlacement::Auto).is_err());
        let m: DeviceMap = format!("{}={}", uuid(1), uuid(5)).parse().unwrap();
        let p = plan(&img, None, &GpuPlacement::Map(m)).unwrap();
        assert_eq!(p.maps[&10].pairs(), &[(uuid(1), uuid(5))]);
    }
}
