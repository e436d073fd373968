//! Typed access to the CUDA driver's process checkpoint API.
//!
//! The driver keeps a small state machine per CUDA process:
//!
//! ```text
//! running --lock--> locked --checkpoint--> checkpointed --restore--> locked --unlock--> running
//! ```
//!
//! Every call names the target by pid; the driver reaches the target through a helper thread
//! it started inside that process (the "restore thread"), which must be able to run for
//! `checkpoint` and `restore` to finish.

mod cuda_h;
mod ffi;
mod uuid;

use std::fmt;
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use self::uuid::{DeviceMap, GpuUuid, ParseError};

/// The environment variable that names the driver library to load (a path or a soname).
pub const LIBCUDA_ENV: &str = "CUDA_CKPT_LIBCUDA";
/// The default: NVIDIA's driver, found by the dynamic loader.
pub const DEFAULT_LIBCUDA: &str = "libcuda.so.1";
/// cuDriverGetVersion from which restore accepts GPU pairs (driver r580, CUDA 13.0).
pub const DEVICE_MAP_MIN_VERSION: i32 = 13000;

/// A checkpoint state of a CUDA process (`CUprocessState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessState {
    Running,
    Locked,
    Checkpointed,
    Failed,
    /// CUDA 13.4 drivers report transient states while an action is under way.
    Checkpointing,
    Restoring,
    #[serde(untagged)]
    Unknown(u32),
}

impl ProcessState {
    pub fn from_raw(raw: u32) -> ProcessState {
        match raw {
            0 => ProcessState::Running,
            1 => ProcessState::Locked,
            2 => ProcessState::Checkpointed,
            3 => ProcessState::Failed,
            4 => ProcessState::Checkpointing,
            5 => ProcessState::Restoring,
            other => ProcessState::Unknown(other),
        }
    }

    /// The word NVIDIA's `cuda-checkpoint --get-state` prints.
    pub fn as_str(&self) -> &'static str {
        match self {
            ProcessState::Running => "running",
            ProcessState::Locked => "locked",
            ProcessState::Checkpointed => "checkpointed",
            ProcessState::Failed => "failed",
            ProcessState::Checkpointing => "checkpointing",
            ProcessState::Restoring => "restoring",
            ProcessState::Unknown(_) => "unknown",
        }
    }
}

impl fmt::Display for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessState::Unknown(raw) => write!(f, "unknown({raw})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// A driver call, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Call {
    GetRestoreThreadId,
    GetState,
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

impl Call {
    /// Whether the call changes the process's checkpoint state (an action, not a question).
    pub fn acts(&self) -> bool {
        !matches!(self, Call::GetState | Call::GetRestoreThreadId)
    }

    /// The gerund NVIDIA's tool uses in "Error <gerund> CUDA in process ID ...".
    pub fn gerund(&self) -> &'static str {
        match self {
            Call::GetRestoreThreadId => "getting the restore thread ID of",
            Call::GetState => "getting the state of",
            Call::Lock => "locking",
            Call::Checkpoint => "checkpointing",
            Call::Restore => "restoring",
            Call::Unlock => "unlocking",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Call::GetRestoreThreadId => "cuCheckpointProcessGetRestoreThreadId",
            Call::GetState => "cuCheckpointProcessGetState",
            Call::Lock => "cuCheckpointProcessLock",
            Call::Checkpoint => "cuCheckpointProcessCheckpoint",
            Call::Restore => "cuCheckpointProcessRestore",
            Call::Unlock => "cuCheckpointProcessUnlock",
        })
    }
}

/// Well-known `CUresult` values this crate reasons about.
pub mod code {
    pub const INVALID_VALUE: u32 = 1;
    pub const OUT_OF_MEMORY: u32 = 2;
    /// What the driver answers for a process that never initialised CUDA.
    pub const NOT_INITIALIZED: u32 = 3;
    pub const INVALID_DEVICE: u32 = 101;
    pub const OPERATING_SYSTEM: u32 = 304;
    pub const ILLEGAL_STATE: u32 = 401;
    pub const NOT_FOUND: u32 = 500;
    /// What driver r580 answers for a lock that gave up waiting for GPU work.
    pub const NOT_READY: u32 = 600;
    pub const NOT_PERMITTED: u32 = 800;
    pub const NOT_SUPPORTED: u32 = 801;
    pub const TIMEOUT: u32 = 909;
    pub const UNKNOWN: u32 = 999;
}

/// A failed driver call, with the driver's own name and description of the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{call}({pid}) returned {name}: {description}")]
pub struct CudaError {
    pub call: Call,
    pub pid: i32,
    pub code: u32,
    pub name: String,
    pub description: String,
}

impl CudaError {
    pub fn is_timeout(&self) -> bool {
        self.code == code::TIMEOUT
    }

