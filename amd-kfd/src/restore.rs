//! RESTORE_EXT_FILE for a KFD file, in the restored process: match the checkpoint's GPUs to
//! this machine's, open a KFD file and a render node per GPU, RESTORE, copy the buffers back
//! (checking every checksum), and note where device mappings moved.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use crate::device::{Kfd, KfdError};
use crate::image::{ImageError, ImageReader};
use crate::topology::{map_gpus, Checks, MatchError, Topology};
use crate::uapi::{alloc, BoBucket, DeviceBucket, INVALID_FD, KFD_MAJOR, KFD_MIN_MINOR};
use crate::vma::{Remap, Remaps};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Kfd(#[from] KfdError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("cannot restore the process's GPUs here: {0}")]
    Match(#[from] MatchError),
    #[error(
        "KFD ioctl version {0}.{1} here; the restore needs {KFD_MAJOR}.{KFD_MIN_MINOR} or later"
    )]
    Version(u32, u32),
    #[error(
        "GPU {0:#06x} of the image's process is not among its GPUs (a damaged image?): the \
         checkpoint cannot be restored"
    )]
    Unmapped(u32),
}

/// A restored KFD file and what UPDATE_VMA_MAP needs later.
pub struct Restored {
    pub fd: OwnedFd,
    /// Render nodes opened for the GPUs (kept open: the buffers were created through them).
    pub render_fds: Vec<OwnedFd>,
    pub remaps: Remaps,
    /// Checkpoint gpu_id -> local gpu_id.
    pub gpus: BTreeMap<u32, u32>,
    pub bytes: u64,
}

/// Restores the image into the calling process. Fds it opens get numbers >= `min_fd`, above
/// those CRIU will give the process's own files.
pub fn restore(
    kfd: &dyn Kfd,
    image: &ImageReader,
    local: &Topology,
    checks: &Checks,
    min_fd: i32,
) -> Result<Restored, RestoreError> {
    let (major, minor) = kfd.version()?;
    if major != KFD_MAJOR || minor < KFD_MIN_MINOR {
        return Err(RestoreError::Version(major, minor));
    }
    let meta = &image.meta;
    let map = map_gpus(&meta.topology, local, checks)?;
    let mut render_fds = Vec::new();
    let mut devices = Vec::new();
    let mut render_by_gpu: BTreeMap<u32, i32> = BTreeMap::new();
    for d in &meta.devices {
        let node = map
            .gpus
            .get(&d.user_gpu_id)
            .and_then(|actual| local.gpu(*actual))
            .ok_or(RestoreError::Unmapped(d.user_gpu_id))?;
        let actual = node.gpu_id;
        let r = kfd.open_render(node.props.drm_render_minor, min_fd)?;
        render_by_gpu.insert(d.user_gpu_id, r.as_raw_fd());
        devices.push(DeviceBucket {
            user_gpu_id: d.user_gpu_id,
            actual_gpu_id: actual,
            drm_fd: r.as_raw_fd() as u32,
            pad: 0,
        });
        render_fds.push(r);
    }
    let mut bos: Vec<BoBucket> = meta
        .bos
        .iter()
        .map(|b| BoBucket {
            addr: b.addr,
            size: b.size,
            offset: b.offset,
            gpu_id: b.gpu_id,
            alloc_flags: b.alloc_flags,
            dmabuf_fd: INVALID_FD,
            ..BoBucket::default()
        })
        .collect();
    let priv_data = image.read_all(&meta.priv_data)?;
    let fd = kfd.open_for_restore(min_fd)?;
    kfd.restore(fd.as_fd(), &devices, &mut bos, meta.num_objects, &priv_data)?;
    let mut bytes = 0;
    let copied = (|| -> Result<(), RestoreError> {
        for (rec, bucket) in meta.bos.iter().zip(&bos) {
            if let Some(s) = &rec.contents {
                image.read_section(s, |off, data| {
                    kfd.write_bo(fd.as_fd(), bucket, off, data)
                        .map_err(std::io::Error::other)
                })?;
                bytes += s.len;
            }
        }
        Ok(())
    })();
    kfd.release(&bos);
    copied?;
    let remaps = Remaps(
        meta.bos
            .iter()
            .zip(&bos)
            .filter(|(r, _)| alloc::is_device_mapped(r.alloc_flags))
            .map(|(r, b)| Remap {
                addr: r.addr,
                old_offset: r.offset,
                new_offset: b.restored_offset,
                render_fd: alloc::has_contents(r.alloc_flags)
                    .then(|| render_by_gpu.get(&r.gpu_id).copied())
                    .flatten(),
            })
            .collect(),
    );
    Ok(Restored {
        fd,
        render_fds,
        remaps,
        gpus: map.gpus,
        bytes,
    })
}
