//! Where a checkpoint's GPU state goes on restore: does this machine have the GPUs (or the ones
//! the operator maps them to) and the free memory, and the complete map the driver needs (it
//! takes a map only if it names every GPU it saw at checkpoint time: docs/driver-facts.md, F8).
//! Pure functions over the record and NVML's inventory.

use std::collections::BTreeMap;

use cuda_checkpoint_ctl::driver::{DeviceMap, GpuUuid};
use cuda_checkpoint_ctl::inventory::{Gpu, GpuUsage, Inventory};
use cuda_checkpoint_ctl::placement::{place, Request};

use crate::cuda::{CudaImage, ProcessRecord};

/// The map to pass the driver (empty: the same GPUs) and what the log should say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub map: DeviceMap,
    /// One line per GPU, for the log.
    pub notes: Vec<String>,
    /// The device node number of each GPU here, where NVML told (for the container check).
    pub minors: BTreeMap<GpuUuid, u32>,
}

impl Plan {
    /// The device nodes a restored process needs: those of the GPUs its state goes to.
    pub fn nodes_for(&self, p: &ProcessRecord) -> Vec<(GpuUuid, u32)> {
        p.gpus
            .iter()
            .map(|u| self.map.target(u.uuid))
            .filter_map(|g| Some((g, *self.minors.get(&g)?)))
            .collect()
    }
}

use process_facts::units::in_gib as gib;

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
            .flat_map(|p| self.used_by(p))
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// What each restored process held where at checkpoint time.
    fn usage(&self) -> Vec<GpuUsage> {
        self.processes
            .iter()
            .flat_map(|p| {
                p.gpus.iter().map(|u| GpuUsage {
                    pid: p.ns_pid,
                    gpu: u.uuid,
                    memory: u.memory,
                })
            })
            .collect()
    }

    fn name_of(&self, uuid: GpuUuid) -> &str {
        self.gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .map_or("?", |g| g.name.as_str())
    }
}

/// Decides where the checkpoint's GPU state goes, or says why it cannot be restored here.
/// `Same` keeps every GPU it used and only checks that they are here with room; a map or `auto`
/// goes through the placement the CLI uses too (`cuda_checkpoint_ctl::placement`).
pub fn plan(
    image: &CudaImage,
    here: Option<&Inventory>,
    request: &Request,
) -> Result<Plan, String> {
    if *request == Request::Same {
        return same(image, here);
    }
    let usage = image.usage();
    let placed =
        match here {
            Some(here) => place(&image.gpus, &usage, &here.gpus, request),
            None if matches!(request, Request::Auto) => return Err(
                "CRIU_GPU_DEVICE_MAP=auto needs NVML (libnvidia-ml.so.1) to see this machine's \
                 GPUs; give an explicit OLD=NEW map instead"
                    .into(),
            ),
            // Without NVML this machine's GPUs are unknown: the operator's pairs go to the driver
            // as given (it refuses a map that does not name every GPU it saw).
            None => {
                return Ok(Plan {
                    map: match request {
                        Request::Pairs(m) => m.clone(),
                        Request::Auto | Request::Same => DeviceMap::default(),
                    },
                    notes: vec!["NVML is not available: the device map is passed as given".into()],
                    minors: BTreeMap::new(),
                })
            }
        }
        .map_err(|e| e.to_string())?;
    Ok(Plan {
        map: placed.driver_map(),
        notes: placed.notes,
        minors: here.map(minors).unwrap_or_default(),
    })
}

fn minors(here: &Inventory) -> BTreeMap<GpuUuid, u32> {
    here.gpus
        .iter()
        .filter_map(|g| Some((g.uuid, g.minor?)))
        .collect()
}

