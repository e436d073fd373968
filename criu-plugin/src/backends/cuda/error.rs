//! Why a CUDA dump or restore fails, and what the operator reads: the cause, the state things
//! were left in, and the fix.

use std::path::PathBuf;
use std::time::Duration;

use cuda_checkpoint_ctl::driver::ProcessState;
use cuda_checkpoint_ctl::ops::rounds;
use process_facts::refusal::Refusal;

use crate::guardian::proto::DriverFailure;

/// A process, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    pub pid: i32,
    pub comm: String,
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "process {} ({})", self.pid, self.comm)
    }
}

/// Why a CUDA process's driver thread cannot run (so a lock or a checkpoint would wait until it
/// can: the driver has no limit on that wait).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// Stopped by a signal (state T): SIGSTOP, Ctrl-Z.
    Stopped,
    /// Traced by another process (a debugger), which holds it.
    Traced { by: i32 },
    /// In a frozen cgroup.
    Frozen { cgroup: PathBuf },
    /// Its driver thread alone is stopped or held by a tracer.
    Thread { tid: i32, by: i32 },
}

impl Held {
    /// What holds process `pid`, and the fix.
    pub fn describe(&self, pid: i32) -> String {
        match self {
            Held::Stopped => format!(
                "is stopped (SIGSTOP or Ctrl-Z): the GPU driver's thread in it cannot run; \
                 continue it (kill -CONT {pid}) and dump again"
            ),
            other => other.to_string(),
        }
    }
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Held::Stopped => f.write_str(
                "is stopped (SIGSTOP or Ctrl-Z): the GPU driver's thread in it cannot run; \
                 continue it (kill -CONT) and dump again",
            ),
            Held::Traced { by } => write!(
                f,
                "is held by tracer {by} (a debugger?): the GPU driver's thread in it cannot run; \
                 detach the tracer and dump again"
            ),
            Held::Frozen { cgroup } => write!(
                f,
                "is in the frozen cgroup {}: the GPU driver's thread in it cannot run; thaw it \
                 and dump again (CRIU >= 4.1 thaws it itself when this plugin asks)",
                cgroup.display()
            ),
            Held::Thread { tid, by: 0 } => write!(
                f,
                "has its GPU driver thread {tid} stopped: it must run for the GPU state to move; \
                 let it run and dump again"
            ),
            Held::Thread { tid, by } => write!(
                f,
                "has its GPU driver thread {tid} held by tracer {by} (a debugger?); detach it and \
                 dump again"
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(
        "pre-dump is not supported for CUDA {0}: device memory has no dirty tracking and a \
         pre-dump has no point at which to undo a lock; run `criu dump` without pre-dump \
         (nothing was locked, the process keeps running)"
    )]
    PreDump(Who),
    #[error(
        "this CRIU's lazy dumps (--lazy-pages) would lose CUDA {0}: they end the tasks when the \
         receiver's connection ends, however it ends; use the project's CRIU (patch 0014: the \
         tasks end only once the receiver has every page, as `criu-gpu dump --to` moves them), \
         or dump without --lazy-pages (nothing was locked)"
    )]
    LazyPages(Who),
    #[error(
        "{} {} the CUDA driver, but the driver cannot be loaded by the plugin: {reason}; \
         install the NVIDIA driver (r570 or later) or name the library with \
         CUDA_CKPT_LIBCUDA=PATH (in criu's environment or /etc/criu/gpu-plugin.conf); nothing \
         was locked",
        list(.processes),
        if .processes.len() == 1 { "maps" } else { "map" }
    )]
    NoDriver { processes: Vec<Who>, reason: String },
    #[error("CUDA {who} {}; nothing was locked", .held.describe(.who.pid))]
    Held { who: Who, held: Held },
    /// What the rule set refuses before any lock (io_uring rings, NCCL transports).
    #[error(
        "{}; nothing was locked. {}",
        .0.what(),
        .0.fix("set CRIU_GPU_NCCL_CHECK=0")
    )]
    Refused(Refusal),
    #[error(
        "CUDA {0} has a GPU checkpoint action in progress that is not this dump's (a concurrent \
         dump or cuda-checkpoint, or the action of a CRIU that died); wait for it, then check \
         `cuda-checkpoint-ctl --list`; nothing was locked"
    )]
    Busy(Who),
    #[error("CUDA {who} is {state}: the driver cannot checkpoint it")]
    Unusable { who: Who, state: ProcessState },
    #[error(
        "no time is left for GPU locks in CRIU's seize budget ({left:?} of criu --timeout): raise \
         criu --timeout; nothing was locked"
    )]
    NoTime { left: Duration },
    /// The lock rounds of a job across machines stopped (another node failed, etcd was lost,
    /// no time for a round).
    #[error(
        "the lock rounds of the job across machines stopped: {0}; every process of this node was \
         unlocked and keeps running"
    )]
    Cluster(String),
    #[error("{}", locks(.failures, .rounds))]
    Locks {
        failures: Vec<(Who, LockFailure)>,
        /// Locked in rounds: how many processes, and what the rounds took.
        rounds: Option<(usize, rounds::Report)>,
    },
    #[error(
        "CUDA {who} was stopped by signal {signal} between its lock and CRIU's seize (Ctrl-Z?); \
         a stopped CUDA process would be restored into a wait that never ends, so the dump is \
         abandoned; its GPU state is being put back and it stays stopped: continue it (kill \
         -CONT {pid}) and dump again", pid = .who.pid
    )]
    StoppedDuringDump { who: Who, signal: i32 },
    #[error("CUDA {0} is not seized by CRIU at CHECKPOINT_DEVICES; the dump is abandoned")]
    NotSeized(Who),
    #[error(
        "CUDA {0} ended during the dump (after its lock): the images would miss it, so the dump \
         is abandoned and the other processes' GPU state is put back; find why it ended (its \
         log, the kernel's OOM killer) and restart the job"
    )]
    EndedDuringDump(Who),
    #[error("{}", checkpoints(.failures))]
    Checkpoints { failures: Vec<(Who, ActionFailure)> },
    #[error("cannot let the GPU driver threads run: {0}; the dump is abandoned")]
    Threads(String),
}

