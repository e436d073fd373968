//! A restore of an image with ROCm processes.
//!
//! `init`, before CRIU creates anything, checks every KFD image and that this machine's GPUs can
//! take them, and starts the guardian, which kills the half-restored tree if CRIU dies before
//! every ROCm process runs on its GPUs again. RESTORE_EXT_FILE, in the restored process,
//! restores its KFD state and buffers; UPDATE_VMA_MAP moves its device mappings;
//! RESUME_DEVICES_LATE starts it on the GPUs, after which CRIU lets it run.

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Instant;

use amd_kfd::device::Kfd;
use amd_kfd::image::{self, ImageReader};
use amd_kfd::topology::{Checks, Topology};
use amd_kfd::vma::Remaps;
use criu_gpu_image::amd;

use super::error::AmdError;
use super::{Detect, FD_BASE, FD_BASE_KEY};
use crate::backends::cuda::SpawnGuardian;
use crate::core::{kill, Claims, HookResult, Host, Settings, Verdict};
use crate::guardian::proto::{Order, Watch};
use crate::guardian::Guardian;

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
        let Some(matched) = amd::check(&dir, claims.ours, kfd.as_deref(), settings)? else {
            return Ok(None);
        };
        // `check` refuses images without a KFD to restore them on.
        let kfd = kfd.ok_or(amd::AmdCheckError::NoKfd)?;
        for m in &matched {
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
        tracing::info!("AMD GPUs: {}", kfd.describe());
        let local = amd::local_topology(kfd.as_ref())?;
        let checks = amd::checks(settings)?;
        let fd_base = settings
            .parsed(FD_BASE_KEY, parse_fd_base)?
            .unwrap_or(FD_BASE);
        let guardian = spawn(Watch::KfdRestore)
            .inspect_err(|e| {
                tracing::warn!("{e}: if CRIU dies half-way, kill what it restored by hand")
            })
            .ok();
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

    /// RESTORE_EXT_FILE, in the restored process: its KFD file, or a render node.
    pub fn restore_file(&mut self, host: &dyn Host, id: u32) -> HookResult<RawFd> {
        let Some(dir) = host.image_dir() else {
            return Ok(Verdict::NotMine);
        };
        let kfd_image = dir.join(image::file_name(id));
        if kfd_image.exists() {
            return Ok(Verdict::Done(self.restore_kfd(&kfd_image)?));
        }
        let render = dir.join(format!("amdgpu-render-{id}.txt"));
        match std::fs::read_to_string(&render) {
            Ok(text) => Ok(Verdict::Done(self.open_render(&render, &text)?)),
            Err(_) => Ok(Verdict::NotMine),
        }
    }

    fn restore_kfd(&mut self, path: &Path) -> Result<RawFd, AmdError> {
        let failed = |source| AmdError::Restore {
            image: path.display().to_string(),
            source,
        };
        let img = ImageReader::open(path).map_err(|e| failed(e.into()))?;
        let start = Instant::now();
        let kfd = self.kfd.as_ref();
        let r = amd_kfd::restore::restore(kfd, &img, &self.local, &self.checks, self.fd_base)
            .map_err(failed)?;
        tracing::info!(
            "restored KFD state of process {} ({:.2} GiB of buffers) in {:.2} s",
            img.meta.pid,
            r.bytes as f64 / (1u64 << 30) as f64,
            start.elapsed().as_secs_f64()
        );
        self.remaps.0.extend(r.remaps.0);
        self.render_fds.extend(r.render_fds);
        Ok(r.fd.into_raw_fd())
    }

    fn open_render(&self, path: &Path, text: &str) -> Result<RawFd, AmdError> {
        let minor: u32 = text.trim().parse().map_err(|_| AmdError::RenderImage {
            path: path.to_path_buf(),
            text: text.to_owned(),
        })?;
        let fd = self
            .kfd
            .open_render(minor, 3)
            .map_err(|source| AmdError::RenderNode { minor, source })?;
        Ok(fd.into_raw_fd())
    }

    /// UPDATE_VMA_MAP: the new offset of a device mapping, and the render node to map it
    /// through (CRIU takes over the fd: it gets a duplicate).
    pub fn update_vma_map(&self, path: &str, addr: u64, old: u64) -> HookResult<(u64, RawFd)> {
        let Some(r) = self.remaps.lookup(path, addr, old) else {
            return Ok(Verdict::NotMine);
        };
        let render = r
            .render_fd
            .and_then(|fd| self.render_fds.iter().find(|f| f.as_raw_fd() == fd));
        let fd = match render {
            Some(f) => f
                .try_clone()
                .map_err(|source| AmdError::Dup { addr, source })?
                .into_raw_fd(),
            None => -1,
        };
        Ok(Verdict::Done((r.new_offset, fd)))
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

fn parse_fd_base(v: &str) -> Result<i32, &'static str> {
    v.parse()
        .ok()
        .filter(|n| (3..=1 << 20).contains(n))
        .ok_or("expected an fd number from 3 to 1048576")
}