/// The checkpoint's GPUs, where they were: each used one must be here with room.
fn same(image: &CudaImage, here: Option<&Inventory>) -> Result<Plan, String> {
    let Some(here) = here else {
        // Without NVML nothing can be checked; the driver will refuse what it cannot do.
        return Ok(Plan::default());
    };
    let used = image.used();
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
    let mut need: BTreeMap<GpuUuid, u64> = BTreeMap::new();
    for u in image.usage() {
        *need.entry(u.gpu).or_default() += u.memory.unwrap_or(0);
    }
    let mut notes = Vec::new();
    for &gpu in &used {
        let Some(g) = here.gpu(gpu) else {
            return Err(format!(
                "the checkpoint's GPU {gpu} ({}) is not on this machine (GPUs here: {}); \
                 restore onto other GPUs with CRIU_GPU_DEVICE_MAP=OLD=NEW[,...] or \
                 CRIU_GPU_DEVICE_MAP=auto",
                image.name_of(gpu),
                describe(&here.gpus)
            ));
        };
        let bytes = need.get(&gpu).copied().unwrap_or(0);
        if bytes > g.memory_free {
            return Err(format!(
                "GPU {gpu} ({}) has {} free but the restored processes need {} on it: stop what \
                 uses it (see nvidia-smi), or restore onto another GPU with CRIU_GPU_DEVICE_MAP",
                g.name,
                gib(g.memory_free),
                gib(bytes)
            ));
        }
        notes.push(format!(
            "GPU {gpu}: {} needed, {} free",
            gib(bytes),
            gib(g.memory_free)
        ));
    }
    Ok(Plan {
        map: DeviceMap::default(),
        notes,
        minors: minors(here),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::Usage;
    use cuda_checkpoint_ctl::driver::{DriverInfo, ProcessState};

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
            minor: None,
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
                    nccl: false,
                    staging: Vec::new(),
                })
                .collect(),
            digests: vec![],
            tree: vec![],
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
        let p = plan(&img, Some(&here), &Request::Same).unwrap();
        assert!(p.map.is_empty());
        assert_eq!(p.notes.len(), 2);
    }

    #[test]
    fn missing_gpus_are_named_with_the_fix() {
        let img = image(&[(1, 10)]);
        let here = inv(vec![gpu(7, "H100", 80)]);
        let e = plan(&img, Some(&here), &Request::Same).unwrap_err();
        assert!(
            e.contains(&uuid(1).to_string()) && e.contains("CRIU_GPU_DEVICE_MAP"),
            "{e}"
        );
    }

    #[test]
    fn too_few_gpus() {
        let img = image(&[(1, 1), (2, 1)]);
        let e = plan(&img, Some(&inv(vec![gpu(1, "H100", 80)])), &Request::Same).unwrap_err();
        assert!(e.contains("used 2 GPU(s), this machine has 1"), "{e}");
    }

    #[test]
    fn not_enough_free_memory() {
        let img = image(&[(1, 30), (1, 30)]);
        let here = inv(vec![gpu(1, "H100", 50), gpu(2, "H100", 80)]);
        let e = plan(&img, Some(&here), &Request::Same).unwrap_err();
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
        let p = plan(&img, Some(&here), &Request::Pairs(m)).unwrap();
        assert_eq!(p.map.pairs(), &[(uuid(1), uuid(8)), (uuid(2), uuid(9))]);
        // auto prefers the same model, then free memory: 8 (H100, 80) and 7 (H100, 20).
        let p = plan(&img, Some(&here), &Request::Auto).unwrap();
        assert_eq!(p.map.pairs(), &[(uuid(1), uuid(8)), (uuid(2), uuid(7))]);
    }

    #[test]
    fn two_gpus_onto_one_is_refused() {
        let two = format!("{}={},{}={}", uuid(1), uuid(2), uuid(2), uuid(2));
        let e = two.parse::<Request>().unwrap_err().to_string();
        assert!(e.contains("twice on the new side"), "{e}");
    }

    #[test]
    fn without_nvml_only_explicit_maps_apply() {
        let img = image(&[(1, 10)]);
        assert!(plan(&img, None, &Request::Same).unwrap().map.is_empty());
        assert!(plan(&img, None, &Request::Auto).is_err());
        let m: DeviceMap = format!("{}={}", uuid(1), uuid(5)).parse().unwrap();
        let p = plan(&img, None, &Request::Pairs(m)).unwrap();
        assert_eq!(p.map.pairs(), &[(uuid(1), uuid(5))], "passed as given");
    }

    #[test]
    fn a_move_becomes_a_complete_permutation() {
        // The process used GPU 1 only; the driver saw GPUs 1 and 2: moving 1 onto 2 is a swap.
        let img = image(&[(1, 10)]);
        let here = inv(vec![gpu(1, "H100", 80), gpu(2, "H100", 80)]);
        let m: DeviceMap = format!("{}={}", uuid(1), uuid(2)).parse().unwrap();
        let p = plan(&img, Some(&here), &Request::Pairs(m)).unwrap();
        assert_eq!(p.map.pairs(), &[(uuid(1), uuid(2)), (uuid(2), uuid(1))]);
    }

    #[test]
    fn a_machine_with_fewer_gpus_cannot_take_a_moved_restore() {
        let img = image(&[(1, 10)]);
        let here = inv(vec![gpu(7, "H100", 80)]);
        let m: DeviceMap = format!("{}={}", uuid(1), uuid(7)).parse().unwrap();
        let e = plan(&img, Some(&here), &Request::Pairs(m)).unwrap_err();
        assert!(
            e.contains("the driver needs a GPU here for each") && e.contains("at least 2 GPUs"),
            "{e}"
        );
    }
}
