//! RESTORE_EXT_FILE and UPDATE_VMA_MAP, in a restored process: its KFD state and buffers, its
//! render nodes, and where its device mappings go now.

use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::path::Path;
use std::time::Instant;

use amd_kfd::image::{self, ImageReader};

use super::Restore;
use crate::backends::amd::error::AmdError;
use crate::core::{HookResult, Host, Verdict};

impl Restore {
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
            process_facts::units::gib(r.bytes),
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
}
