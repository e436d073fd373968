//! What a checkpoint holds for the GPUs, as data (for `criu-gpu inspect`), read the way a
//! restore reads it; a record that cannot be read is reported in `problems`, not skipped.

use std::path::Path;

use crate::cuda;
use crate::record;

/// What a checkpoint holds for the GPUs, as data (for `criu-gpu inspect`). Built from the
/// plugin's own records, read the way the restore reads them; a record that cannot be read is
/// reported in `problems`, not skipped.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Inspection {
    pub cuda: Option<CudaInspection>,
    /// An image of CRIU's C cuda_plugin (no record of ours): the processes that mapped the CUDA
    /// driver, whose device memory that plugin left inside their pages.
    pub cuda_upstream: Option<Vec<crate::criu_image::CudaMapper>>,
    pub rocm: Vec<RocmProcess>,
    /// The plugin's phase timings of the dump and of the last restore from these images.
    pub timings: Vec<crate::timings::Timings>,
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CudaInspection {
    /// The driver library and CUDA version of the dumping machine.
    pub driver: cuda_checkpoint_ctl::driver::DriverInfo,
    /// NVML's driver version there (e.g. "580.95.05"), when known.
    pub driver_version: Option<String>,
    /// The dumping machine's GPUs.
    pub gpus: Vec<GpuSeen>,
    pub processes: Vec<CudaProcess>,
    /// Device memory per GPU, summed over the processes (what a restore needs free there).
    pub memory_per_gpu: Vec<GpuMemory>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuSeen {
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CudaProcess {
    pub ns_pid: i32,
    pub pid: i32,
    pub comm: String,
    pub state: String,
    pub gpus: Vec<GpuMemory>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuMemory {
    pub uuid: String,
    /// None where NVML could not tell at dump time.
    pub memory: Option<u64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RocmProcess {
    pub image: String,
    pub pid: u32,
    pub gpus: usize,
    pub buffers: usize,
    pub buffer_bytes: u64,
}

/// Reads the GPU records of the image directory `dir`.
pub fn inspect(dir: &Path) -> Inspection {
    let mut out = Inspection::default();
    match record::read::<cuda::CudaImage>(dir, cuda::RECORD, cuda::FORMAT, cuda::VERSION) {
        Ok(Some(img)) => out.cuda = Some(cuda_inspection(&img)),
        Ok(None) => out.cuda_upstream = upstream(dir, &mut out.problems),
        Err(e) => out.problems.push(e.to_string()),
    }
    for p in crate::amd::images(dir) {
        match amd_kfd::image::ImageReader::open(&p) {
            Ok(r) => out.rocm.push(RocmProcess {
                image: p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                pid: r.meta.pid,
                gpus: r.meta.devices.len(),
                buffers: r.meta.bos.len(),
                buffer_bytes: r.meta.bos.iter().map(|b| b.size).sum(),
            }),
            Err(e) => out.problems.push(e.to_string()),
        }
    }
    use crate::timings::{read, Command};
    for command in [Command::Dump, Command::Restore] {
        match read(dir, command) {
            Ok(t) => out.timings.extend(t),
            Err(e) => out.problems.push(e.to_string()),
        }
    }
    out
}

/// The CUDA processes of an image whose inventory names CRIU's C cuda_plugin.
fn upstream(dir: &Path, problems: &mut Vec<String>) -> Option<Vec<crate::criu_image::CudaMapper>> {
    use crate::criu_image;
    let listed = criu_image::inventory_plugins(dir).ok().flatten()?;
    if !listed
        .iter()
        .any(|p| p == crate::restorable::UPSTREAM_PLUGIN)
    {
        return None;
    }
    match criu_image::cuda_mappers(dir) {
        Ok(p) => Some(p),
        Err(e) => {
            problems.push(e.to_string());
            Some(Vec::new())
        }
    }
}

fn cuda_inspection(img: &cuda::CudaImage) -> CudaInspection {
    let mut per_gpu: Vec<GpuMemory> = Vec::new();
    let processes = img
        .processes
        .iter()
        .map(|p| {
            let gpus: Vec<GpuMemory> = p
                .gpus
                .iter()
                .map(|u| GpuMemory {
                    uuid: u.uuid.to_string(),
                    memory: u.memory,
                })
                .collect();
            for g in &gpus {
                match per_gpu.iter_mut().find(|t| t.uuid == g.uuid) {
                    Some(t) => t.memory = t.memory.zip(g.memory).map(|(a, b)| a + b),
                    None => per_gpu.push(g.clone()),
                }
            }
            CudaProcess {
                ns_pid: p.ns_pid,
                pid: p.pid,
                comm: p.comm.clone(),
                state: p.initial_state.as_str().to_owned(),
                gpus,
            }
        })
        .collect();
    CudaInspection {
        driver: img.driver.clone(),
        driver_version: img.driver_version.clone(),
        gpus: img
            .gpus
            .iter()
            .map(|g| GpuSeen {
                uuid: g.uuid.to_string(),
                name: g.name.clone(),
                memory_total: g.memory_total,
            })
            .collect(),
        processes,
        memory_per_gpu: per_gpu,
    }
}
