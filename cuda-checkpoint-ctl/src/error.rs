//! The crate's error type: each variant names the cause, the message says the fix.

use std::time::Duration;

use crate::driver::{Call, CudaError, LoadError, ParseError, ProcessState};
use crate::placement::PlacementError;

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
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error(
        "NVML ({library}) cannot be used: {reason}; install the NVIDIA driver's NVML \
         (libnvidia-ml.so.1), or name it with --nvml PATH or CUDA_CKPT_LIBNVML=PATH"
    )]
    Nvml { library: String, reason: String },
    #[error("process {pid} is {state}, {why}")]
    WrongState {
        pid: i32,
        state: ProcessState,
        why: &'static str,
    },
    #[error("{}", no_answer(*call, *pid, comm, *waited, *stopped))]
    NoAnswer {
        call: Call,
        pid: i32,
        comm: String,
        waited: Duration,
        /// The process was stopped (signal, debugger, frozen cgroup) when we gave up.
        stopped: bool,
    },
    #[error(
        "GPU work in process {pid} ({comm}) did not finish within {timeout_ms} ms; raise --timeout"
    )]
    LockGaveUp {
        pid: i32,
        comm: String,
        timeout_ms: u64,
        /// The driver's answer, which `cuda-checkpoint`-compatible output prints.
        source: CudaError,
    },
    #[error(
        "the GPU state of process {pid} ({comm}) is lost: the driver reports it failed; restart it"
    )]
    GpuStateLost { pid: i32, comm: String },
    #[error(
        "the driver can no longer restore process {pid} ({comm}): {source}; a restore that ran \
         out of GPU memory leaves a process so (NVIDIA/cuda-checkpoint#44): restart it"
    )]
    Unrestorable {
        pid: i32,
        comm: String,
        source: CudaError,
    },
    #[error(
        "the checkpoint state of process {pid} ({comm}) kept changing while recovering it \
         (another tool acting on it?); stop that tool and run --recover again"
    )]
    Raced { pid: i32, comm: String },
    #[error(
        "{} process(es) could not be inspected for lack of permission ({}): run as root, or as \
         the user who owns them",
        pids.len(),
        pid_list(pids)
    )]
    NotInspected { pids: Vec<i32> },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The driver's own error, where there is one (for `cuda-checkpoint`-compatible output).
    pub fn cuda(&self) -> Option<&CudaError> {
        match self {
            Error::Cuda(c) | Error::LockGaveUp { source: c, .. } => Some(c),
            Error::Unrestorable { source: c, .. } => Some(c),
            _ => None,
        }
    }
}

fn no_answer(call: Call, pid: i32, comm: &str, waited: Duration, stopped: bool) -> String {
    let acts = !matches!(call, Call::GetState | Call::GetRestoreThreadId);
    let why = if stopped {
        format!(
            "the process is stopped (a signal, a debugger or a frozen cgroup), so its driver \
             thread cannot run: let it continue (kill -CONT {pid}, or thaw its cgroup), then \
             run --recover"
        )
    } else if acts {
        "an action is in progress on it (a large checkpoint takes a while; a hung GPU never \
         ends): raise --wait; an action the driver took goes on after this tool exits, so run \
         --recover once it is done"
            .to_owned()
    } else {
        "an action is in progress on it (a large checkpoint takes a while; a hung GPU never \
         ends): raise --wait"
            .to_owned()
    };
    format!(
        "the driver did not finish {call} on process {pid} ({comm}) within {:.1} s: {why}",
        waited.as_secs_f64()
    )
}

fn pid_list(pids: &[i32]) -> String {
    const SHOWN: usize = 10;
    let mut s: Vec<String> = pids.iter().take(SHOWN).map(|p| p.to_string()).collect();
    if pids.len() > SHOWN {
        s.push(format!("and {} more", pids.len() - SHOWN));
    }
    s.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_answer(call: Call, stopped: bool) -> String {
        Error::NoAnswer {
            call,
            pid: 42,
            comm: "train".into(),
            waited: Duration::from_millis(1500),
            stopped,
        }
        .to_string()
    }

    #[test]
    fn a_call_without_answer_says_why_and_what_to_do() {
        let stopped = no_answer(Call::Lock, true);
        assert!(
            stopped.contains("process 42 (train) within 1.5 s")
                && stopped.contains("kill -CONT 42"),
            "{stopped}"
        );
        let busy = no_answer(Call::Checkpoint, false);
        assert!(
            busy.contains("raise --wait") && busy.contains("--recover"),
            "{busy}"
        );
        let state = no_answer(Call::GetState, false);
        assert!(
            !state.contains("--recover"),
            "reading the state leaves nothing to undo"
        );
    }

    #[test]
    fn long_pid_lists_are_cut() {
        let e = Error::NotInspected {
            pids: (1..=25).collect(),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("25 process(es)") && text.contains("and 15 more"),
            "{text}"
        );
    }
}