/// Why a lock did not take.
#[derive(Debug, Clone)]
pub enum LockFailure {
    /// The driver gave up waiting for submitted GPU work.
    GaveUp {
        waited: Duration,
        nccl: bool,
    },
    /// The call did not return (its driver thread stopped running after the checks?).
    Stuck {
        waited: Duration,
    },
    Driver(DriverFailure),
    /// Locked in a round that did not lock every process, and not unlocked again.
    NotUnlocked(String),
}

/// Why a checkpoint or restore of one process failed.
#[derive(Debug)]
pub enum ActionFailure {
    Driver(DriverFailure),
    /// The call did not return within the limit.
    Stuck {
        limit: Duration,
    },
    /// The process died during it.
    Died,
}

fn list(ws: &[Who]) -> String {
    let names: Vec<String> = ws.iter().map(Who::to_string).collect();
    match names.len() {
        1 => format!("CUDA {}", names[0]),
        _ => format!("CUDA processes {}", names.join(", ")),
    }
}

fn locks(failures: &[(Who, LockFailure)], rounds: &Option<(usize, rounds::Report)>) -> String {
    let mut parts = Vec::new();
    for (who, f) in failures {
        parts.push(match f {
            LockFailure::GaveUp { waited, nccl } => {
                let mut s = format!(
                    "GPU work in {who} did not finish within {} ms, so it could not be locked",
                    waited.as_millis()
                );
                match (rounds, nccl) {
                    (Some((n, r)), _) => s.push_str(&format!(
                        " in the last of {} rounds of locking the {n} CUDA processes at once \
                         ({:.1} s in all: each round unlocks the locked ones so that their peers' \
                         collectives can finish)",
                        r.rounds,
                        r.elapsed.as_secs_f64()
                    )),
                    (None, true) => s.push_str(
                        ". It uses NCCL: a rank waiting in a collective for a rank that is \
                         already locked never finishes its GPU work. All ranks of the tree were \
                         locked at once, in one round (CRIU_GPU_LOCK_ROUNDS=0?); locking them in \
                         rounds finds a moment when all can be locked",
                    ),
                    (None, false) => {}
                }
                s
            }
            LockFailure::Stuck { waited } => format!(
                "the lock of {who} did not return within {} ms (its GPU driver thread stopped \
                 running?)",
                waited.as_millis()
            ),
            LockFailure::Driver(e) => format!("locking {who} failed: {e}"),
            LockFailure::NotUnlocked(e) => format!(
                "{who}, locked in a round that did not lock every process, could not be \
                 unlocked again: {e}"
            ),
        });
    }
    let fix = if rounds.is_some() {
        "Retry, or give the rounds more time: raise criu --timeout (the rounds stay within \
         criu's seize time, or CRIU_GPU_LOCK_TIMEOUT_MS where it is set)"
    } else {
        "Retry, or let locks wait longer: CRIU_GPU_LOCK_TIMEOUT_MS, with criu --timeout above it \
         (locks must fit in criu's seize time)"
    };
    format!(
        "{}. The dump is abandoned and every CUDA process is put back as it was. {fix}",
        parts.join("; ")
    )
}

