//! A dump (or pre-dump) of a tree with ROCm processes.
//!
//! `init` finds the processes of the tree that hold a KFD file and starts the guardian for them.
//! DUMP_EXT_FILE on a KFD file hands the file to the guardian, pauses the process's GPU queues
//! (PROCESS_INFO) and writes its KFD state and buffers into `amdgpu-kfd-<id>.img`. The queues
//! stay paused until the dump ends, so GPU work cannot change memory CRIU is still dumping;
//! `exit` restarts them when the process lives on (`--leave-running`, a failed dump) and
//! otherwise lets CRIU end the process. If CRIU dies first, the guardian restarts them.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

use amd_kfd::device::{self, Kfd};
use criu_gpu_image::amd;
use cuda_checkpoint_ctl::process;

use super::error::{AmdError, Who};
use super::INVENTORY_NAME;
use crate::backends::cuda::SpawnGuardian;
use crate::core::{FinalState, HookResult, Host, Stage, Verdict};
use crate::guardian::proto::{Order, Watch};
use crate::guardian::Guardian;

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

    /// HANDLE_DEVICE_VMA: KFD and render-node mappings are the plugin's (their contents are
    /// GPU buffers, saved with the KFD state).
    pub fn claims_mapping(&self, fd: BorrowedFd<'_>) -> HookResult {
        match self.kfd.is_kfd_file(fd) || self.kfd.render_minor(fd).is_some() {
            true => Ok(Verdict::Done(())),
            false => Ok(Verdict::NotMine),
        }
    }

    /// DUMP_EXT_FILE.
    pub fn dump_file(&mut self, host: &dyn Host, fd: BorrowedFd<'_>, id: u32) -> HookResult {
        if self.kfd.is_kfd_file(fd) {
            self.dump_kfd(host, fd, id)?;
            return Ok(Verdict::Done(()));
        }
        if let Some(minor) = self.kfd.render_minor(fd) {
            write_render(host, minor, id)?;
            return Ok(Verdict::Done(()));
        }
        Ok(Verdict::NotMine)
    }

    /// A process's KFD file: held by the guardian, paused, saved; the queues stay paused.
    fn dump_kfd(&mut self, host: &dyn Host, fd: BorrowedFd<'_>, id: u32) -> Result<(), AmdError> {
        let dir = host.image_dir().ok_or(AmdError::NoImageDir)?;
        let local = amd::local_topology(self.kfd.as_ref()).map_err(AmdError::Topology)?;
        let who = self.owner(host, fd, id)?;
        let file = fd.try_clone_to_owned().map_err(|source| AmdError::Keep {
            who: who.clone(),
            source,
        })?;
        self.hold(&who, fd)?;
        let start = Instant::now();
        let info = match amd_kfd::dump::pause(self.kfd.as_ref(), fd) {
            Ok(info) => info,
            Err(source) => {
                self.link.order(&Order::ReleaseKfd { pid: who.pid });
                return Err(AmdError::Pause { who, source });
            }
        };
        tracing::info!("paused the GPU queues of {who}");
        let saved = amd_kfd::dump::save(self.kfd.as_ref(), fd, &info, id, &dir, &local);
        let d = match saved {
            Ok(d) => d,
            Err(source) => {
                self.unpause(&who, fd);
                return Err(AmdError::Save { who, source });
            }
        };
        tracing::info!(
            "dumped KFD state of process {}: {} GPU(s), {} buffer(s), {:.2} GiB in {:.2} s",
            who.pid,
            d.gpus,
            d.bos,
            d.bytes as f64 / (1u64 << 30) as f64,
            start.elapsed().as_secs_f64()
        );
        self.paused.push(Paused { file, who });
        if !self.required {
            self.required = host.require_on_restore(INVENTORY_NAME);
        }
        Ok(())
    }

    /// The process of the tree that has `fd` open (looked for again among the whole tree if it
    /// opened its KFD file after `init`).
    fn owner(&mut self, host: &dyn Host, fd: BorrowedFd<'_>, id: u32) -> Result<Who, AmdError> {
        let kfd = self.kfd.as_ref();
        let found = |pids: &[i32]| pids.iter().copied().find(|p| device::has_open(kfd, *p, fd));
        let pid = match found(&self.holders) {
            Some(p) => p,
            None => {
                self.holders = self.holders_in(host);
                found(&self.holders).ok_or(AmdError::Unowned { id })?
            }
        };
        Ok(Who::of(pid))
    }

    /// Hands the file to the guardian, which restarts the queues if CRIU dies from now on.
    fn hold(&mut self, who: &Who, fd: BorrowedFd<'_>) -> Result<(), AmdError> {
        let failed = |source| AmdError::Guardian {
            who: who.clone(),
            source,
        };
        let starttime = process::starttime(who.pid).unwrap_or(0);
        let g = self.link.get().map_err(failed)?;
        g.hold_kfd(who.pid, starttime, who.comm.clone(), fd)
            .map_err(failed)
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

/// A render node holds no state of its own here: the restore reopens the GPU's.
fn write_render(host: &dyn Host, minor: u32, id: u32) -> Result<(), AmdError> {
    let dir = host.image_dir().ok_or(AmdError::NoImageDir)?;
    let path: PathBuf = dir.join(format!("amdgpu-render-{id}.txt"));
    std::fs::write(&path, format!("{minor}\n")).map_err(|source| AmdError::Write { path, source })
}
