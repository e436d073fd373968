//! A restore of an image with ROCm processes.
//!
//! `init`, before CRIU creates anything, checks every KFD image and that this machine's GPUs can
//! take them, and starts the guardian, which kills the half-restored tree if CRIU dies before
//! every ROCm process runs on its GPUs again. RESTORE_EXT_FILE, in the restored process,
//! restores its KFD state and buffers; UPDATE_VMA_MAP moves its device mappings;
//! RESUME_DEVICES_LATE starts it on the GPUs, after which CRIU lets it run.

mod files;

use std::os::fd::OwnedFd;

use amd_kfd::device::Kfd;
use amd_kfd::topology::{Checks, Topology};
use amd_kfd::vma::Remaps;
use criu_gpu_image::amd;

use super::error::AmdError;
use super::Detect;
use crate::core::{kill, Claims, HookResult, Host, Settings, Verdict};
use crate::guardian::proto::{Order, Watch};
use crate::guardian::{Guardian, SpawnGuardian};
use criu_gpu_host::settings::declared::AMD_FD_BASE;

/// How long a process that failed its RESUME gets to die before its reaping is left to CRIU.
const KILLED: std::time::Duration = std::time::Duration::from_secs(5);

pub struct Restore {
    kfd: Box<dyn Kfd>,
    local: Topology,
    checks: Checks,
    /// Fds the restore opens in a restored process start here, above the process's own.
    fd_base: i32,
    /// Processes with KFD state in the images, and how many of them run on their GPUs again.
    images: usize,
    resumed: usize,
    guardian: Option<Guardian>,
    /// In a restored process: where its device mappings go now, and the render nodes its
    /// buffers were created through.
    remaps: Remaps,
    render_fds: Vec<OwnedFd>,
}

impl Restore {
    /// Checks everything now, before CRIU starts creating processes. `None`: the image holds no
    /// AMD state.
    pub fn init(
        host: &dyn Host,
        claims: &Claims,
        settings: &Settings,
        detect: &Detect,
        spawn: &SpawnGuardian,
    ) -> Result<Option<Restore>, AmdError> {
        let Some(dir) = host.image_dir() else {
            return Ok(None);
        };
        let kfd = detect();
        let checks = settings.kfd_checks()?;
        let Some(matched) = amd::check(&dir, claims.ours, kfd.as_deref(), &checks)? else {
            return Ok(None);
        };
        // `check` refuses images without a KFD to restore them on.
        let kfd = kfd.ok_or(amd::AmdCheckError::NoKfd)?;
        log_matches(&matched);
        tracing::info!("AMD GPUs: {}", kfd.describe());
        let local = amd::local_topology(kfd.as_ref())?;
        let fd_base = settings.get(&AMD_FD_BASE)?;
        let guardian = watch_restore(spawn);
        Ok(Some(Restore {
            kfd,
            local,
            checks,
            fd_base,
            images: matched.len(),
            resumed: 0,
            guardian,
            remaps: Remaps::default(),
            render_fds: Vec::new(),
        }))
    }

    /// RESUME_DEVICES_LATE: the process runs on its GPUs again. CRIU ignores this hook's
    /// errors, so a process that cannot is killed (and reaped, as CRIU, its tracer, must):
    /// `criu restore` then fails.
    pub fn resume(&mut self, pid: i32) -> HookResult {
        match self.kfd.resume(pid as u32) {
            Ok(()) => {
                tracing::info!("process {pid} resumed on its AMD GPUs");
                self.resumed += 1;
                if self.resumed == self.images {
                    self.order(&Order::Restored);
                }
                Ok(Verdict::Done(()))
            }
            Err(e) if e.is_no_such_process() => Ok(Verdict::NotMine),
            Err(source) => {
                kill::kill_and_reap(pid, KILLED);
                Err(AmdError::Resume { pid, source }.into())
            }
        }
    }

    /// `exit`: a restore CRIU calls successful has nothing left to undo.
    pub fn exit(&mut self, success: bool) {
        if success && self.resumed < self.images {
            self.order(&Order::Restored);
        }
        self.order(&Order::Bye);
        self.guardian = None;
    }

    fn order(&mut self, o: &Order) {
        if let Some(g) = &mut self.guardian {
            if let Err(e) = g.order(o) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// Where each image's process and GPUs go.
fn log_matches(matched: &[amd::Matched]) {
    for m in matched {
        let gpus: Vec<String> = m
            .gpus
            .iter()
            .map(|(s, d)| format!("{s:#06x}->{d:#06x}"))
            .collect();
        tracing::info!(
            "{}: process {} with {} GPU(s) -> {}",
            m.image,
            m.pid,
            m.gpus.len(),
            gpus.join(" ")
        );
    }
}

/// The guardian that kills a half-restored tree if CRIU dies; a restore goes on without one
/// (it only matters if CRIU dies), with a warning.
fn watch_restore(spawn: &SpawnGuardian) -> Option<Guardian> {
    spawn(Watch::KfdRestore)
        .inspect_err(|e| {
            tracing::warn!("{e}: if CRIU dies half-way, kill what it restored by hand")
        })
        .ok()
}
