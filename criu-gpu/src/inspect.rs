//! `criu-gpu check` and `criu-gpu inspect`: what a checkpoint holds and whether this node can
//! restore it, from the plugin's own restore checks (the image crate's) run outside CRIU.

use std::collections::BTreeMap;
use std::path::Path;

use criu_gpu_host::settings::Settings;
use criu_gpu_image::inspect::Inspection;
use serde::Serialize;

use crate::archive::{Checkpoint, FileEntry, Format};
use crate::human::bytes;
use crate::out;

/// The verdict of the plugin's restore checks on this node.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub can_restore: bool,
    /// Why not, with the fix.
    pub reason: Option<String>,
}

/// Runs the restore checks (driver, GPUs, free memory, image integrity) against `c`, with the
/// plugin's `settings` on this node.
pub fn verdict(c: &Checkpoint, settings: &Settings) -> Verdict {
    match criu_gpu_host::restore_check::check(&c.images, c.complete(), settings) {
        Ok(_) => Verdict {
            can_restore: true,
            reason: None,
        },
        Err(e) => Verdict {
            can_restore: false,
            reason: Some(e.to_string()),
        },
    }
}

/// Which container a checkpoint came from, as far as its metadata tells.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ContainerInfo {
    pub name: Option<String>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub image: Option<String>,
    pub runtime: Option<String>,
    pub engine: Option<String>,
    pub checkpointed_at: Option<String>,
}

impl ContainerInfo {
    fn is_empty(&self) -> bool {
        self.name.is_none() && self.pod.is_none() && self.image.is_none()
    }
}

