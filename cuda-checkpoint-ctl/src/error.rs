//! The crate's error type: each variant names the cause, the message says the fix.

use std::time::Duration;

use crate::driver::{Call, CudaError, LoadError, ParseError, ProcessState};
use crate::placement::PlacementError;
use process_facts::process::Hold;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What the rule set refuses before any call (NCCL transports that cannot be restored).
    #[error(
        "{}; nothing was done. {}",
        .0.what(),
        .0.fix("pass --no-nccl-check")
    )]
    Refused(process_facts::refusal::Refusal),
    #[error(transparent)]
    Driver(#[from] LoadError),
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error(transparent)]
    Select(#[from] process_facts::process::SelectError),
    #[error("process {pid} holds no CUDA state ({reason})")]
    NotCuda { pid: i32, reason: String },
    #[error(transparent)]
    DeviceMap(#[from] ParseError),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error(transparent)]
    Nvml(#[from] crate::inventory::NvmlError),
    #[error("process {pid} is {state}, {why}")]
    WrongState {
        pid: i32,
        state: ProcessState,
        why: &'static str,
    },
    /// The process's CUDA driver thread cannot run, so the driver would wait for it without
    /// limit (docs/driver-facts.md, F2, F11): refused before any call.
    #[error(
        "process {pid} ({comm}) {}; the driver would wait for it without limit, so nothing was \
         asked of it: {}, then try again",
        held_words(*pid, hold).0,
        held_words(*pid, hold).1
    )]
    Held { pid: i32, comm: String, hold: Hold },
    /// A driver call given up on: it goes on in the driver, and an action may still land.
    #[error("{}", no_answer(*call, *pid, comm, *waited, held.as_ref()))]
    NoAnswer {
        call: Call,
        pid: i32,
        comm: String,
        waited: Duration,
        /// What held the process when we gave up, if anything did.
        held: Option<Hold>,
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
    /// A group whose processes wait for each other on the GPU was locked in rounds, and no
    /// round locked all of them.
    #[error(
        "GPU work in process {pid} ({comm}) did not finish within {} ms in the last of {rounds} \
         rounds of locking the {group} CUDA processes at once ({:.1} s in all); retry, or give the \
         rounds more time with --timeout",
        .longest.as_millis(),
        .elapsed.as_secs_f64()
    )]
    RoundsGaveUp {
        pid: i32,
        comm: String,
        rounds: u32,
        elapsed: Duration,
        longest: Duration,
        group: usize,
    },
    #[error(
        "the GPU state of process {pid} ({comm}) is lost: the driver reports it failed; restart it"
    )]
    GpuStateLost { pid: i32, comm: String },
    #[error(
        "the driver can no longer restore process {pid} ({comm}): {source}; a restore that ran \
         out of GPU memory leaves a process so (measured on r580): restart it"
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

/// What holds process `pid` (a clause after "process P (comm)"), and how to let it go.
fn held_words(pid: i32, hold: &Hold) -> (String, String) {
    match hold {
        Hold::Stopped => (
            "is stopped (SIGSTOP, Ctrl-Z), so the CUDA driver's thread in it cannot run".into(),
            format!("continue it (kill -CONT {pid})"),
        ),
        Hold::Traced {
            tid,
            tracer,
            tracer_comm,
        } => (
            format!(
                "has its CUDA driver thread {tid} held in a ptrace stop by process {tracer} \
                 ({tracer_comm})"
            ),
            "detach that debugger or tracer (gdb: detach), or end it".into(),
        ),
        Hold::Frozen(freezer) => {
            let (file, value) = freezer.thaw();
            (
                format!(
                    "is in the frozen cgroup {}, so the CUDA driver's thread in it cannot run",
                    freezer.cgroup.display()
                ),
                format!("thaw it (echo {value} > {})", file.display()),
            )
        }
    }
}

fn no_answer(call: Call, pid: i32, comm: &str, waited: Duration, held: Option<&Hold>) -> String {
    let recover = format!(
        "the call was not cancelled and may still take effect{}: then `cuda-checkpoint-ctl \
         --recover --pid {pid}` brings the process back to running (it waits for the call to end)",
        if held.is_some() { " once it runs" } else { "" }
    );
    let why = match (held, call.acts()) {
        (Some(h), true) => {
            let (what, fix) = held_words(pid, h);
            format!("the process {what}; {fix}; {recover}")
        }
        (Some(h), false) => {
            let (what, fix) = held_words(pid, h);
            format!("the process {what}; {fix}, then try again (nothing was changed)")
        }
        (None, true) => format!(
            "an action is in progress on it (a large checkpoint takes a while; a hung GPU never \
             ends): raise --wait; {recover}"
        ),
        (None, false) => "an action is in progress on it (a large checkpoint takes a while; a \
                          hung GPU never ends): raise --wait"
            .into(),
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

    fn no_answer(call: Call, held: Option<Hold>) -> String {
        Error::NoAnswer {
            call,
            pid: 42,
            comm: "train".into(),
            waited: Duration::from_millis(1500),
            held,
        }
        .to_string()
    }

    #[test]
    fn a_call_without_answer_says_why_and_what_may_still_happen() {
        let stopped = no_answer(Call::Lock, Some(Hold::Stopped));
        assert!(
            stopped.contains("process 42 (train) within 1.5 s")
                && stopped.contains("kill -CONT 42")
                && stopped.contains("may still take effect once it runs")
                && stopped.contains("cuda-checkpoint-ctl --recover --pid 42"),
            "{stopped}"
        );
        let busy = no_answer(Call::Checkpoint, None);
        assert!(
            busy.contains("raise --wait") && busy.contains("--recover --pid 42"),
            "{busy}"
        );
        for state in [
            no_answer(Call::GetState, None),
            no_answer(Call::GetState, Some(Hold::Stopped)),
        ] {
            assert!(
                !state.contains("--recover"),
                "reading the state leaves nothing to undo: {state}"
            );
        }
    }

    #[test]
    fn a_held_process_is_refused_with_the_way_to_free_it() {
        let held = |hold| {
            Error::Held {
                pid: 42,
                comm: "train".into(),
                hold,
            }
            .to_string()
        };
        let traced = held(Hold::Traced {
            tid: 43,
            tracer: 7,
            tracer_comm: "gdb".into(),
        });
        assert!(
            traced.starts_with(
                "process 42 (train) has its CUDA driver thread 43 held in a ptrace \
                                stop by process 7 (gdb)"
            ) && traced.contains("nothing was asked")
                && traced.contains("detach"),
            "{traced}"
        );
        let frozen = held(Hold::Frozen(process_facts::process::Freezer {
            cgroup: "/sys/fs/cgroup/pod".into(),
            version: process_facts::process::CgroupVersion::V2,
        }));
        assert!(
            frozen.contains("in the frozen cgroup /sys/fs/cgroup/pod")
                && frozen.contains("echo 0 > /sys/fs/cgroup/pod/cgroup.freeze"),
            "{frozen}"
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