    /// A lock that gave up waiting for GPU work within its timeout: driver r580 answers
    /// CUDA_ERROR_NOT_READY (measured), older drivers are said to answer CUDA_ERROR_TIMEOUT.
    pub fn is_lock_timeout(&self) -> bool {
        self.call == Call::Lock && matches!(self.code, code::NOT_READY | code::TIMEOUT)
    }
}

/// Why the driver library cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    #[error(
        "the CUDA driver library name is empty; name the library (e.g. --driver \
         /usr/lib/x86_64-linux-gnu/libcuda.so.1) or leave the option out to use {DEFAULT_LIBCUDA}"
    )]
    Unnamed,
    #[error(
        "the CUDA driver library {library} could not be loaded ({reason}); install the NVIDIA \
         driver (r570 or later), or name the library with {LIBCUDA_ENV}=PATH"
    )]
    Missing { library: String, reason: String },
    #[error(
        "the CUDA driver {library} (CUDA {version}) has no {symbol}: process checkpointing needs \
         driver r570 or later (CUDA 12.8); upgrade the NVIDIA driver"
    )]
    TooOld {
        library: String,
        version: String,
        symbol: &'static str,
    },
}

/// What was loaded, for logs and `--json` output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    /// The file the dynamic loader opened.
    pub library: String,
    /// `cuDriverGetVersion`, e.g. 13000.
    pub cuda_version: Option<i32>,
    /// Set when the library is the simulated driver (its own description).
    pub simulated: Option<String>,
}

impl fmt::Display for DriverInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let version = self
            .cuda_version
            .map_or_else(|| "?".into(), format_cuda_version);
        write!(f, "{} (CUDA {version})", self.library)?;
        if let Some(sim) = &self.simulated {
            write!(f, ", SIMULATED: {sim}")?;
        }
        Ok(())
    }
}

/// The loaded driver. Cheap to clone and share between threads: calls on different processes
/// run in parallel inside the driver.
#[derive(Clone)]
pub struct Driver {
    raw: Arc<ffi::RawDriver>,
    info: DriverInfo,
}

/// A driver call running on a worker thread ([`Driver::start`]).
pub struct Pending<T>(Receiver<T>);

impl<T> Pending<T> {
    /// The call's result, if it returns within `limit`. `None` leaves it running: the driver
    /// cannot cancel a call, so its thread ends when the call does.
    pub fn wait_for(&self, limit: Duration) -> Option<T> {
        self.0.recv_timeout(limit).ok()
    }

    /// The call's result, however long it takes (`None` if its thread panicked).
    pub fn wait(self) -> Option<T> {
        self.0.recv().ok()
    }
}

impl Driver {
    /// Loads the library named by `library`, else `libcuda.so.1`. (The caller reads
    /// `$CUDA_CKPT_LIBCUDA`, [`LIBCUDA_ENV`], where its user sets it.)
    pub fn load(library: Option<&str>) -> Result<Driver, LoadError> {
        let name = library.unwrap_or(DEFAULT_LIBCUDA).to_owned();
        if name.trim().is_empty() {
            return Err(LoadError::Unnamed);
        }
        let raw = ffi::RawDriver::open(&name).map_err(|e| match e {
            ffi::LoadError::Open(reason) => LoadError::Missing {
                library: name.clone(),
                reason,
            },
            ffi::LoadError::MissingSymbol { symbol, version } => LoadError::TooOld {
                library: name.clone(),
                version: version
                    .map(format_cuda_version)
                    .unwrap_or_else(|| "?".into()),
                symbol,
            },
        })?;
        let info = DriverInfo {
            library: raw.path().map(|p| p.display().to_string()).unwrap_or(name),
            cuda_version: raw.version(),
            simulated: raw.simulation(),
        };
        tracing::trace!("CUDA driver loaded: {}", info);
        Ok(Driver {
            raw: Arc::new(raw),
            info,
        })
    }

    pub fn info(&self) -> &DriverInfo {
        &self.info
    }

