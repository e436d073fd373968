//! The kernel's KFD: `AMDKFD_IOC_CRIU_OP` on `/dev/kfd`, buffer contents through the dma-buf
//! fds the kernel exports for them (CPU mappings of the dma-buf, bracketed by
//! `DMA_BUF_IOCTL_SYNC`). This module holds the crate's ioctl, mmap and kcmp `unsafe`.
//!
//! The kernel takes `AMDKFD_IOC_CRIU_OP` on a process's KFD file from that process, or from the
//! thread that ptrace-traces its leader (CRIU, which seized it), with CAP_CHECKPOINT_RESTORE or
//! CAP_SYS_ADMIN.
//!
//! Not run on hardware: no AMD GPU is available to this project. The ioctl layouts are checked
//! against the kernel header; the sequence is the one the simulated KFD enforces.

use std::ffi::c_void;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use super::{Checkpoint, Kfd, KfdError, ProcessInfo};
use crate::uapi::{self, BoBucket, CriuArgs, CriuOp, DeviceBucket, GetVersionArgs};

pub const DEVICE: &str = "/dev/kfd";
const DRM_MAJOR: u64 = 226;
/// `DMA_BUF_IOCTL_SYNC`: `_IOW('b', 0, struct dma_buf_sync)`.
const DMA_BUF_IOCTL_SYNC: u64 = 0x4008_6200;
const DMA_BUF_SYNC_READ: u64 = 1;
const DMA_BUF_SYNC_WRITE: u64 = 2;
const DMA_BUF_SYNC_END: u64 = 4;

pub struct RealKfd {
    rdev: u64,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ioctl<T>(fd: BorrowedFd<'_>, request: u64, arg: &mut T) -> Result<(), i32> {
    loop {
        // SAFETY: `arg` is a live, properly laid out argument struct for `request` (layouts
        // checked against linux/kfd_ioctl.h); the kernel reads and writes only its size.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg as *mut T as *mut c_void) };
        if r == 0 {
            return Ok(());
        }
        match errno() {
            libc::EINTR | libc::EAGAIN => continue,
            e => return Err(e),
        }
    }
}

fn criu_op(
    fd: BorrowedFd<'_>,
    op: CriuOp,
    args: &mut CriuArgs,
    what: &'static str,
) -> Result<(), KfdError> {
    args.op = op as u32;
    ioctl(fd, uapi::AMDKFD_IOC_CRIU_OP as u64, args).map_err(|e| {
        KfdError::new(
            what,
            e,
            format!(
                "AMDKFD_IOC_CRIU_OP failed: {}{}",
                std::io::Error::from_raw_os_error(e),
                if e == libc::EACCES || e == libc::EPERM {
                    " (needs root, or CAP_CHECKPOINT_RESTORE)"
                } else {
                    ""
                }
            ),
        )
    })
}

/// Opens a device file read-write; errors name the file and the operation.
fn open_rw(path: &str, op: &'static str) -> Result<std::fs::File, KfdError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| KfdError::new(op, e.raw_os_error().unwrap_or(0), format!("{path}: {e}")))
}

/// Moves an fd to a number >= `min_fd`, out of the way of the restored process's own.
fn move_fd(f: std::fs::File, min_fd: i32) -> Result<OwnedFd, KfdError> {
    rustix::io::fcntl_dupfd_cloexec(&f, min_fd)
        .map_err(|e| KfdError::new("open", e.raw_os_error(), "cannot move the fd"))
}

/// A CPU mapping of a buffer's dma-buf.
struct Mapped {
    ptr: *mut u8,
    len: usize,
    fd: i32,
    flags: u64,
}

impl Mapped {
    /// Maps `len` bytes of the dma-buf from `offset` (page aligned).
    fn new(fd: u32, offset: u64, len: usize, write: bool) -> Result<Mapped, KfdError> {
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of a dma-buf the kernel exported for this buffer; the
        // kernel checks fd and length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd as i32,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(KfdError::new(
                "buffer copy",
                errno(),
                "cannot map a GPU buffer's dma-buf (VRAM not CPU-visible? SDMA copies are not implemented)",
            ));
        }
        let flags = if write {
            DMA_BUF_SYNC_WRITE
        } else {
            DMA_BUF_SYNC_READ
        };
        let mut sync = flags;
        // SAFETY: fd is the dma-buf; the argument is a u64 flags word.
        let _ = ioctl(
            unsafe { BorrowedFd::borrow_raw(fd as i32) },
            DMA_BUF_IOCTL_SYNC,
            &mut sync,
        );
        Ok(Mapped {
            ptr: p.cast(),
            len,
            fd: fd as i32,
            flags,
        })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes and lives until drop.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        let mut sync = self.flags | DMA_BUF_SYNC_END;
        // SAFETY: same fd and flags word as in `new`; then unmap exactly our mapping.
        unsafe {
            let _ = ioctl(
                BorrowedFd::borrow_raw(self.fd),
                DMA_BUF_IOCTL_SYNC,
                &mut sync,
            );
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Whether `ours` and fd `theirs` of process `pid` are one open file (`kcmp(KCMP_FILE)`):
/// `None` where the kernel cannot say (no kcmp).
pub fn same_file(ours: BorrowedFd<'_>, pid: i32, theirs: i32) -> Option<bool> {
    const KCMP_FILE: libc::c_int = 0;
    // SAFETY: kcmp only compares kernel objects named by plain integers; it touches no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            std::process::id() as libc::pid_t,
            pid as libc::pid_t,
            KCMP_FILE,
            ours.as_raw_fd() as libc::c_ulong,
            theirs as libc::c_ulong,
        )
    };
    match r {
        0 => Some(true),
        r if r > 0 => Some(false),
        _ if matches!(errno(), libc::ENOSYS | libc::EPERM | libc::EACCES) => None,
        _ => Some(false),
    }
}

