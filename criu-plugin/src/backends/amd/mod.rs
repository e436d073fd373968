//! AMD ROCm through amdkfd's CRIU ioctl. A dump and a restore are separate types
//! ([`dump::Dump`], [`restore::Restore`]), each holding the KFD it works on.
//!
//! Dump: CRIU hands the plugin each `/dev/kfd` file of a process (DUMP_EXT_FILE); the guardian
//! process ([`crate::guardian`]) is handed the file too, then the process's GPU queues are
//! paused and its state and buffer contents written to `amdgpu-kfd-<id>.img`; device mappings
//! (HANDLE_DEVICE_VMA) are left to the plugin. The queues stay paused until the dump ends;
//! `exit` unpauses them when the process lives on, and the guardian does if CRIU dies first.
//!
//! Restore: `init` checks every KFD image and that this machine's GPUs can take them, before
//! CRIU creates anything; RESTORE_EXT_FILE, in the restored process, restores the KFD state and
//! buffers; UPDATE_VMA_MAP moves the device mappings; RESUME_DEVICES_LATE starts the process on
//! the GPUs, after which CRIU lets it run. The guardian kills the half-restored tree if CRIU dies
//! before that.

// Every function here reads as named steps (clippy.toml: at most 80 lines).
#![warn(clippy::too_many_lines)]

pub mod dump;
pub mod error;
pub mod restore;

use std::os::fd::{BorrowedFd, RawFd};

use std::sync::Arc;

use amd_kfd::device::Kfd;

pub use criu_gpu_image::amd::INVENTORY_NAME;

use crate::core::{Backend, Claims, HookError, HookResult, Host, Settings, Stage, Verdict};
use crate::guardian::SpawnGuardian;

/// Finds this machine's KFD (the kernel's, or the simulated one in test builds).
pub type Detect = Box<dyn Fn() -> Option<Box<dyn Kfd>> + Send>;

enum Session {
    Idle,
    Dump(Box<dump::Dump>),
    Restore(Box<restore::Restore>),
}

pub struct Amd {
    detect: Detect,
    /// The command's settings, read once by the C edge.
    settings: Arc<Settings>,
    spawn: SpawnGuardian,
    session: Session,
}

impl Amd {
    pub fn new(settings: Arc<Settings>, spawn: SpawnGuardian) -> Amd {
        let machine = settings.clone();
        Amd::with(Box::new(move || machine.kfd()), settings, spawn)
    }

    pub fn with(detect: Detect, settings: Arc<Settings>, spawn: SpawnGuardian) -> Amd {
        Amd {
            detect,
            settings,
            spawn,
            session: Session::Idle,
        }
    }
}

impl Backend for Amd {
    fn name(&self) -> &'static str {
        "amd"
    }

    fn inventory_name(&self) -> &'static str {
        INVENTORY_NAME
    }

    fn init(&mut self, host: &dyn Host, stage: Stage, claims: &Claims) -> Result<(), HookError> {
        self.session = match stage {
            Stage::Restore => {
                let settings = &self.settings;
                let r = restore::Restore::init(host, claims, settings, &self.detect, &self.spawn)?;
                r.map_or(Session::Idle, |r| Session::Restore(Box::new(r)))
            }
            Stage::Dump | Stage::PreDump => match (self.detect)() {
                Some(kfd) => {
                    let d = dump::Dump::start(host, stage, kfd, self.spawn.clone());
                    Session::Dump(Box::new(d))
                }
                None => {
                    tracing::debug!("AMD support off: no /dev/kfd");
                    Session::Idle
                }
            },
        };
        Ok(())
    }

    fn exit(&mut self, host: &dyn Host, _stage: Stage, success: bool) {
        match &mut self.session {
            Session::Dump(d) => d.exit(host, success),
            Session::Restore(r) => r.exit(success),
            Session::Idle => {}
        }
        self.session = Session::Idle;
    }

    fn handle_device_vma(&mut self, _host: &dyn Host, fd: BorrowedFd<'_>) -> HookResult {
        match &self.session {
            Session::Dump(d) => d.claims_mapping(fd),
            _ => Ok(Verdict::NotMine),
        }
    }

    fn dump_ext_file(&mut self, host: &dyn Host, fd: BorrowedFd<'_>, id: u32) -> HookResult {
        match &mut self.session {
            Session::Dump(d) => d.dump_file(host, fd, id),
            _ => Ok(Verdict::NotMine),
        }
    }

    fn restore_ext_file(&mut self, host: &dyn Host, id: u32) -> HookResult<RawFd> {
        match &mut self.session {
            Session::Restore(r) => r.restore_file(host, id),
            _ => Ok(Verdict::NotMine),
        }
    }

    fn update_vma_map(
        &mut self,
        _host: &dyn Host,
        path: &str,
        addr: u64,
        old_pgoff: u64,
    ) -> HookResult<(u64, RawFd)> {
        match &self.session {
            Session::Restore(r) => r.update_vma_map(path, addr, old_pgoff),
            _ => Ok(Verdict::NotMine),
        }
    }

    fn resume_devices_late(&mut self, _host: &dyn Host, pid: i32) -> HookResult {
        match &mut self.session {
            Session::Restore(r) => r.resume(pid),
            _ => Ok(Verdict::NotMine),
        }
    }
}

#[cfg(test)]
mod tests;
