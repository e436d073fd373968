//! AMD ROCm through amdkfd's CRIU ioctl.
//!
//! Dump: CRIU hands the plugin each `/dev/kfd` file of a process (DUMP_EXT_FILE): its queues
//! are paused, its state and buffer contents written to `amdgpu-kfd-<id>.img`; device mappings
//! (HANDLE_DEVICE_VMA) are left to the plugin. The queues stay paused until the dump ends, so
//! GPU work cannot change memory CRIU is still dumping; `exit` unpauses them when the process
//! lives on (or the dump failed).
//!
//! Restore: `init` checks every KFD image and that this machine's GPUs can take them, before
//! CRIU creates anything; RESTORE_EXT_FILE, in the restored process, restores the KFD state and
//! buffers; UPDATE_VMA_MAP moves the device mappings; RESUME_DEVICES_LATE starts the process on
//! the GPUs, after which CRIU lets it run.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Instant;

use amd_kfd::device::{self, Kfd};
use amd_kfd::image::{self, ImageReader};
use amd_kfd::vma::Remaps;
use criu_gpu_image::amd;

use crate::core::{Backend, Claims, FinalState, HookError, HookResult, Host, Stage, Verdict};

pub use criu_gpu_image::amd::INVENTORY_NAME;
/// Fds the restore opens in the restored process start here, above the process's own.
const FD_BASE_ENV: &str = "CRIU_GPU_AMD_FD_BASE";
const FD_BASE: i32 = 512;

/// A KFD file whose queues this dump paused.
struct Paused {
    fd: OwnedFd,
    pid: u32,
}

pub type Detect = Box<dyn Fn() -> Option<Box<dyn Kfd>> + Send>;

pub struct Amd {
    stage: Stage,
    detect: Detect,
    kfd: Option<Box<dyn Kfd>>,
    paused: Vec<Paused>,
    required: bool,
    /// Restore, inside a restored process: where its device mappings go now.
    remaps: Remaps,
    render_fds: Vec<OwnedFd>,
}

fn msg(text: &str) -> HookError {
    HookError::Backend(text.to_owned())
}

fn err(e: impl std::fmt::Display) -> HookError {
    HookError::Backend(e.to_string())
}

impl Amd {
    pub fn new() -> Amd {
        Amd::with_detect(Box::new(device::detect))
    }

    pub fn with_detect(detect: Detect) -> Amd {
        Amd {
            stage: Stage::Dump,
            detect,
            kfd: None,
            paused: Vec::new(),
            required: false,
            remaps: Remaps::default(),
            render_fds: Vec::new(),
        }
    }

