//! What the plugin (inside CRIU) and its guardian process say to each other: one JSON message per
//! datagram of a SOCK_SEQPACKET socketpair; an order about a file carries the file with it
//! (SCM_RIGHTS).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use criu_gpu_host::thp::{Raised, Want};
use criu_gpu_image::digest::FileDigest;
use cuda_checkpoint_ctl::driver::{code, DriverInfo, GpuUuid, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;
use serde::{Deserialize, Serialize};

/// The largest message either side sends (an inventory of many GPUs is a few KiB).
pub const MAX_MESSAGE: usize = 1 << 20;

/// Which CRIU command a guardian watches, and for which backend: what it undoes if CRIU dies
/// half-way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Watch {
    /// A dump (or pre-dump) of CUDA processes: they go back to their state before the dump.
    Dump,
    /// A restore of CUDA processes: a half-restored tree is killed.
    Restore,
    /// A dump of ROCm processes: the KFD files the plugin hands over ([`Order::HoldKfd`]) get
    /// their GPU queues restarted. No CUDA driver is loaded.
    KfdDump,
    /// A restore of ROCm processes: a half-restored tree is killed. No CUDA driver is loaded.
    KfdRestore,
}

impl Watch {
    /// A restore (else a dump).
    pub fn restore(self) -> bool {
        matches!(self, Watch::Restore | Watch::KfdRestore)
    }

    /// The guardian loads the CUDA driver (its greeting names it).
    pub fn cuda(self) -> bool {
        matches!(self, Watch::Dump | Watch::Restore)
    }
}

/// The plugin to the guardian.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Order {
    /// Journal a process before any driver call on it; its first `Probe` records the state to
    /// bring it back to.
    Track {
        pid: i32,
        starttime: u64,
        comm: String,
    },
    /// A driver call on a tracked process, run after the process's earlier ones.
    Act {
        seq: u64,
        pid: i32,
        act: Act,
    },
    /// NVML's view of the machine.
    Inventory {
        seq: u64,
    },
    /// Return every tracked process to its state before the dump; answered by `Settled`.
    RollBack,
    /// The dump succeeded and CRIU kills the tasks: any still alive once CRIU is gone (a failed
    /// post-dump script resumes them) is rolled back.
    Commit,
    /// Restore: these processes are the restored tree (killed if CRIU dies before `Restored`).
    Restoring {
        tree: Vec<(i32, u64)>,
    },
    /// Restore: the pids the image's processes will have (when CRIU restores into this pid
    /// namespace); those that appear after the guardian started are the restored tree too.
    Expect {
        pids: Vec<i32>,
    },
    /// Restore: the GPU state of the tree is back; nothing to undo any more.
    Restored,
    /// Raise the node's transparent huge page policy for a GPU checkpoint; answered by `Thp`.
    /// Put back by `LowerThp`, or by the guardian when it ends, whatever ends it.
    RaiseThp {
        seq: u64,
        want: Want,
    },
    LowerThp,
    /// Check the contents of these image files against their digests (large pages images,
    /// while the restore reads them); answered by `Verified`.
    Verify {
        seq: u64,
        files: Vec<FileDigest>,
    },
    /// AMD: process `pid`'s KFD file (it comes with the message), whose GPU queues the plugin
    /// is about to pause. If CRIU ends before [`Order::ReleaseKfd`], the guardian restarts them.
    HoldKfd {
        pid: i32,
        starttime: u64,
        comm: String,
    },
    /// AMD: the plugin restarted the queues of `pid` itself: the guardian lets go of its file.
    ReleaseKfd {
        pid: i32,
    },
    /// The plugin's `exit` is done: the guardian ends once nothing is left for it to watch.
    Bye,
}

/// Driver calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Act {
    /// The driver's restore thread: whether the process has CUDA state at all. Answers at once
    /// (measured), unlike `State`, which needs that thread to run.
    Probe,
    Lock {
        timeout_ms: u32,
    },
    Checkpoint,
    /// Unlock a process locked by this dump (a round of locks that did not lock every process).
    Unlock,
    /// Restore (onto the GPUs of `pairs`, empty: the same ones), then unlock if asked.
    Resume {
        pairs: Vec<(GpuUuid, GpuUuid)>,
        unlock: bool,
    },
    State,
}