impl RealKfd {
    /// `None` when this machine has no KFD.
    pub fn open() -> Option<RealKfd> {
        let meta = std::fs::metadata(DEVICE).ok()?;
        meta.file_type()
            .is_char_device()
            .then(|| RealKfd { rdev: meta.rdev() })
    }

    fn copy(
        &self,
        bo: &BoBucket,
        offset: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<(), KfdError> {
        if bo.dmabuf_fd == uapi::INVALID_FD {
            return Err(KfdError::new(
                "buffer copy",
                libc::EINVAL,
                "the buffer has no dma-buf",
            ));
        }
        // Copies go in page-aligned chunks; map just the chunk's pages.
        if offset % 4096 != 0 {
            return Err(KfdError::new(
                "buffer copy",
                libc::EINVAL,
                "unaligned buffer offset",
            ));
        }
        let mut m = Mapped::new(bo.dmabuf_fd, offset, len.div_ceil(4096) * 4096, write)?;
        f(&mut m.bytes()[..len]);
        Ok(())
    }
}

impl Kfd for RealKfd {
    fn describe(&self) -> String {
        DEVICE.into()
    }

    fn topology_root(&self) -> std::path::PathBuf {
        crate::topology::Topology::default_root()
    }

    fn version(&self) -> Result<(u32, u32), KfdError> {
        let f = open_rw(DEVICE, "version")?;
        let mut v = GetVersionArgs::default();
        ioctl(f.as_fd(), uapi::AMDKFD_IOC_GET_VERSION as u64, &mut v)
            .map_err(|e| KfdError::new("version", e, "AMDKFD_IOC_GET_VERSION failed"))?;
        Ok((v.major_version, v.minor_version))
    }

    fn is_kfd_file(&self, fd: BorrowedFd<'_>) -> bool {
        rustix::fs::fstat(fd)
            .is_ok_and(|st| st.st_rdev == self.rdev && (st.st_mode & libc::S_IFMT) == libc::S_IFCHR)
    }

    fn is_kfd_link(&self, fd_link: &std::path::Path) -> bool {
        std::fs::metadata(fd_link)
            .is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == self.rdev)
    }

    fn render_minor(&self, fd: BorrowedFd<'_>) -> Option<u32> {
        let st = rustix::fs::fstat(fd).ok()?;
        let (major, minor) = (libc::major(st.st_rdev) as u64, libc::minor(st.st_rdev));
        ((st.st_mode & libc::S_IFMT) == libc::S_IFCHR && major == DRM_MAJOR && minor >= 128)
            .then_some(minor)
    }

