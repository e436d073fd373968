//! The operator's words: each message the backend's tests meet, pinned once in full as CRIU's
//! log shows it. Every other test matches the error's variant.

use criu_gpu_image::digest::DigestError;
use criu_gpu_image::restorable::CudaCheckError;

use super::*;
use crate::backends::cuda::error::Who;
use crate::guardian::proto::{DriverFailure, Op};

fn who(pid: i32) -> Who {
    Who {
        pid,
        comm: "app".into(),
    }
}

fn oom(op: Op) -> DriverFailure {
    DriverFailure {
        op,
        code: code::OUT_OF_MEMORY,
        name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        description: "out of memory".into(),
    }
}

/// What the operator reads.
fn says(e: impl std::error::Error + Send + Sync + 'static) -> String {
    HookError::gpu(e).to_string()
}

fn gave_up(nccl: bool) -> LockFailure {
    LockFailure::GaveUp {
        waited: Duration::from_millis(500),
        nccl,
    }
}

#[test]
fn refusals_before_any_lock() {
    assert_eq!(
        says(DumpError::PreDump(who(10))),
        "pre-dump is not supported for CUDA process 10 (app): device memory has no dirty \
         tracking and a pre-dump has no point at which to undo a lock; run `criu dump` without \
         pre-dump (nothing was locked, the process keeps running)"
    );
    assert_eq!(
        says(DumpError::NoDriver {
            processes: vec![who(10)],
            reason: "libcuda.so.1: cannot open shared object file".into(),
        }),
        "CUDA process 10 (app) maps the CUDA driver, but the driver cannot be loaded by the \
         plugin: libcuda.so.1: cannot open shared object file; install the NVIDIA driver (r570 \
         or later) or name the library with CUDA_CKPT_LIBCUDA=PATH (in criu's environment or \
         /etc/criu/gpu-plugin.conf); nothing was locked"
    );
    let held = |held| says(DumpError::Held { who: who(11), held });
    assert_eq!(
        held(Held::Stopped),
        "CUDA process 11 (app) is stopped (SIGSTOP or Ctrl-Z): the GPU driver's thread in it \
         cannot run; continue it (kill -CONT 11) and dump again; nothing was locked"
    );
    assert_eq!(
        held(Held::Traced { by: 77 }),
        "CUDA process 11 (app) is held by tracer 77 (a debugger?): the GPU driver's thread in it \
         cannot run; detach the tracer and dump again; nothing was locked"
    );
    assert_eq!(
        held(Held::Thread { tid: 1010, by: 0 }),
        "CUDA process 11 (app) has its GPU driver thread 1010 stopped: it must run for the GPU \
         state to move; let it run and dump again; nothing was locked"
    );
}

#[test]
fn refusals_by_the_rule_set() {
    let ranks = [(10, "app".to_owned()), (11, "app".to_owned())];
    let nccl = refusal::nccl(&ranks, |_| nccl::Config::default()).unwrap();
    assert_eq!(
        says(DumpError::Refused(nccl)),
        "the NCCL ranks of this node would talk to each other through transports the NVIDIA \
         driver checkpoints but cannot restore: process 10 (app) (P2P, SHM and cuMem), process 11 \
         (app) (P2P, SHM and cuMem); a checkpoint would leave them unable to run again (measured \
         with r580: the restore answers CUDA_ERROR_NOT_SUPPORTED); nothing was locked. start the \
         job with NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0 (shared memory without cuMem, the \
         fastest that comes back) or NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0 \
         (sockets), in its environment or /etc/nccl.conf; if these processes do not talk to each \
         other through NCCL, set CRIU_GPU_NCCL_CHECK=0"
    );
    let stock = says(DumpError::Refused(Refusal::IoUring {
        pid: 12,
        comm: "app".into(),
        support: RingSupport::None,
        fds: 1,
        mappings: 2,
        rings: vec![],
        libraries: vec!["libtorch_cpu.so".into()],
    }));
    // The ring's own advice (USE_LIBUV=0, kernel.io_uring_disabled) is the rule set's wording,
    // pinned in cuda-checkpoint-ctl's io_uring tests.
    assert!(
        stock.starts_with(
            "process 12 (app) holds io_uring instances (1 fd(s), 2 ring mapping(s); it maps \
             libtorch_cpu.so), which this CRIU cannot dump: the dump would fail after the GPU \
             state was checkpointed; nothing was locked. use the project's CRIU \
             (scripts/install.sh; patch 0008 dumps rings that are idle), or do without the \
             rings: "
        ),
        "{stock}"
    );
    assert_eq!(
        says(DumpError::Refused(Refusal::IoUring {
            pid: 13,
            comm: "app".into(),
            support: RingSupport::Idle,
            fds: 1,
            mappings: 2,
            rings: vec!["fd 7: io_uring with 1 request(s) in flight (opcodes 22)".into()],
            libraries: vec![],
        })),
        "process 13 (app) holds io_uring rings that CRIU cannot dump as they are: fd 7: io_uring \
         with 1 request(s) in flight (opcodes 22); nothing was locked. CRIU dumps a ring only \
         while nothing is queued or in flight on it: checkpoint when the program's event loop is \
         idle, or let it finish what it submitted first"
    );
}