/// The guardian to the plugin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Report {
    /// First message: the driver as the guardian loaded it.
    Hello { driver: Result<DriverInfo, String> },
    Done {
        seq: u64,
        pid: i32,
        result: Result<Answer, DriverFailure>,
    },
    Inventory {
        seq: u64,
        inventory: Result<Inventory, String>,
    },
    /// A line for CRIU's log, written by the plugin on CRIU's thread.
    Log { level: Level, text: String },
    /// The outcome of a `RollBack`, one per tracked process.
    Settled { outcomes: Vec<Outcome> },
    Thp {
        seq: u64,
        result: Result<Raised, String>,
    },
    Verified {
        seq: u64,
        result: Result<(), String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// The driver's restore thread.
    Thread(i32),
    State(ProcessState),
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Probe,
    Lock,
    Checkpoint,
    Restore,
    Unlock,
    State,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Probe => "cuCheckpointProcessGetRestoreThreadId",
            Op::Lock => "cuCheckpointProcessLock",
            Op::Checkpoint => "cuCheckpointProcessCheckpoint",
            Op::Restore => "cuCheckpointProcessRestore",
            Op::Unlock => "cuCheckpointProcessUnlock",
            Op::State => "cuCheckpointProcessGetState",
        })
    }
}

/// A failed driver call, as the driver named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{op} returned {name}: {description}")]
pub struct DriverFailure {
    pub op: Op,
    pub code: u32,
    pub name: String,
    pub description: String,
}

impl DriverFailure {
    /// The process holds no CUDA state (or is gone): not a failure of a CUDA process.
    pub fn not_cuda(&self) -> bool {
        matches!(
            self.code,
            code::NOT_INITIALIZED | code::NOT_FOUND | code::OPERATING_SYSTEM
        )
    }

    /// A lock that gave up waiting for submitted GPU work (r580 answers NOT_READY; TIMEOUT is
    /// what the CUDA headers suggest and older drivers may use).
    pub fn lock_gave_up(&self) -> bool {
        self.op == Op::Lock && matches!(self.code, 600 | code::TIMEOUT)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub pid: i32,
    pub comm: String,
    pub result: Result<Returned, NotReturned>,
}

/// Why a process could not be returned to its state before the dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotReturned {
    /// The driver reports its GPU state failed: nothing brings it back.
    Lost,
    /// The driver's or the machine's words; `cuda-checkpoint-ctl --recover` may finish the job.
    Other(String),
}

impl From<String> for NotReturned {
    fn from(e: String) -> NotReturned {
        NotReturned::Other(e)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Returned {
    /// Back in its state before the dump (the state is given).
    To(ProcessState),
    /// It exited: nothing to return.
    Gone,
    /// Nothing was ever done to it.
    Untouched,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

/// Sends one message; `false` if the peer is gone.
pub fn send<T: Serialize>(fd: impl AsFd, msg: &T) -> bool {
    let Ok(bytes) = serde_json::to_vec(msg) else {
        return false;
    };
    loop {
        match rustix::net::send(&fd, &bytes, rustix::net::SendFlags::NOSIGNAL) {
            Ok(_) => return true,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Sends one message with a file; `false` if the peer is gone. The peer holds the file from the
/// moment this returns: a message queued on its end is read also after this process died.
pub fn send_with_fd<T: Serialize>(fd: impl AsFd, msg: &T, file: BorrowedFd<'_>) -> bool {
    let Ok(bytes) = serde_json::to_vec(msg) else {
        return false;
    };
    let files = [file];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    if !control.push(rustix::net::SendAncillaryMessage::ScmRights(&files)) {
        return false;
    }
    loop {
        match rustix::net::sendmsg(
            &fd,
            &[IoSlice::new(&bytes)],
            &mut control,
            rustix::net::SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return true,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

/// The most files one message carries.
const MAX_FILES: usize = 4;

/// Receives one message and the files that came with it: `Ok(None)` when the peer closed its
/// end. Files are taken whatever the message (a plain `recv` would close them).
pub fn recv_with_files<T: for<'de> Deserialize<'de>>(
    fd: impl AsFd,
    buf: &mut [u8],
) -> std::io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FILES))];
    loop {
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &fd,
            &mut [IoSliceMut::new(&mut *buf)],
            &mut control,
            rustix::net::RecvFlags::CMSG_CLOEXEC,
        );
        let n = match got {
            Ok(r) => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut files = Vec::new();
        for m in control.drain() {
            if let rustix::net::RecvAncillaryMessage::ScmRights(fds) = m {
                files.extend(fds);
            }
        }
        if n == 0 && files.is_empty() {
            return Ok(None);
        }
        return serde_json::from_slice(&buf[..n.min(buf.len())])
            .map(|m| Some((m, files)))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e));
    }
}

/// Receives one message: `Ok(None)` when the peer closed its end.
pub fn recv<T: for<'de> Deserialize<'de>>(
    fd: impl AsFd,
    buf: &mut [u8],
) -> std::io::Result<Option<T>> {
    loop {
        match rustix::net::recv(&fd, &mut *buf, rustix::net::RecvFlags::empty()) {
            Ok((0, _)) => return Ok(None),
            Ok((n, _)) => {
                return serde_json::from_slice(&buf[..n])
                    .map(Some)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