/// Reads config.dump and spec.dump (CRI-O, Podman, kubelet) and OCI annotations.
pub fn container_info(c: &Checkpoint) -> ContainerInfo {
    let read = |name: &str| -> serde_json::Value {
        c.meta
            .as_ref()
            .and_then(|d| std::fs::read(d.join(name)).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    };
    let config = read("config.dump");
    let spec = read("spec.dump");
    let first = |v: &serde_json::Value, keys: &[&str]| -> Option<String> {
        keys.iter()
            .find_map(|k| v[*k].as_str().filter(|s| !s.is_empty()).map(str::to_owned))
    };
    let spec_ann = &spec["annotations"];
    let ann = |k: &str| c.annotations.get(k).cloned();
    ContainerInfo {
        name: first(spec_ann, &["io.kubernetes.container.name"])
            .or_else(|| first(&config, &["name"]))
            .or_else(|| ann("org.criu.checkpoint.container.name"))
            .or_else(|| ann(criu_gpu_node::oci::CRIO_CHECKPOINT_NAME)),
        pod: first(spec_ann, &["io.kubernetes.pod.name"])
            .or_else(|| ann("org.criu.checkpoint.pod.name")),
        namespace: first(spec_ann, &["io.kubernetes.pod.namespace"])
            .or_else(|| ann("org.criu.checkpoint.pod.namespace")),
        image: first(
            &config,
            &["rootfsImageName", "rootfsImage", "rootfsImageRef"],
        )
        .or_else(|| ann("org.criu.checkpoint.rootfsImageName"))
        .or_else(|| ann("org.opencontainers.image.ref.name")),
        runtime: first(&config, &["ociRuntime", "OCIRuntime", "runtime"])
            .or_else(|| ann("org.criu.checkpoint.runtime.name"))
            .or_else(|| ann("io.containerd.checkpoint.runtime")),
        engine: first(spec_ann, &["io.container.manager"])
            .or_else(|| ann("org.criu.checkpoint.engine")),
        checkpointed_at: first(&config, &["checkpointedTime", "checkpointedAt"]),
    }
}

#[derive(Debug, Serialize)]
pub struct ImageSizes {
    pub files: usize,
    pub bytes: u64,
    /// Process memory pages and GPU buffer images: the bulk of a GPU checkpoint.
    pub memory_bytes: u64,
    pub largest: Vec<FileEntry>,
}

/// Everything `inspect` reports.
#[derive(Debug, Serialize)]
pub struct Report {
    pub path: String,
    pub format: Format,
    pub container: Option<ContainerInfo>,
    pub criu_version: Option<String>,
    pub images: ImageSizes,
    pub other_files: Vec<FileEntry>,
    pub annotations: BTreeMap<String, String>,
    pub gpu: Inspection,
    pub this_node: Verdict,
    /// A node's part of a job across machines (`criu-gpu dump --nnodes`).
    pub job_part: Option<crate::job::cluster::part::Part>,
}

pub fn report(path: &Path, c: &Checkpoint, settings: &Settings) -> Report {
    let (total, memory) = c.image_bytes();
    let mut largest = c.image_files.clone();
    largest.sort_by_key(|f| std::cmp::Reverse(f.size));
    largest.truncate(5);
    let info = container_info(c);
    Report {
        path: path.display().to_string(),
        format: c.format,
        container: (!info.is_empty()).then_some(info),
        criu_version: c.criu_version(),
        images: ImageSizes {
            files: c.image_files.len(),
            bytes: total,
            memory_bytes: memory,
            largest,
        },
        other_files: c.other_files.clone(),
        annotations: c.annotations.clone(),
        gpu: criu_gpu_image::inspect::inspect(&c.images),
        this_node: verdict(c, settings),
        job_part: crate::job::cluster::part::Part::read(&c.images)
            .ok()
            .flatten(),
    }
}

/// One line per process holding GPU state (the lines `criu-gpu-check` always printed).
const UPSTREAM: &str = criu_gpu_image::restorable::UPSTREAM_PLUGIN;

pub fn gpu_lines(gpu: &Inspection) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(cuda) = &gpu.cuda {
        for p in &cuda.processes {
            let gpus: Vec<String> = p
                .gpus
                .iter()
                .map(|u| match u.memory {
                    Some(m) => {
                        format!("{} ({:.2} GiB)", u.uuid, process_facts::units::gib(m))
                    }
                    None => u.uuid.clone(),
                })
                .collect();
            lines.push(format!(
                "CUDA process {} ({}), {}: {}",
                p.ns_pid,
                p.comm,
                p.state,
                if gpus.is_empty() {
                    "GPUs not recorded".into()
                } else {
                    gpus.join(", ")
                }
            ));
        }
    }
    if let Some(procs) = &gpu.cuda_upstream {
        if procs.is_empty() {
            lines.push(format!(
                "CUDA state dumped by CRIU's {UPSTREAM}, no process of it found"
            ));
        }
        for p in procs {
            lines.push(format!(
                "CUDA process {} ({}), dumped by CRIU's {UPSTREAM}: device memory inside its \
                 pages, GPUs not recorded",
                p.pid, p.comm
            ));
        }
    }
    for r in &gpu.rocm {
        lines.push(format!(
            "ROCm process {}: {} GPU(s), {} buffer(s)",
            r.pid, r.gpus, r.buffers
        ));
    }
    lines.extend(gpu.problems.iter().cloned());
    lines
}

/// One line of the report: a 13-column label, then the value.
fn row(k: &str, v: String) {
    out::line(format!("{k:<13}{v}"));
}

/// `criu-gpu inspect`'s text: a labelled row for each thing the report tells.
pub fn print_report(r: &Report) {
    row(
        "checkpoint",
        format!("{} ({})", r.path, r.format.describe()),
    );
    if let Some(c) = &r.container {
        print_container(c);
    }
    if let Some(p) = &r.job_part {
        row("job part", p.name());
        row("other nodes", p.others().join(", "));
    }
    print_images(r);
    match &r.gpu.cuda {
        Some(cuda) => print_cuda(cuda, &r.gpu.timings),
        None => match &r.gpu.cuda_upstream {
            Some(procs) => print_cuda_upstream(procs),
            None if r.gpu.rocm.is_empty() => row(
                "GPU state",
                "none: no process of this checkpoint held GPU state".into(),
            ),
            None => {}
        },
    }
    for p in &r.gpu.rocm {
        row(
            "ROCm process",
            format!(
                "{}: {} GPU(s), {} buffer(s), {}",
                p.pid,
                p.gpus,
                p.buffers,
                bytes(p.buffer_bytes)
            ),
        );
    }
    for p in &r.gpu.problems {
        row("PROBLEM", p.clone());
    }
    row(
        "this node",
        match &r.this_node.reason {
            None => "OK: can restore it".into(),
            Some(why) => format!("REFUSED: {why}"),
        },
    );
}

