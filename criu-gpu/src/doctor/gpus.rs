//! The GPUs: driver and devices, and room for what a checkpoint of their memory writes (host
//! memory, the images' disks).

use std::path::{Path, PathBuf};

use super::{ok, problem, Finding, Options, Status};
use crate::human::bytes;

/// Driver and GPUs; returns the GPU memory in use (what a checkpoint of everything writes).
pub(super) fn gpus(opts: &Options) -> (Vec<Finding>, u64) {
    use cuda_checkpoint_ctl::driver::Driver;
    use cuda_checkpoint_ctl::inventory::Inventory;
    let mut f = Vec::new();
    let kfd = Path::new("/dev/kfd").exists();
    let mut used = 0;
    match Driver::load(opts.driver.as_deref()) {
        Ok(d) => {
            let info = d.info().clone();
            f.push(match &info.simulated {
                Some(_) => problem("driver", Status::Warn, format!("{info}"), "this is the SIMULATED driver: fine for tests, not for real GPUs; unset CUDA_CKPT_LIBCUDA / --driver"),
                None => ok("driver", format!("{info}")),
            });
            match Inventory::query(opts.nvml.as_deref()) {
                Ok(inv) if inv.gpus.is_empty() => f.push(problem("GPUs", Status::Fail, format!("NVML (driver {}) sees no GPU", inv.driver_version), "check `nvidia-smi`; in a container, pass the GPUs in (NVIDIA container toolkit)")),
                Ok(inv) => {
                    for g in &inv.gpus {
                        used += g.memory_used;
                        f.push(ok("GPU", format!("{} {} {}: {} used, {} free", g.index, g.uuid, g.name, bytes(g.memory_used), bytes(g.memory_free))));
                    }
                    f.push(host_memory(&inv));
                }
                Err(e) => f.push(problem("GPUs", Status::Fail, e.to_string(), "NVML ships with the NVIDIA driver (libnvidia-ml.so.1): install the driver, or name the library with --nvml PATH / CUDA_CKPT_LIBNVML")),
            }
        }
        Err(e) if kfd => f.push(problem("driver", Status::Warn, format!("no CUDA driver ({e})"), "nothing to do on an AMD-only node")),
        Err(e) => f.push(problem("driver", Status::Fail, e.to_string(), "install the NVIDIA driver (r570 or later) or the amdgpu driver; or name the library with --driver PATH")),
    }
    if kfd {
        f.push(
            match amd_kfd::topology::Topology::parse(&amd_kfd::topology::Topology::default_root()) {
                Ok(t) => ok(
                    "AMD",
                    format!(
                        "/dev/kfd, {} GPU node(s) in the KFD topology",
                        t.gpus().count()
                    ),
                ),
                Err(e) => problem(
                    "AMD",
                    Status::Fail,
                    e.to_string(),
                    "load the amdgpu driver (modprobe amdgpu)",
                ),
            },
        );
    }
    (f, used)
}

/// Free space where images go, against the GPU memory in use (which a checkpoint writes out).
pub(super) fn space(opts: &Options, gpu_used: u64) -> Vec<Finding> {
    let dirs: Vec<PathBuf> = if opts.image_dirs.is_empty() {
        [
            "/var/lib/kubelet/checkpoints",
            "/var/lib/containers",
            "/var/lib/containerd",
        ]
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .chain([std::env::temp_dir()])
        .collect()
    } else {
        opts.image_dirs.clone()
    };
    dirs.into_iter()
        .map(|d| match rustix::fs::statvfs(&d) {
            Err(e) => problem("space", Status::Fail, format!("{}: {e}", d.display()), "create it, or name another directory with --images DIR"),
            Ok(s) => {
                let free = s.f_bavail * s.f_frsize;
                let text = format!("{}: {} free; GPU memory in use {}", d.display(), bytes(free), bytes(gpu_used));
                if free < gpu_used {
                    problem("space", Status::Fail, text, "free space there: a checkpoint writes at least the GPU memory in use, plus the processes' own memory")
                } else if free < gpu_used.saturating_mul(2) {
                    problem("space", Status::Warn, text, "a checkpoint also writes the processes' host memory; keep twice the GPU memory free")
                } else {
                    ok("space", text)
                }
            }
        })
        .collect()
}

/// Whether host memory can take the device memory of the GPU processes running now, which their
/// checkpoint copies there all at once (the rule the plugin and `criu-gpu dump` apply).
fn host_memory(inv: &cuda_checkpoint_ctl::inventory::Inventory) -> Finding {
    use process_facts::process::{self, memory::Room};
    use process_facts::refusal::{self, DeviceMemory};
    let mut processes: Vec<DeviceMemory> = Vec::new();
    for u in &inv.processes {
        let bytes = u.memory.unwrap_or(0);
        match processes.iter_mut().find(|p| p.pid == u.pid) {
            Some(p) => p.bytes += bytes,
            None => processes.push(DeviceMemory {
                pid: u.pid,
                comm: process::comm(u.pid).unwrap_or_default(),
                bytes,
            }),
        }
    }
    let pids: Vec<i32> = processes.iter().map(|p| p.pid).collect();
    let room = Room::of(&pids);
    if let Some(r) = refusal::host_memory(&processes, &room) {
        return problem("memory", Status::Fail, r.what(), r.fix(""));
    }
    let held: u64 = processes.iter().map(|p| p.bytes).sum();
    let available = room
        .available
        .map_or("MemAvailable unreadable".into(), |a| {
            format!("{} available (MemAvailable)", bytes(a))
        });
    ok(
        "memory",
        format!(
            "{available}: the {} GPU process(es) hold {} of device memory, which their \
             checkpoint copies into host memory; it fits, also below their memory cgroups' limits",
            processes.len(),
            bytes(held)
        ),
    )
}
