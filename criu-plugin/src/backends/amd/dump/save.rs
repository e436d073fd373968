//! DUMP_EXT_FILE and HANDLE_DEVICE_VMA: a process's KFD file is handed to the guardian, its GPU
//! queues paused and its state saved; a render node is recorded by its minor.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use amd_kfd::device::{self, ProcessInfo};
use amd_kfd::topology::Topology;
use criu_gpu_image::amd;
use process_facts::process;

use super::{Dump, Paused};
use crate::backends::amd::error::{AmdError, Who};
use crate::backends::amd::INVENTORY_NAME;
use crate::core::{HookResult, Host, Verdict};
use crate::guardian::proto::Order;

impl Dump {
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
        let file = keep(&who, fd)?;
        self.hold(&who, fd)?;
        let info = self.pause(&who, fd)?;
        self.save(&who, fd, &info, id, &dir, &local)?;
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

    /// PROCESS_INFO, which pauses the queues; on failure the guardian lets go of the file.
    fn pause(&mut self, who: &Who, fd: BorrowedFd<'_>) -> Result<ProcessInfo, AmdError> {
        match amd_kfd::dump::pause(self.kfd.as_ref(), fd) {
            Ok(info) => {
                tracing::info!("paused the GPU queues of {who}");
                Ok(info)
            }
            Err(source) => {
                self.link.order(&Order::ReleaseKfd { pid: who.pid });
                Err(AmdError::Pause {
                    who: who.clone(),
                    source,
                })
            }
        }
    }

    /// Writes the KFD state and buffers; on failure the queues run again.
    fn save(
        &mut self,
        who: &Who,
        fd: BorrowedFd<'_>,
        info: &ProcessInfo,
        id: u32,
        dir: &Path,
        local: &Topology,
    ) -> Result<(), AmdError> {
        let start = Instant::now();
        let d = match amd_kfd::dump::save(self.kfd.as_ref(), fd, info, id, dir, local) {
            Ok(d) => d,
            Err(source) => {
                self.unpause(who, fd);
                return Err(AmdError::Save {
                    who: who.clone(),
                    source,
                });
            }
        };
        tracing::info!(
            "dumped KFD state of process {}: {} GPU(s), {} buffer(s), {:.2} GiB in {:.2} s",
            who.pid,
            d.gpus,
            d.bos,
            process_facts::units::gib(d.bytes),
            start.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// CRIU's copy of the file, kept so that `exit` can unpause through it.
fn keep(who: &Who, fd: BorrowedFd<'_>) -> Result<OwnedFd, AmdError> {
    fd.try_clone_to_owned().map_err(|source| AmdError::Keep {
        who: who.clone(),
        source,
    })
}

/// A render node holds no state of its own here: the restore reopens the GPU's.
fn write_render(host: &dyn Host, minor: u32, id: u32) -> Result<(), AmdError> {
    let dir = host.image_dir().ok_or(AmdError::NoImageDir)?;
    let path: PathBuf = dir.join(format!("amdgpu-render-{id}.txt"));
    std::fs::write(&path, format!("{minor}\n")).map_err(|source| AmdError::Write { path, source })
}