fn checkpoints(failures: &[(Who, ActionFailure)]) -> String {
    let parts: Vec<String> = failures
        .iter()
        .map(|(who, f)| match f {
            // F19: the driver refuses every later checkpoint of a process whose checkpoint
            // failed; it runs on, but the operator must know before the next dump.
            ActionFailure::Driver(e) => format!(
                "{who}: {e} (the driver will refuse to checkpoint it again: restart it before its \
                 next checkpoint)"
            ),
            ActionFailure::Stuck { limit } => format!(
                "{who}: the GPU checkpoint did not finish within {} s (CRIU_GPU_ACTION_TIMEOUT_S)",
                limit.as_secs()
            ),
            ActionFailure::Died => format!("{who} died during its GPU checkpoint"),
        })
        .collect();
    format!(
        "checkpoint of CUDA state failed for {}; the dump is abandoned and every CUDA process is \
         being returned to its state before the dump",
        parts.join("; ")
    )
}

/// Why a restore fails: refused in `init` before anything is created, or, for a CUDA process or
/// the restored tree as a whole, at RESUME_DEVICES_LATE (the tree is then killed; the images are
/// unchanged and can be restored again).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// What the image crate's checks refuse before anything is restored.
    #[error("{0}")]
    Check(#[from] criu_gpu_image::restorable::CudaCheckError),
    #[error(
        "a lazy restore (--lazy-pages) of CUDA state needs every page in place before the tasks \
         resume (the GPU driver reads the checkpoint data all at once, and the dumping side must \
         keep its tasks until then): add --pages-before-resume (the project's CRIU, patch 0014; \
         `criu-gpu restore --listen` does), or restore without --lazy-pages"
    )]
    LazyPages,
    #[error("CUDA process {ns_pid} ({comm}) of the checkpoint is not in the restored tree")]
    NotInTree { ns_pid: i32, comm: String },
    #[error(
        "restored {who} cannot reach GPU {gpu}: its root file system has no /dev/nvidia{minor} \
         (a container restored with the device nodes of the GPUs it had before); give the \
         container this GPU when restoring it (CDI: nvidia.com/gpu={gpu}, or --device \
         /dev/nvidia{minor} with /dev/nvidiactl and /dev/nvidia-uvm), or restore onto the GPUs \
         it has with CRIU_GPU_DEVICE_MAP"
    )]
    NoDeviceNode {
        who: Who,
        gpu: cuda_checkpoint_ctl::driver::GpuUuid,
        minor: u32,
    },
    #[error("restored {0} has no CUDA restore thread: {1}")]
    NoRestoreThread(Who, DriverFailure),
    /// The driver did not name the process's restore thread.
    #[error("{who}: the driver did not answer within {} s", .waited.as_secs())]
    Silent { who: Who, waited: Duration },
    #[error("restoring CUDA state of {who} failed: {}", restore_failure(.failure))]
    Action { who: Who, failure: ActionFailure },
    #[error("cannot let the GPU driver threads run: {0}")]
    Threads(crate::core::ThreadError),
    /// The guardian failed (its message says what is left to do).
    #[error("{0}")]
    Guardian(#[from] crate::guardian::GuardianError),
    /// The large pages images, checked while CRIU restored: no answer within the limit.
    #[error(
        "the pages images ({:.2} GiB) were not checked against their digests within {limit:?}",
        super::gib(*.bytes)
    )]
    PagesUnchecked { bytes: u64, limit: Duration },
    /// ... damaged (the guardian's words name the file).
    #[error("{0}")]
    PagesDamaged(String),
    #[error("the guardian did not answer about the pages images")]
    PagesNoAnswer,
}

fn restore_failure(f: &ActionFailure) -> String {
    match f {
        ActionFailure::Driver(e) if e.code == cuda_checkpoint_ctl::driver::code::OUT_OF_MEMORY => {
            format!("{e}; free GPU memory, or restore onto other GPUs with CRIU_GPU_DEVICE_MAP")
        }
        ActionFailure::Driver(e) => e.to_string(),
        ActionFailure::Stuck { limit } => format!(
            "the GPU restore did not finish within {} s (CRIU_GPU_ACTION_TIMEOUT_S)",
            limit.as_secs()
        ),
        ActionFailure::Died => "the process died during its GPU restore".to_owned(),
    }
}

/// The guardian failing is a GPU failure of the hook (the message says what is left to do).
impl From<crate::guardian::GuardianError> for crate::core::HookError {
    fn from(e: crate::guardian::GuardianError) -> Self {
        crate::core::HookError::gpu(e)
    }
}