    fn process_info(&self, fd: BorrowedFd<'_>) -> Result<ProcessInfo, KfdError> {
        let mut a = CriuArgs::default();
        criu_op(fd, CriuOp::ProcessInfo, &mut a, "PROCESS_INFO")?;
        Ok(ProcessInfo {
            pid: a.pid,
            num_devices: a.num_devices,
            num_bos: a.num_bos,
            num_objects: a.num_objects,
            priv_data_size: a.priv_data_size,
        })
    }

    fn checkpoint(&self, fd: BorrowedFd<'_>, info: &ProcessInfo) -> Result<Checkpoint, KfdError> {
        let mut c = Checkpoint {
            devices: vec![DeviceBucket::default(); info.num_devices as usize],
            bos: vec![BoBucket::default(); info.num_bos as usize],
            priv_data: vec![0u8; info.priv_data_size as usize],
        };
        let mut a = CriuArgs {
            devices: c.devices.as_mut_ptr() as u64,
            bos: c.bos.as_mut_ptr() as u64,
            priv_data: c.priv_data.as_mut_ptr() as u64,
            priv_data_size: info.priv_data_size,
            num_devices: info.num_devices,
            num_bos: info.num_bos,
            num_objects: info.num_objects,
            ..CriuArgs::default()
        };
        criu_op(fd, CriuOp::Checkpoint, &mut a, "CHECKPOINT")?;
        Ok(c)
    }

    fn read_bo(
        &self,
        _fd: BorrowedFd<'_>,
        bo: &BoBucket,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), KfdError> {
        self.copy(bo, offset, dst.len(), false, |m| dst.copy_from_slice(m))
    }

    fn release(&self, bos: &[BoBucket]) {
        for b in bos.iter().filter(|b| b.dmabuf_fd != uapi::INVALID_FD) {
            // SAFETY: the kernel installed this dma-buf fd in our table for us; nothing else owns it.
            drop(unsafe { OwnedFd::from_raw_fd(b.dmabuf_fd as i32) });
        }
    }

    fn unpause(&self, fd: BorrowedFd<'_>) -> Result<(), KfdError> {
        criu_op(fd, CriuOp::Unpause, &mut CriuArgs::default(), "UNPAUSE")
    }

    fn open_for_restore(&self, min_fd: i32) -> Result<OwnedFd, KfdError> {
        move_fd(open_rw(DEVICE, "open")?, min_fd)
    }

    fn open_render(&self, minor: u32, min_fd: i32) -> Result<OwnedFd, KfdError> {
        move_fd(
            open_rw(&format!("/dev/dri/renderD{minor}"), "open")?,
            min_fd,
        )
    }

    fn restore(
        &self,
        fd: BorrowedFd<'_>,
        devices: &[DeviceBucket],
        bos: &mut [BoBucket],
        num_objects: u32,
        priv_data: &[u8],
    ) -> Result<(), KfdError> {
        let mut devices = devices.to_vec();
        let mut a = CriuArgs {
            devices: devices.as_mut_ptr() as u64,
            bos: bos.as_mut_ptr() as u64,
            priv_data: priv_data.as_ptr() as u64,
            priv_data_size: priv_data.len() as u64,
            num_devices: devices.len() as u32,
            num_bos: bos.len() as u32,
            num_objects,
            ..CriuArgs::default()
        };
        criu_op(fd, CriuOp::Restore, &mut a, "RESTORE")
    }

    fn write_bo(
        &self,
        _fd: BorrowedFd<'_>,
        bo: &BoBucket,
        offset: u64,
        src: &[u8],
    ) -> Result<(), KfdError> {
        self.copy(bo, offset, src.len(), true, |m| m.copy_from_slice(src))
    }

    fn resume(&self, pid: u32) -> Result<(), KfdError> {
        let f = open_rw(DEVICE, "RESUME")?;
        let mut a = CriuArgs {
            pid,
            ..CriuArgs::default()
        };
        criu_op(f.as_fd(), CriuOp::Resume, &mut a, "RESUME")
    }
}
