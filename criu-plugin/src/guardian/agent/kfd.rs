//! AMD: the KFD files of the processes whose GPU queues a dump pauses.
//!
//! amdkfd's PROCESS_INFO, which the dump issues from CRIU on the process's KFD file, pauses every
//! GPU queue of the process until an UNPAUSE on that file; if CRIU dies in between, nobody else
//! would ever issue it, and the process, running again on the CPU, waits for its GPU work for
//! good. So the plugin hands the guardian the process's open KFD file before the pause
//! ([`Order::HoldKfd`](crate::guardian::proto::Order::HoldKfd)) and takes it back once it has
//! unpaused the queues itself ([`Order::ReleaseKfd`](crate::guardian::proto::Order::ReleaseKfd)).
//! A file still held when CRIU is gone gets its UNPAUSE from the guardian
//! ([`KfdQueues::unpause`](crate::guardian::machine::KfdQueues::unpause)): harmless on queues
//! that are not paused (the kernel answers EINVAL), and skipped for a process that has exited.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};

use super::vendor::{Ctx, Moment, VendorUndo};
use crate::guardian::machine::Unpaused;
use crate::guardian::proto::{Level, Order};

/// A KFD file the guardian holds for the dump.
struct KfdHold {
    file: OwnedFd,
    starttime: u64,
    comm: String,
}

/// The KFD files of processes whose GPU queues the dump pauses.
pub(super) struct KfdUndo {
    ctx: Ctx,
    kfds: BTreeMap<i32, KfdHold>,
}

impl KfdUndo {
    pub(super) fn new(ctx: Ctx) -> KfdUndo {
        KfdUndo {
            ctx,
            kfds: BTreeMap::new(),
        }
    }

    fn hold(&mut self, pid: i32, starttime: u64, comm: String, files: Vec<OwnedFd>) {
        let Some(file) = files.into_iter().next() else {
            self.ctx.out.log(
                Level::Error,
                format!(
                    "the KFD file of process {pid} ({comm}) did not come with the plugin's \
                     message: if CRIU dies before the dump ends, its GPU queues stay paused"
                ),
            );
            return;
        };
        self.kfds.insert(
            pid,
            KfdHold {
                file,
                starttime,
                comm,
            },
        );
    }

    /// Restarts the GPU queues of every process whose KFD file is still held (CRIU is gone).
    fn unpause_all(&mut self, when: &str) {
        let held = std::mem::take(&mut self.kfds);
        if held.is_empty() {
            return;
        }
        let names: Vec<String> = held
            .iter()
            .map(|(pid, k)| format!("{pid} ({})", k.comm))
            .collect();
        self.ctx.out.log(
            Level::Error,
            format!(
                "CRIU (pid {}) ended {when}; restarting the GPU queues of the ROCm processes {}, \
                 which the dump paused",
                self.ctx.criu_pid,
                names.join(", ")
            ),
        );
        let machine = &self.ctx.machine;
        for (pid, k) in held {
            let result = match machine.alive(pid, k.starttime) {
                false => Ok(Unpaused::Gone),
                true => machine.amd().and_then(|q| q.unpause(pid, k.file.as_fd())),
            };
            let (level, line) = line(pid, &k.comm, &result);
            self.ctx.out.log(level, line);
        }
    }
}

impl VendorUndo for KfdUndo {
    fn take(&mut self, order: Order, files: Vec<OwnedFd>) -> Option<(Order, Vec<OwnedFd>)> {
        match order {
            Order::HoldKfd {
                pid,
                starttime,
                comm,
            } => self.hold(pid, starttime, comm, files),
            Order::ReleaseKfd { pid } => {
                self.kfds.remove(&pid);
            }
            other => return Some((other, files)),
        }
        None
    }

    fn pids(&self) -> Vec<i32> {
        self.kfds.keys().copied().collect()
    }

    fn is_empty(&self) -> bool {
        self.kfds.is_empty()
    }

    fn alive(&self) -> bool {
        self.kfds
            .iter()
            .any(|(p, k)| self.ctx.machine.alive(*p, k.starttime))
    }

    fn settled(&self) -> bool {
        self.kfds.is_empty()
    }

    fn undoes_at(&self, moment: Moment) -> bool {
        match moment {
            // amdkfd takes UNPAUSE only from the process or its tracer, which CRIU still is.
            Moment::Bye => false,
            Moment::RollingBack | Moment::Committed | Moment::Midway => !self.kfds.is_empty(),
        }
    }

    fn undo(&mut self, moment: Moment) {
        self.unpause_all(moment.when());
    }
}

/// The record of one process's UNPAUSE.
fn line(pid: i32, comm: &str, result: &Result<Unpaused, String>) -> (Level, String) {
    match result {
        Ok(Unpaused::Running) => (
            Level::Info,
            format!("process {pid} ({comm}): its GPU queues are running again"),
        ),
        Ok(Unpaused::WasNot) => (
            Level::Info,
            format!("process {pid} ({comm}): its GPU queues were not paused; nothing to restart"),
        ),
        Ok(Unpaused::Gone) => (
            Level::Warn,
            format!("process {pid} ({comm}) has exited; nothing to restart"),
        ),
        Err(e) => (
            Level::Error,
            format!(
                "process {pid} ({comm}): its GPU queues could not be restarted ({e}); they stay \
                 paused and its GPU work waits: restart the process, or restore it from a \
                 checkpoint"
            ),
        ),
    }
}
