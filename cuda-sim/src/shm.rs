//! Memory the simulated driver maps itself: the shared control page and host copies of device
//! memory. This module holds the crate's raw memory `unsafe`.
//!
//! Host copies use anonymous mappings rather than the allocator because the checkpoint runs on
//! the driver's helper thread while the application's other threads may be stopped anywhere,
//! malloc's locks included; the kernel's mmap takes no user-space lock.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use rustix::mm::{self, MapFlags, ProtFlags};

use crate::control::ControlBlock;

/// Size of the control page.
pub const PAGE: usize = 4096;

/// A shared mapping of the control memfd.
pub struct ControlPage {
    ptr: NonNull<u8>,
}

// SAFETY: the page is only accessed through `ControlBlock`, whose fields are all atomics.
unsafe impl Send for ControlPage {}
// SAFETY: as above; concurrent access goes through atomics only.
unsafe impl Sync for ControlPage {}

impl ControlPage {
    /// Maps `fd` (a memfd of at least one page) shared, read-write.
    pub fn map(fd: impl AsFd, dont_fork: bool) -> io::Result<ControlPage> {
        // SAFETY: a fresh mapping chosen by the kernel aliases no Rust object; the file is at
        // least PAGE bytes long (callers ftruncate or check the size first).
        let p = unsafe {
            mm::mmap(
                std::ptr::null_mut(),
                PAGE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        if dont_fork {
            // A forked child must not see its parent's control page: it is not the same CUDA
            // process, and a controller must not find the parent's driver state through it.
            // SAFETY: advises on the mapping just created, which no one else uses yet.
            unsafe { mm::madvise(p, PAGE, mm::Advice::LinuxDontFork)? };
        }
        Ok(ControlPage {
            ptr: NonNull::new(p.cast()).expect("mmap returned null"),
        })
    }

    pub fn block(&self) -> &ControlBlock {
        const _: () = assert!(std::mem::size_of::<ControlBlock>() <= PAGE);
        // SAFETY: the mapping is PAGE bytes, page-aligned (more than ControlBlock's alignment),
        // lives as long as `self`, and ControlBlock consists of atomics for which every bit
        // pattern (including the zeroes of a fresh memfd) is valid.
        unsafe { &*self.ptr.as_ptr().cast::<ControlBlock>() }
    }
}

impl Drop for ControlPage {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`; no reference outlives `self`.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), PAGE) };
    }
}

/// Creates the control memfd, sized to one page.
pub fn control_memfd(name: &str) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, PAGE as u64)?;
    Ok(fd)
}

/// Host memory holding a copy of one device allocation while the process is checkpointed.
pub struct HostBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: HostBuf owns its mapping exclusively, like a Box<[u8]>.
unsafe impl Send for HostBuf {}

impl HostBuf {
    pub fn new(len: usize) -> io::Result<HostBuf> {
        if len == 0 {
            return Ok(HostBuf {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: an anonymous private mapping aliases nothing.
        let p = unsafe {
            mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )?
        };
        Ok(HostBuf {
            ptr: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr/len describe our live mapping (or a dangling pointer with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly our mapping; no slice outlives `self`.
            let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// Registers `child` to run in the child after every fork of this process.
pub fn at_fork_child(child: extern "C" fn()) {
    // SAFETY: pthread_atfork only stores the function pointer, which is 'static.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

/// Closes a raw fd; for the fork handler, which may only use async-signal-safe calls.
pub fn close_raw(fd: i32) {
    if fd >= 0 {
        // SAFETY: close is async-signal-safe; the fd is the child's copy, owned by no Rust object
        // in the child.
        unsafe { libc::close(fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffers_hold_data() {
        let mut b = HostBuf::new(3 << 20).unwrap();
        b.as_mut_slice()[12345] = 7;
        assert_eq!(b.as_slice()[12345], 7);
        assert_eq!(HostBuf::new(0).unwrap().as_slice().len(), 0);
    }

    #[test]
    fn control_pages_share_memory() {
        use std::sync::atomic::Ordering;
        let fd = control_memfd("test-ctl").unwrap();
        let a = ControlPage::map(&fd, true).unwrap();
        let b = ControlPage::map(&fd, false).unwrap();
        a.block().state.store(2, Ordering::SeqCst);
        assert_eq!(b.block().state.load(Ordering::SeqCst), 2);
    }
}
