//! DUMP_EXT_FILE for a KFD file: pause, checkpoint, save everything into one image. The queues
//! stay paused when [`dump`] returns successfully, so that GPU work cannot change memory while
//! CRIU dumps the rest of the process; the caller unpauses when the dump is over (or now, if the
//! process lives on). On any failure [`dump`] unpauses them before returning; [`pause`] and
//! [`save`] are its two steps, for a caller that does that itself.

use std::os::fd::BorrowedFd;
use std::path::Path;

use crate::device::{Kfd, KfdError, ProcessInfo};
use crate::image::{self, BoRecord, DeviceRecord, ImageError, ImageWriter, KfdImage};
use crate::topology::Topology;
use crate::uapi::{alloc, KFD_MAJOR, KFD_MIN_MINOR};

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(transparent)]
    Kfd(#[from] KfdError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("KFD ioctl version {0}.{1} is too old: checkpointing needs {KFD_MAJOR}.{KFD_MIN_MINOR} (Linux 5.19 or a ROCm DKMS driver); upgrade the kernel driver")]
    Version(u32, u32),
    #[error("{0}")]
    Topology(String),
}

/// What the dump wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dumped {
    pub pid: u32,
    pub gpus: usize,
    pub bos: usize,
    pub bytes: u64,
}

/// Dumps the KFD state behind `fd` (CRIU's copy of the process's KFD file) as image `id`:
/// [`pause`], then [`save`]; on failure after the pause the queues are unpaused again.
pub fn dump(
    kfd: &dyn Kfd,
    fd: BorrowedFd<'_>,
    id: u32,
    dir: &Path,
    local: &Topology,
) -> Result<Dumped, DumpError> {
    let info = pause(kfd, fd)?;
    let result = save(kfd, fd, &info, id, dir, local);
    if result.is_err() {
        if let Err(e) = kfd.unpause(fd) {
            tracing::error!("could not unpause the queues after a failed dump: {e}");
        }
    }
    result
}

/// Checks the KFD's version and pauses the process's queues (PROCESS_INFO). Nothing is paused
/// when this fails.
pub fn pause(kfd: &dyn Kfd, fd: BorrowedFd<'_>) -> Result<ProcessInfo, DumpError> {
    let (major, minor) = kfd.version()?;
    if major != KFD_MAJOR || minor < KFD_MIN_MINOR {
        return Err(DumpError::Version(major, minor));
    }
    Ok(kfd.process_info(fd)?)
}

/// Checkpoints the paused process and writes its image. The queues stay paused, also when this
/// fails: the caller unpauses them.
pub fn save(
    kfd: &dyn Kfd,
    fd: BorrowedFd<'_>,
    info: &ProcessInfo,
    id: u32,
    dir: &Path,
    local: &Topology,
) -> Result<Dumped, DumpError> {
    let ck = kfd.checkpoint(fd, info)?;
    let written = write_image(kfd, fd, id, dir, local, info, &ck);
    kfd.release(&ck.bos);
    written
}

fn write_image(
    kfd: &dyn Kfd,
    fd: BorrowedFd<'_>,
    id: u32,
    dir: &Path,
    local: &Topology,
    info: &ProcessInfo,
    ck: &crate::device::Checkpoint,
) -> Result<Dumped, DumpError> {
    // The GPUs the process uses, relabelled with the gpu_ids it knows them by.
    let actual: Vec<u32> = ck.devices.iter().map(|d| d.actual_gpu_id).collect();
    let mut topology = local.restricted_to(&actual);
    for d in &ck.devices {
        let node = topology
            .nodes
            .iter_mut()
            .find(|n| n.gpu_id == d.actual_gpu_id)
            .ok_or_else(|| {
                DumpError::Topology(format!(
                    "GPU {:#x} of the process is not in the topology",
                    d.actual_gpu_id
                ))
            })?;
        node.gpu_id = d.user_gpu_id;
    }
    let path = dir.join(image::file_name(id));
    let mut w = ImageWriter::create(&path)?;
    let priv_data = w.section(ck.priv_data.len() as u64, |buf, off| {
        buf.copy_from_slice(&ck.priv_data[off as usize..off as usize + buf.len()]);
        Ok(())
    })?;
    let mut bos = Vec::with_capacity(ck.bos.len());
    let mut bytes = 0;
    for b in &ck.bos {
        let contents = if alloc::has_contents(b.alloc_flags) {
            bytes += b.size;
            Some(w.section(b.size, |buf, off| {
                kfd.read_bo(fd, b, off, buf).map_err(std::io::Error::other)
            })?)
        } else {
            None
        };
        bos.push(BoRecord {
            addr: b.addr,
            size: b.size,
            offset: b.offset,
            gpu_id: b.gpu_id,
            alloc_flags: b.alloc_flags,
            contents,
        });
    }
    let meta = KfdImage {
        pid: info.pid,
        kfd_version: kfd.version()?,
        topology,
        devices: ck
            .devices
            .iter()
            .map(|d| DeviceRecord {
                user_gpu_id: d.user_gpu_id,
                actual_gpu_id: d.actual_gpu_id,
            })
            .collect(),
        bos,
        num_objects: info.num_objects,
        priv_data,
    };
    w.finish(&meta)?;
    Ok(Dumped {
        pid: info.pid,
        gpus: ck.devices.len(),
        bos: ck.bos.len(),
        bytes,
    })
}
