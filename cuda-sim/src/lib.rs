//! A simulated NVIDIA GPU and driver, for machines without one.
//!
//! Three parts, selected explicitly and never picked up by accident:
//! * `cuda-sim-gpud`, the "GPU": a daemon on a unix socket ([`proto::SOCKET_ENV`]) that owns
//!   device memory and runs work for the processes connected to it ([`gpud`]);
//! * the driver library (crate `cuda-sim-libcuda`, installed as `libcuda.so.1` and
//!   `libnvidia-ml.so.1` in a directory of its own): the in-process driver ([`target`]), the
//!   checkpoint API as a controller calls it ([`controller`]) and NVML ([`nvml`]);
//! * `cuda-sim-app`, a GPU-like test application that keeps checkable data on the device.

pub mod collective;
pub mod config;
pub mod control;
pub mod controller;
pub mod errors;
pub mod fault;
pub mod gpud;
pub mod nvml;
pub mod ofd;
pub mod op;
pub mod proto;
pub mod shm;
pub mod target;
pub mod trace;
pub mod visible;

/// What `cuSimIdentify` reports, so tools can say they are talking to the simulation.
pub fn identity() -> String {
    format!(
        "cuda-sim {} (simulated GPU at {})",
        env!("CARGO_PKG_VERSION"),
        proto::socket_path()
    )
}

/// The driver version both cuDriverGetVersion and NVML report.
pub const CUDA_VERSION: i32 = 13000;
pub const DRIVER_VERSION: &str = "580.00-sim";