    /// Starts `f` with this driver on a worker thread of its own. Driver calls can block
    /// without limit (an action on a stopped process; the state while an action runs), so
    /// callers that must not hang wait for the result with a limit.
    pub fn start<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Driver) -> T + Send + 'static,
    ) -> Pending<T> {
        let (tx, rx) = mpsc::channel();
        let driver = self.clone();
        std::thread::spawn(move || {
            let _ = tx.send(f(&driver));
        });
        Pending(rx)
    }

    /// `f` with this driver, if it returns within `limit` (see [`Driver::start`]).
    pub fn within<T: Send + 'static>(
        &self,
        limit: Duration,
        f: impl FnOnce(&Driver) -> T + Send + 'static,
    ) -> Option<T> {
        self.start(f).wait_for(limit)
    }

    fn error(&self, call: Call, pid: i32, code: u32) -> CudaError {
        CudaError {
            call,
            pid,
            code,
            name: self
                .raw
                .error_name(code)
                .unwrap_or_else(|| format!("CUDA_ERROR_{code}")),
            description: self
                .raw
                .error_string(code)
                .unwrap_or_else(|| format!("CUDA error {code}")),
        }
    }

    /// The driver's helper thread inside `pid`; fails for processes without CUDA.
    pub fn restore_thread_id(&self, pid: i32) -> Result<i32, CudaError> {
        self.raw
            .get_restore_thread_id(pid)
            .map_err(|c| self.error(Call::GetRestoreThreadId, pid, c))
    }

    pub fn state(&self, pid: i32) -> Result<ProcessState, CudaError> {
        self.raw
            .get_state(pid)
            .map(ProcessState::from_raw)
            .map_err(|c| self.error(Call::GetState, pid, c))
    }

    /// Blocks further CUDA calls in `pid` once submitted work has finished. With a timeout the
    /// driver gives up after it and leaves the process running ([`CudaError::is_lock_timeout`]);
    /// the timeout counts from when the process's driver thread takes the request, so a lock
    /// of a stopped process waits until the process runs again.
    pub fn lock(&self, pid: i32, timeout: Option<Duration>) -> Result<(), CudaError> {
        let ms = timeout.map_or(0, |t| t.as_millis().clamp(1, u32::MAX as u128) as u32);
        self.raw
            .lock(pid, ms)
            .map_err(|c| self.error(Call::Lock, pid, c))
    }

    /// Moves the device memory of a locked process into its host memory and releases the GPUs.
    pub fn checkpoint(&self, pid: i32) -> Result<(), CudaError> {
        self.raw
            .checkpoint(pid)
            .map_err(|c| self.error(Call::Checkpoint, pid, c))
    }

    /// Re-acquires GPUs and copies device memory back; the process stays locked. A non-empty
    /// `map` moves the process onto other GPUs (driver r580 and later).
    pub fn restore(&self, pid: i32, map: &DeviceMap) -> Result<(), CudaError> {
        if !map.is_empty() && self.info.cuda_version.unwrap_or(0) < DEVICE_MAP_MIN_VERSION {
            let mut e = self.error(Call::Restore, pid, code::NOT_SUPPORTED);
            e.description = format!(
                "restoring onto other GPUs needs driver r580 (CUDA 13.0) or later, this is {}",
                self.info
                    .cuda_version
                    .map(format_cuda_version)
                    .unwrap_or_else(|| "unknown".into())
            );
            return Err(e);
        }
        let pairs: Vec<_> = map.pairs().iter().map(|(o, n)| (o.0, n.0)).collect();
        self.raw
            .restore(pid, &pairs)
            .map_err(|c| self.error(Call::Restore, pid, c))
    }

    pub fn unlock(&self, pid: i32) -> Result<(), CudaError> {
        self.raw
            .unlock(pid)
            .map_err(|c| self.error(Call::Unlock, pid, c))
    }
}

/// 13000 -> "13.0".
pub fn format_cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_to_cuda_checkpoint_words() {
        assert_eq!(ProcessState::from_raw(0).to_string(), "running");
        assert_eq!(ProcessState::from_raw(1).to_string(), "locked");
        assert_eq!(ProcessState::from_raw(2).to_string(), "checkpointed");
        assert_eq!(ProcessState::from_raw(3).to_string(), "failed");
        assert_eq!(ProcessState::from_raw(77), ProcessState::Unknown(77));
        assert_eq!(
            serde_json::to_string(&ProcessState::Checkpointed).unwrap(),
            "\"checkpointed\""
        );
        for s in [ProcessState::Locked, ProcessState::Unknown(9)] {
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<ProcessState>(&text).unwrap(), s);
        }
    }

    #[test]
    fn cuda_versions_format_like_nvidia_smi() {
        assert_eq!(format_cuda_version(13000), "13.0");
        assert_eq!(format_cuda_version(12080), "12.8");
    }

    #[test]
    fn lock_timeouts_are_recognised_in_both_spellings() {
        let e = |call, code| CudaError {
            call,
            pid: 1,
            code,
            name: String::new(),
            description: String::new(),
        };
        assert!(e(Call::Lock, code::NOT_READY).is_lock_timeout());
        assert!(e(Call::Lock, code::TIMEOUT).is_lock_timeout());
        assert!(!e(Call::Checkpoint, code::NOT_READY).is_lock_timeout());
        assert!(!e(Call::Lock, code::ILLEGAL_STATE).is_lock_timeout());
    }

    #[test]
    fn an_empty_library_name_is_refused_with_the_fix() {
        let msg = Driver::load(Some("")).err().unwrap().to_string();
        assert!(msg.contains("empty") && msg.contains("--driver"), "{msg}");
    }

    #[test]
    fn missing_driver_names_the_fix() {
        let err = Driver::load(Some("/nonexistent/libcuda.so.1"))
            .err()
            .unwrap();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/libcuda.so.1"), "{msg}");
        assert!(msg.contains("install the NVIDIA driver"), "{msg}");
    }
}