    fn init_restore(&mut self, host: &dyn Host, claims: &Claims) -> Result<(), HookError> {
        let Some(dir) = host.image_dir() else {
            return Ok(());
        };
        // Check everything now, before CRIU starts creating processes.
        let kfd = (self.detect)();
        let Some(matched) = amd::check(&dir, claims.ours, kfd.as_deref()).map_err(err)? else {
            return Ok(());
        };
        for m in &matched {
            tracing::info!(
                "{}: process {} with {} GPU(s) -> {}",
                m.image,
                m.pid,
                m.gpus.len(),
                m.gpus
                    .iter()
                    .map(|(s, d)| format!("{s:#06x}->{d:#06x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        if let Some(k) = &kfd {
            tracing::info!("AMD GPUs: {}", k.describe());
        }
        self.kfd = kfd;
        Ok(())
    }

    fn dump_kfd(&mut self, host: &dyn Host, fd: BorrowedFd<'_>, id: u32) -> HookResult {
        let kfd = self.kfd.as_deref().expect("checked");
        let dir = host
            .image_dir()
            .ok_or_else(|| msg("CRIU's image directory is not available"))?;
        let local = amd::local_topology(kfd).map_err(err)?;
        let start = Instant::now();
        let d = amd_kfd::dump::dump(kfd, fd, id, &dir, &local).map_err(|e| {
            HookError::Backend(format!(
                "dumping the KFD state (file {id}): {e}; the dump is abandoned"
            ))
        })?;
        tracing::info!(
            "dumped KFD state of process {}: {} GPU(s), {} buffer(s), {:.2} GiB in {:.2} s",
            d.pid,
            d.gpus,
            d.bos,
            d.bytes as f64 / (1u64 << 30) as f64,
            start.elapsed().as_secs_f64()
        );
        let keep = fd
            .try_clone_to_owned()
            .map_err(|e| HookError::Backend(format!("keeping the KFD file: {e}")))?;
        self.paused.push(Paused {
            fd: keep,
            pid: d.pid,
        });
        if !self.required {
            self.required = host.require_on_restore(INVENTORY_NAME);
        }
        Ok(Verdict::Done(()))
    }

    fn restore_kfd(&mut self, path: &Path) -> HookResult<RawFd> {
        let kfd = self.kfd.as_deref().expect("checked");
        let img = ImageReader::open(path).map_err(err)?;
        let local = amd::local_topology(kfd).map_err(err)?;
        let base = std::env::var(FD_BASE_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(FD_BASE);
        let start = Instant::now();
        let r = amd_kfd::restore::restore(kfd, &img, &local, &amd::checks().map_err(err)?, base)
            .map_err(|e| HookError::Backend(format!("restoring {}: {e}", path.display())))?;
        tracing::info!(
            "restored KFD state of process {} ({:.2} GiB of buffers) in {:.2} s",
            img.meta.pid,
            r.bytes as f64 / (1u64 << 30) as f64,
            start.elapsed().as_secs_f64()
        );
        self.remaps.0.extend(r.remaps.0);
        self.render_fds.extend(r.render_fds);
        Ok(Verdict::Done(r.fd.into_raw_fd()))
    }
}

impl Default for Amd {
    fn default() -> Self {
        Amd::new()
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
        self.stage = stage;
        if stage == Stage::Restore {
            return self.init_restore(host, claims);
        }
        self.kfd = (self.detect)();
        match &self.kfd {
            Some(k) => tracing::info!("AMD GPUs: {}", k.describe()),
            None => tracing::debug!("AMD support off: no /dev/kfd"),
        }
        Ok(())
    }

    fn exit(&mut self, host: &dyn Host, stage: Stage, success: bool) {
        if stage != Stage::Dump || self.paused.is_empty() {
            return;
        }
        let lives_on = !success || host.final_state() != Some(FinalState::Dead);
        let kfd = self.kfd.as_deref().expect("paused implies a KFD");
        for p in self.paused.drain(..) {
            if lives_on {
                match kfd.unpause(p.fd.as_fd()) {
                    Ok(()) => tracing::info!("KFD queues of process {} running again", p.pid),
                    Err(e) => tracing::error!("process {}: {e}; its GPU queues stay paused", p.pid),
                }
            }
        }
    }

    fn handle_device_vma(&mut self, _host: &dyn Host, fd: BorrowedFd<'_>) -> HookResult {
        match &self.kfd {
            Some(k) if k.is_kfd_file(fd) || k.render_minor(fd).is_some() => Ok(Verdict::Done(())),
            _ => Ok(Verdict::NotMine),
        }
    }

    fn dump_ext_file(&mut self, host: &dyn Host, fd: BorrowedFd<'_>, id: u32) -> HookResult {
        let Some(kfd) = self.kfd.as_deref() else {
            return Ok(Verdict::NotMine);
        };
        if kfd.is_kfd_file(fd) {
            return self.dump_kfd(host, fd, id);
        }
        if let Some(minor) = kfd.render_minor(fd) {
            // A render node holds no state of its own here; restore reopens it.
            let dir = host
                .image_dir()
                .ok_or_else(|| msg("CRIU's image directory is not available"))?;
            std::fs::write(
                dir.join(format!("amdgpu-render-{id}.txt")),
                format!("{minor}\n"),
            )
            .map_err(err)?;
            return Ok(Verdict::Done(()));
        }
        Ok(Verdict::NotMine)
    }

    fn restore_ext_file(&mut self, host: &dyn Host, id: u32) -> HookResult<RawFd> {
        if self.kfd.is_none() {
            return Ok(Verdict::NotMine);
        }
        let Some(dir) = host.image_dir() else {
            return Ok(Verdict::NotMine);
        };
        let kfd_image = dir.join(image::file_name(id));
        if kfd_image.exists() {
            return self.restore_kfd(&kfd_image);
        }
        let render = dir.join(format!("amdgpu-render-{id}.txt"));
        if let Ok(text) = std::fs::read_to_string(&render) {
            let minor: u32 = text.trim().parse().map_err(|_| {
                HookError::Backend(format!("{}: not a render minor", render.display()))
            })?;
            let fd = self
                .kfd
                .as_deref()
                .expect("checked")
                .open_render(minor, 3)
                .map_err(err)?;
            return Ok(Verdict::Done(fd.into_raw_fd()));
        }
        Ok(Verdict::NotMine)
    }

    fn update_vma_map(
        &mut self,
        _host: &dyn Host,
        path: &str,
        addr: u64,
        old_pgoff: u64,
    ) -> HookResult<(u64, RawFd)> {
        let Some(r) = self.remaps.lookup(path, addr, old_pgoff) else {
            return Ok(Verdict::NotMine);
        };
        // CRIU takes ownership of the fd it is given: hand it a duplicate.
        let fd = match r.render_fd {
            Some(fd) => self
                .render_fds
                .iter()
                .find(|f| f.as_raw_fd() == fd)
                .map(|f| f.try_clone().map(IntoRawFd::into_raw_fd))
                .transpose()
                .map_err(err)?
                .unwrap_or(-1),
            None => -1,
        };
        Ok(Verdict::Done((r.new_offset, fd)))
    }

    fn resume_devices_late(&mut self, _host: &dyn Host, pid: i32) -> HookResult {
        let Some(kfd) = self.kfd.as_deref() else {
            return Ok(Verdict::NotMine);
        };
        match kfd.resume(pid as u32) {
            Ok(()) => {
                tracing::info!("process {pid} resumed on its AMD GPUs");
                Ok(Verdict::Done(()))
            }
            Err(e) if e.is_no_such_process() => Ok(Verdict::NotMine),
            Err(e) => {
                // CRIU ignores this hook's errors: end the process so the restore fails (and
                // reap what CRIU, its tracer, must reap: core::kill).
                crate::core::kill::kill_and_reap(pid, std::time::Duration::from_secs(5));
                Err(HookError::Backend(format!(
                    "resuming process {pid} on its GPUs failed ({e}); it was killed so that criu \
                     reports the failure: the images are unchanged"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests;
