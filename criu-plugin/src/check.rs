//! The pre-restore check: runs the plugin's own restore-time checks (image digests, driver,
//! GPUs by UUID or topology, free memory) against a checkpoint, outside CRIU, so an operator or
//! an orchestrator learns before restoring whether this node can take it, and why not.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::backends::{self, cuda};
use crate::core::{
    record, FinalState, HookError, Host, Inventory, Plugin, Released, Stage, ThreadControl,
    ThreadError,
};
use crate::guardian::{self, Guardian, GuardianError, Watched};

struct NoThreads;

impl ThreadControl for NoThreads {
    fn release(&self, pid: i32, tid: i32) -> Result<Released, ThreadError> {
        Err(ThreadError::Release {
            pid,
            tid,
            reason: "no thread to run outside CRIU".into(),
        })
    }
    fn recapture(&self, _r: &Released) -> Result<(), ThreadError> {
        Ok(())
    }
    fn take_signal(&self, _r: &Released) -> Option<i32> {
        None
    }
    fn raise(&self, _pid: i32, _sig: i32) {}
    fn seized_stop_signal(&self, _pid: i32) -> Option<i32> {
        None
    }
}

/// A host with the checkpoint's directory, and guardians on threads of this process.
struct CheckHost {
    dir: PathBuf,
    complete: bool,
    guardians: Mutex<Vec<Watched>>,
}

impl Host for CheckHost {
    fn final_state(&self) -> Option<FinalState> {
        None
    }
    fn require_on_restore(&self, _name: &str) -> bool {
        false
    }
    fn use_interrupt_only_seizing(&self) -> bool {
        false
    }
    fn image_dir(&self) -> Option<PathBuf> {
        Some(self.dir.clone())
    }
    fn dump_root(&self) -> Option<i32> {
        None
    }
    fn seize_time_left(&self) -> Option<Duration> {
        None
    }
    fn threads(&self) -> &dyn ThreadControl {
        &NoThreads
    }
    fn all_images_present(&self) -> bool {
        self.complete
    }
    fn spawn_guardian(&self, stage: Stage) -> Result<Guardian, GuardianError> {
        let machine = std::sync::Arc::new(guardian::machine::Real::new(None));
        let (g, watched) = guardian::in_thread(stage, machine)?;
        self.guardians
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(watched);
        Ok(g)
    }
}

/// The inventory is not read here: each backend decides from its own files.
struct NoInventory;

impl Inventory for NoInventory {
    fn claim(&self, _name: &str) -> bool {
        false
    }
    fn has_list(&self) -> bool {
        false
    }
}

/// Runs the restore checks of every backend against the image directory `dir`; `complete`: it
/// holds every image file (not the few taken out of an archive), so their digests are checked.
pub fn check(dir: &Path, complete: bool) -> Result<(), HookError> {
    let host = CheckHost {
        dir: dir.to_path_buf(),
        complete,
        guardians: Mutex::new(Vec::new()),
    };
    let mut plugin = Plugin::new(Stage::Restore, Box::new(host), backends::all());
    plugin.init(&NoInventory)?;
    plugin.exit(true);
    Ok(())
}

/// What a checkpoint holds for the GPUs, as data (for `criu-gpu inspect`). Built from the
/// plugin's own records, read the way the restore reads them; a record that cannot be read is
/// reported in `problems`, not skipped.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Inspection {
    pub cuda: Option<CudaInspection>,
    pub rocm: Vec<RocmProcess>,
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
        Ok(None) => {}
        Err(e) => out.problems.push(e.to_string()),
    }
    for p in amd_images(dir) {
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
    out
}

fn amd_images(dir: &Path) -> Vec<PathBuf> {
    let mut amd: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    amd.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("amdgpu-kfd-") && n.ends_with(".img"))
    });
    amd.sort();
    amd
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
