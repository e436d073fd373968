//! A dump (or pre-dump) of a tree with ROCm processes.
//!
//! `init` finds the processes of the tree that hold a KFD file and starts the guardian for them.
//! DUMP_EXT_FILE on a KFD file hands the file to the guardian, pauses the process's GPU queues
//! (PROCESS_INFO) and writes its KFD state and buffers into `amdgpu-kfd-<id>.img`. The queues
//! stay paused until the dump ends, so GPU work cannot change memory CRIU is still dumping;
//! `exit` restarts them when the process lives on (`--leave-running`, a failed dump) and
//! otherwise lets CRIU end the process. If CRIU dies first, the guardian restarts them.

mod save;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use amd_kfd::device::{self, Kfd};
use process_facts::process;

use super::error::Who;
use crate::core::{FinalState, Host, Stage};
use crate::guardian::proto::{Order, Watch};
use crate::guardian::{Guardian, SpawnGuardian};

/// A KFD file whose queues this dump paused (CRIU's copy, kept until `exit`).
struct Paused {
    file: OwnedFd,
    who: Who,
}

/// The guardian, started for a tree with KFD files.
struct Link {
    spawn: SpawnGuardian,
    guardian: Option<Guardian>,
}

impl Link {
    fn get(&mut self) -> Result<&mut Guardian, crate::guardian::GuardianError> {
        let g = match self.guardian.take() {
            Some(g) => g,
            None => (self.spawn)(Watch::KfdDump)?,
        };
        Ok(self.guardian.insert(g))
    }

    fn order(&mut self, o: &Order) {
        if let Some(g) = &mut self.guardian {
            if let Err(e) = g.order(o) {
                tracing::warn!("{e}");
            }
        }
    }
}

pub struct Dump {
    kfd: Box<dyn Kfd>,
    link: Link,
    /// The processes of the tree that held a KFD file at `init`.
    holders: Vec<i32>,
    paused: Vec<Paused>,
    required: bool,
}

impl Dump {
    /// Called from `init`. When the tree holds KFD files, starts the guardian now, while CRIU
    /// runs one thread (a fork needs that; its page writers may run by DUMP_EXT_FILE).
    pub fn start(host: &dyn Host, stage: Stage, kfd: Box<dyn Kfd>, spawn: SpawnGuardian) -> Dump {
        tracing::info!("AMD GPUs: {}", kfd.describe());
        let mut d = Dump {
            kfd,
            link: Link {
                spawn,
                guardian: None,
            },
            holders: Vec::new(),
            paused: Vec::new(),
            required: false,
        };
        // A pre-dump dumps no files: nothing is paused.
        if stage != Stage::Dump {
            return d;
        }
        d.holders = d.holders_in(host);
        if !d.holders.is_empty() {
            if let Err(e) = d.link.get() {
                // Said again, naming the process, at its KFD file.
                tracing::debug!("{e}");
            }
        }
        d
    }

    /// The processes of the dumped tree that hold a KFD file.
    fn holders_in(&self, host: &dyn Host) -> Vec<i32> {
        let Some(root) = host.dump_root() else {
            return Vec::new();
        };
        process::tree(root)
            .into_iter()
            .filter(|p| device::holds_kfd(self.kfd.as_ref(), *p))
            .collect()
    }

    /// UNPAUSE from CRIU (the process's tracer); the guardian lets go of the file once it took.
    fn unpause(&mut self, who: &Who, fd: BorrowedFd<'_>) {
        match self.kfd.unpause(fd) {
            Ok(()) => tracing::info!("the GPU queues of {who} run again"),
            Err(e) if e.errno == Some(libc::EINVAL) => {
                tracing::debug!("the GPU queues of {who} were not paused")
            }
            Err(e) => {
                let by = self.link.guardian.as_ref().map_or(0, Guardian::pid);
                tracing::error!(
                    "restarting the GPU queues of {who} failed ({e}); the guardian (pid {by}) \
                     restarts them once CRIU has let the process go"
                );
                return;
            }
        }
        self.link.order(&Order::ReleaseKfd { pid: who.pid });
    }

    /// `exit`: restarts the queues of processes that live on; the others end with the dump.
    pub fn exit(&mut self, host: &dyn Host, success: bool) {
        let paused = std::mem::take(&mut self.paused);
        let lives_on = !success || host.final_state() != Some(FinalState::Dead);
        if lives_on {
            for p in &paused {
                self.unpause(&p.who, p.file.as_fd());
            }
        } else if !paused.is_empty() {
            tracing::info!(
                "dump done; the ROCm processes end with the tree, their GPU state is in the images"
            );
            // Any still alive once CRIU is gone (a failed post-dump script) is restarted.
            self.link.order(&Order::Commit);
        }
        self.link.order(&Order::Bye);
        self.link.guardian = None;
    }
}