/// "namespace/pod/name (image …, runtime …, engine …, at …)", of what is known.
fn print_container(c: &ContainerInfo) {
    let mut who = [&c.namespace, &c.pod, &c.name]
        .iter()
        .filter_map(|s| s.as_deref())
        .collect::<Vec<_>>()
        .join("/");
    if who.is_empty() {
        who = "?".into();
    }
    let mut extra = Vec::new();
    for (k, v) in [
        ("image", &c.image),
        ("runtime", &c.runtime),
        ("engine", &c.engine),
        ("at", &c.checkpointed_at),
    ] {
        if let Some(v) = v {
            extra.push(format!("{k} {v}"));
        }
    }
    row("container", format!("{who} ({})", extra.join(", ")));
}

/// Which CRIU made it, and the sizes of its images (the three largest, the rootfs diff).
fn print_images(r: &Report) {
    row(
        "made by",
        match &r.criu_version {
            Some(v) => format!("CRIU {v}"),
            None => "CRIU (version not recorded: the checkpoint carries no dump.log)".into(),
        },
    );
    row(
        "images",
        format!(
            "{} in {} files, of which memory {}",
            bytes(r.images.bytes),
            r.images.files,
            bytes(r.images.memory_bytes)
        ),
    );
    for f in r.images.largest.iter().take(3) {
        row("", format!("{:>12}  {}", bytes(f.size), f.name));
    }
    if let Some(diff) = r
        .other_files
        .iter()
        .find(|f| f.name.ends_with("rootfs-diff.tar"))
    {
        row("rootfs diff", bytes(diff.size));
    }
}

/// What the plugin recorded: driver, GPUs, processes, phase times and memory per GPU.
fn print_cuda(
    cuda: &criu_gpu_image::inspect::CudaInspection,
    timings: &[criu_gpu_image::timings::Timings],
) {
    let version = cuda
        .driver_version
        .as_deref()
        .unwrap_or("version not recorded");
    row("CUDA driver", format!("{version}; {}", cuda.driver));
    for g in &cuda.gpus {
        row(
            "GPU there",
            format!("{} {} ({})", g.uuid, g.name, bytes(g.memory_total)),
        );
    }
    for p in &cuda.processes {
        let on: Vec<String> = p
            .gpus
            .iter()
            .map(|g| format!("{} {}", g.uuid, g.memory.map_or("?".into(), bytes)))
            .collect();
        row(
            "process",
            format!(
                "{} ({}), {}: {}",
                p.ns_pid,
                p.comm,
                p.state,
                if on.is_empty() {
                    "GPUs not recorded".into()
                } else {
                    on.join(", ")
                }
            ),
        );
    }
    for t in timings {
        row("GPU phases", phases(t));
    }
    for g in &cuda.memory_per_gpu {
        row(
            "GPU memory",
            format!("{} {}", g.uuid, g.memory.map_or("?".into(), bytes)),
        );
    }
}

/// A checkpoint of CRIU's own CUDA plugin: processes only, the device memory in their pages.
fn print_cuda_upstream(procs: &[criu_gpu_image::criu_image::CudaMapper]) {
    row(
        "CUDA",
        format!(
            "dumped by CRIU's {UPSTREAM} ({} process(es)); it records no GPUs or \
             sizes: the device memory is inside the processes' pages",
            procs.len()
        ),
    );
    for p in procs {
        row("process", format!("{} ({})", p.pid, p.comm));
    }
}

/// "dump: lock 0.02 s (2 processes), checkpoint 1.10 s (2 processes, 4.00 GiB)".
fn phases(t: &criu_gpu_image::timings::Timings) -> String {
    let each: Vec<String> = t
        .phases
        .iter()
        .map(|p| {
            let mut what = Vec::new();
            if p.processes > 0 {
                what.push(format!("{} processes", p.processes));
            }
            if p.bytes > 0 {
                what.push(bytes(p.bytes));
            }
            let what = if what.is_empty() {
                String::new()
            } else {
                format!(" ({})", what.join(", "))
            };
            format!("{} {:.2} s{what}", p.name, p.seconds)
        })
        .collect();
    format!("{}: {}", t.command.name(), each.join(", "))
}
