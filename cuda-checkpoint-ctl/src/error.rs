//! The crate's error type: each variant names the cause, the message says the fix.

use crate::driver::{CudaError, LoadError, ParseError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Driver(#[from] LoadError),
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error("process {0} does not exist")]
    NoSuchProcess(i32),
    #[error("process {pid} holds no CUDA state ({reason})")]
    NotCuda { pid: i32, reason: String },
    #[error("cgroup {path}: {reason}")]
    Cgroup { path: String, reason: String },
    #[error(transparent)]
    DeviceMap(#[from] ParseError),
    #[error("NVML ({library}): {reason}")]
    Nvml { library: String, reason: String },
    #[error("process {pid} is {state}, {why}")]
    WrongState {
        pid: i32,
        state: crate::driver::ProcessState,
        why: &'static str,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
