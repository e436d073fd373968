//! `cuda-sim-gpud`: the simulated GPU(s). Start it before any simulated CUDA process, like
//! loading a driver; processes find it through $CUDA_SIM_SOCKET (default /run/cuda-sim/gpud.sock).

use anyhow::{bail, Context};
use clap::Parser;
use cuda_sim::gpud::{self, derive_uuid, parse_size, GpuSpec};

#[derive(Parser)]
#[command(about = "Simulated NVIDIA GPUs for testing GPU checkpointing without a GPU")]
struct Args {
    /// Socket to listen on.
    #[arg(long, env = "CUDA_SIM_SOCKET", default_value = cuda_sim::proto::DEFAULT_SOCKET)]
    socket: String,
    /// Number of identical GPUs.
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// Memory of each GPU (e.g. 4GiB).
    #[arg(long, default_value = "4GiB")]
    memory: String,
    /// Model name reported by the driver and NVML.
    #[arg(long, default_value = "NVIDIA H100 80GB HBM3 (simulated)")]
    name: String,
    /// Names this "machine": GPU UUIDs derive from it, so two daemons with different seeds
    /// stand for two machines. Defaults to /etc/machine-id.
    #[arg(long)]
    uuid_seed: Option<String>,
    /// Fully described GPUs, NAME:MEMORY[:UUID], instead of --gpus/--memory/--name.
    #[arg(long = "gpu")]
    gpu: Vec<String>,
    /// The GPUs have device nodes, /dev/nvidiaN for GPU N, as NVML reports them: a restored
    /// process must find its GPUs' nodes in its root file system, as on a real GPU (a container
    /// given them, e.g. by a CDI spec with made-up char 195:N nodes). Off: NVML reports none and
    /// the plugin checks none (processes of this machine have no /dev/nvidia*).
    #[arg(long)]
    device_nodes: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let seed = args.uuid_seed.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/etc/machine-id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "cuda-sim".into())
    });
    let mut gpus = Vec::new();
    for (i, spec) in args.gpu.iter().enumerate() {
        let mut parts = spec.splitn(3, ':');
        let name = parts.next().unwrap_or_default().to_owned();
        let memory = parse_size(parts.next().unwrap_or_default())
            .with_context(|| format!("bad memory size in --gpu {spec:?}"))?;
        let uuid = match parts.next() {
            Some(u) => parse_uuid(u).with_context(|| format!("bad UUID in --gpu {spec:?}"))?,
            None => derive_uuid(&seed, i as u32),
        };
        gpus.push(GpuSpec { name, memory, uuid });
    }
    if gpus.is_empty() {
        let memory = parse_size(&args.memory).context("bad --memory")?;
        for i in 0..args.gpus {
            gpus.push(GpuSpec {
                name: args.name.clone(),
                memory,
                uuid: derive_uuid(&seed, i),
            });
        }
    }
    if gpus.is_empty() {
        bail!("no GPUs configured");
    }
    gpud::serve(gpud::Config {
        socket: args.socket.into(),
        gpus,
        driver_version: cuda_sim::DRIVER_VERSION.into(),
        device_nodes: args.device_nodes,
    })?;
    Ok(())
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s
        .trim()
        .trim_start_matches("GPU-")
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}
