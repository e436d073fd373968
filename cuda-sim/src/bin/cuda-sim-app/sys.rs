//! Process plumbing of the test application that needs `unsafe`.

/// Closes every fd from 3 up, so nothing inherited (a pipe of the test harness, say) ends up in
/// a checkpoint.
pub fn close_inherited_fds() {
    // SAFETY: close_range only closes descriptors; no Rust object owns fds >= 3 this early.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
}

/// Forks; `true` in the child. Called before any thread exists.
pub fn fork() -> anyhow::Result<bool> {
    // SAFETY: the application is single-threaded when it forks (before the driver is loaded),
    // so the child may run arbitrary code.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => Ok(true),
        nix::unistd::ForkResult::Parent { .. } => Ok(false),
    }
}

/// Children are reaped by the kernel as they exit (a checkpoint test kills some of them).
pub fn reap_children_automatically() {
    // SAFETY: installs SIG_IGN, no handler code runs; called before any thread exists.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGCHLD,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
}

/// A file mapped shared by every process that inherits it, unlinked at once (as NCCL's
/// `/dev/shm/nccl-*` files are): what CRIU dumps as a ghost file.
pub struct SharedFile {
    base: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
    _file: std::fs::File,
}

impl SharedFile {
    pub fn create_unlinked(path: &str, len: usize) -> anyhow::Result<SharedFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        std::fs::remove_file(path)?;
        file.set_len(len as u64)?;
        let size = std::num::NonZeroUsize::new(len).ok_or_else(|| anyhow::anyhow!("empty"))?;
        // SAFETY: a fresh shared mapping of a file we own and keep open, of its full length.
        let base = unsafe {
            nix::sys::mman::mmap(
                None,
                size,
                nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
                nix::sys::mman::MapFlags::MAP_SHARED,
                &file,
                0,
            )?
        };
        Ok(SharedFile {
            base,
            len,
            _file: file,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.len);
        // SAFETY: within the mapping, which lives as long as self; other processes write it
        // concurrently, which the readers tolerate (they compare, never trust, the contents).
        unsafe { std::slice::from_raw_parts((self.base.as_ptr() as *const u8).add(off), len) }
    }

    pub fn fill(&self, off: usize, len: usize, byte: u8) {
        assert!(off + len <= self.len);
        // SAFETY: within the mapping; each rank writes only its own slot.
        unsafe { std::ptr::write_bytes((self.base.as_ptr() as *mut u8).add(off), byte, len) }
    }

    pub fn write_u32(&self, off: usize, v: u32) {
        assert!(off + 4 <= self.len);
        // SAFETY: within the mapping, 4-byte aligned (offsets are multiples of 4).
        unsafe { std::ptr::write_volatile((self.base.as_ptr() as *mut u8).add(off) as *mut u32, v) }
    }

    pub fn read_u32(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.len);
        // SAFETY: as in write_u32.
        unsafe { std::ptr::read_volatile((self.base.as_ptr() as *const u8).add(off) as *const u32) }
    }
}
