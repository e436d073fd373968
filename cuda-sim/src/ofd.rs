//! Open-file-description locks on the control memfd: how the helper thread learns whether the
//! controller that posted a request is still alive, whatever pid namespace either lives in.
//!
//! A controller opens its own description of the memfd (through /proc/PID/fd) and locks one
//! byte for as long as it waits. The kernel drops the lock when the description is closed, so
//! when the controller dies. Locks are advisory and lie past the page: they guard no data.
//! CRIU, dumping the target, sees only the locks of the target's own descriptions (fdinfo).

use std::io;
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg};

fn range(kind: i32, offset: i64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: offset,
        l_len: 1,
        l_pid: 0,
    }
}

/// Takes a write lock on byte `offset` through this description; false if another holds it.
pub fn try_lock(file: impl AsFd, offset: i64) -> io::Result<bool> {
    match fcntl(file, FcntlArg::F_OFD_SETLK(&range(libc::F_WRLCK, offset))) {
        Ok(_) => Ok(true),
        Err(Errno::EAGAIN | Errno::EACCES) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Drops this description's lock on byte `offset`.
pub fn unlock(file: impl AsFd, offset: i64) -> io::Result<()> {
    fcntl(file, FcntlArg::F_OFD_SETLK(&range(libc::F_UNLCK, offset)))?;
    Ok(())
}

/// Whether another description holds a lock on byte `offset`.
pub fn held_by_another(file: impl AsFd, offset: i64) -> io::Result<bool> {
    let mut probe = range(libc::F_WRLCK, offset);
    fcntl(file, FcntlArg::F_OFD_GETLK(&mut probe))?;
    Ok(probe.l_type != libc::F_UNLCK as libc::c_short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_lives_as_long_as_its_description() {
        let fd = crate::shm::control_memfd("ofd-test").unwrap();
        // A second description of the same file, as a controller gets by opening /proc/PID/fd/N.
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        let caller = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        assert!(!held_by_another(&fd, 4242).unwrap());
        assert!(try_lock(&caller, 4242).unwrap());
        assert!(held_by_another(&fd, 4242).unwrap());
        assert!(
            !try_lock(&fd, 4242).unwrap(),
            "another description conflicts"
        );
        unlock(&caller, 4242).unwrap();
        assert!(!held_by_another(&fd, 4242).unwrap());
        assert!(try_lock(&caller, 4242).unwrap());
        drop(caller); // the controller dies
        assert!(!held_by_another(&fd, 4242).unwrap());
    }
}