#[test]
fn locks_that_fail() {
    assert_eq!(
        says(DumpError::Locks {
            failures: vec![(who(11), gave_up(true))],
            rounds: None,
        }),
        "GPU work in process 11 (app) did not finish within 500 ms, so it could not be locked. \
         It uses NCCL: a rank waiting in a collective for a rank that is already locked never \
         finishes its GPU work. All ranks of the tree were locked at once, in one round \
         (CRIU_GPU_LOCK_ROUNDS=0?); locking them in rounds finds a moment when all can be \
         locked. The dump is abandoned and every CUDA process is put back as it was. Retry, or \
         let locks wait longer: CRIU_GPU_LOCK_TIMEOUT_MS, with criu --timeout above it (locks \
         must fit in criu's seize time)"
    );
    let report = cuda_checkpoint_ctl::ops::rounds::Report {
        rounds: 3,
        elapsed: Duration::from_millis(1900),
        longest: Duration::from_millis(1000),
    };
    assert_eq!(
        says(DumpError::Locks {
            failures: vec![(who(11), gave_up(false))],
            rounds: Some((2, report)),
        }),
        "GPU work in process 11 (app) did not finish within 500 ms, so it could not be locked in \
         the last of 3 rounds of locking the 2 CUDA processes at once (1.9 s in all: each round \
         unlocks the locked ones so that their peers' collectives can finish). The dump is \
         abandoned and every CUDA process is put back as it was. Retry, or give the rounds more \
         time: raise criu --timeout (the rounds stay within criu's seize time, or \
         CRIU_GPU_LOCK_TIMEOUT_MS where it is set)"
    );
    assert_eq!(
        says(DumpError::StoppedDuringDump {
            who: who(10),
            signal: 19,
        }),
        "CUDA process 10 (app) was stopped by signal 19 between its lock and CRIU's seize \
         (Ctrl-Z?); a stopped CUDA process would be restored into a wait that never ends, so the \
         dump is abandoned; its GPU state is being put back and it stays stopped: continue it \
         (kill -CONT 10) and dump again"
    );
    assert_eq!(
        says(DumpError::EndedDuringDump(who(11))),
        "CUDA process 11 (app) ended during the dump (after its lock): the images would miss it, \
         so the dump is abandoned and the other processes' GPU state is put back; find why it \
         ended (its log, the kernel's OOM killer) and restart the job"
    );
}

#[test]
fn checkpoints_that_fail() {
    let failed = |f| {
        says(DumpError::Checkpoints {
            failures: vec![(who(11), f)],
        })
    };
    assert_eq!(
        failed(ActionFailure::Driver(oom(Op::Checkpoint))),
        "checkpoint of CUDA state failed for process 11 (app): cuCheckpointProcessCheckpoint \
         returned CUDA_ERROR_OUT_OF_MEMORY: out of memory (the driver will refuse to checkpoint it \
         again: restart it before its next checkpoint); the dump is abandoned and every CUDA \
         process is being returned to its state before the dump"
    );
    assert_eq!(
        failed(ActionFailure::Stuck {
            limit: Duration::from_secs(1),
        }),
        "checkpoint of CUDA state failed for process 11 (app): the GPU checkpoint did not finish \
         within 1 s (CRIU_GPU_ACTION_TIMEOUT_S); the dump is abandoned and every CUDA process is \
         being returned to its state before the dump"
    );
}

#[test]
fn restores_that_fail_in_the_task() {
    assert_eq!(
        says(RestoreError::Action {
            who: who(11),
            failure: ActionFailure::Driver(oom(Op::Restore)),
        }),
        "restoring CUDA state of process 11 (app) failed: cuCheckpointProcessRestore returned \
         CUDA_ERROR_OUT_OF_MEMORY: out of memory; free GPU memory, or restore onto other GPUs \
         with CRIU_GPU_DEVICE_MAP"
    );
    assert_eq!(
        says(RestoreError::NotInTree {
            ns_pid: 11,
            comm: "app".into(),
        }),
        "CUDA process 11 (app) of the checkpoint is not in the restored tree"
    );
    assert_eq!(
        says(RestoreError::NoDeviceNode {
            who: who(10),
            gpu: GpuUuid([1; 16]),
            minor: 0,
        }),
        "restored process 10 (app) cannot reach GPU GPU-01010101-0101-0101-0101-010101010101: \
         its root file system has no /dev/nvidia0 (a container restored with the device nodes of \
         the GPUs it had before); give the container this GPU when restoring it (CDI: \
         nvidia.com/gpu=GPU-01010101-0101-0101-0101-010101010101, or --device /dev/nvidia0 with \
         /dev/nvidiactl and /dev/nvidia-uvm), or restore onto the GPUs it has with \
         CRIU_GPU_DEVICE_MAP"
    );
}

/// The image crate's words, as the restore's `init` passes them on.
#[test]
fn restores_refused_before_anything_starts() {
    let check = |e| says(RestoreError::Check(e));
    assert_eq!(
        check(CudaCheckError::RecordMissing),
        "the image's inventory says it holds CUDA state (criu_gpu_cuda) but gpu-cuda.json is \
         missing from the image directory: it was not copied completely; copy it again from its \
         source"
    );
    assert_eq!(
        check(CudaCheckError::NoDriver {
            what: "CUDA state of 1 process(es)".into(),
            reason: "libcuda.so.1: cannot open shared object file".into(),
        }),
        "the checkpoint holds CUDA state of 1 process(es), but the CUDA driver cannot be used \
         here: libcuda.so.1: cannot open shared object file; install the NVIDIA driver (r570 or \
         later) or name it with CUDA_CKPT_LIBCUDA=PATH; nothing was restored"
    );
    assert_eq!(
        check(CudaCheckError::Digest(DigestError::Damaged {
            name: "pages-1.img".into(),
        })),
        "the image file pages-1.img is damaged (its contents differ from what the dump wrote): \
         copy the image directory again from its source"
    );
    assert_eq!(
        check(CudaCheckError::Digest(DigestError::Size {
            name: "pages-1.img".into(),
            expected: 4096,
            found: 1000,
        })),
        "the image file pages-1.img is truncated or grown (1000 bytes, the dump wrote 4096): copy \
         the image directory again from its source"
    );
}
