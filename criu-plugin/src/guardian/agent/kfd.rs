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

use std::os::fd::{AsFd, OwnedFd};

use super::Agent;
use crate::guardian::machine::Unpaused;
use crate::guardian::proto::Level;

/// A KFD file the guardian holds for the dump.
pub(super) struct KfdHold {
    file: OwnedFd,
    pub(super) starttime: u64,
    comm: String,
}

impl Agent {
    pub(super) fn hold_kfd(&mut self, pid: i32, starttime: u64, comm: String, files: Vec<OwnedFd>) {
        let Some(file) = files.into_iter().next() else {
            self.out.log(
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

    pub(super) fn release_kfd(&mut self, pid: i32) {
        self.kfds.remove(&pid);
    }

    /// Restarts the GPU queues of every process whose KFD file is still held (CRIU is gone).
    pub(super) fn unpause_kfds(&mut self, when: &str) {
        let held = std::mem::take(&mut self.kfds);
        if held.is_empty() {
            return;
        }
        let names: Vec<String> = held
            .iter()
            .map(|(pid, k)| format!("{pid} ({})", k.comm))
            .collect();
        self.out.log(
            Level::Error,
            format!(
                "CRIU (pid {}) ended {when}; restarting the GPU queues of the ROCm processes {}, \
                 which the dump paused",
                self.criu_pid,
                names.join(", ")
            ),
        );
        for (pid, k) in held {
            let result = match self.machine.alive(pid, k.starttime) {
                false => Ok(Unpaused::Gone),
                true => self
                    .machine
                    .amd()
                    .and_then(|q| q.unpause(pid, k.file.as_fd())),
            };
            let (level, line) = line(pid, &k.comm, &result);
            self.out.log(level, line);
        }
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
