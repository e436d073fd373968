//! TCP repair mode taken back from a job's sockets when CRIU died before it could.
//!
//! CRIU dumps an established connection by putting its socket into repair mode and takes it out
//! at the end of the dump. Killed in between, it leaves the sockets so: `recv` answers EPERM,
//! `send` EINVAL, and the job ends on that (docs/known-limits.md). The guardian holds a copy of
//! each socket of the job (`pidfd_getfd`, which root may do) and switches repair off where it is
//! on. Only sockets in repair mode are touched, and only those of the dumped tree: another
//! dump's sockets, in repair mode for good reason, are left alone.

use std::os::fd::OwnedFd;

use nix::sys::socket::{getsockopt, setsockopt, sockopt::TcpRepair};
use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};

/// Takes every socket of `tree` that is in TCP repair mode out of it; returns how many.
pub fn release(tree: &[i32]) -> usize {
    tree.iter().map(|&pid| release_process(pid)).sum()
}

fn release_process(pid: i32) -> usize {
    let Some(pidfd) = Pid::from_raw(pid).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok())
    else {
        return 0;
    };
    sockets(pid)
        .into_iter()
        .filter_map(|fd| pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()).ok())
        .filter(release_socket)
        .count()
}

/// The process's descriptors that are sockets.
fn sockets(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Switches repair mode off if it is on; true if it was switched. A socket that is not TCP
/// answers the query with an error and is left as it is.
fn release_socket(socket: &OwnedFd) -> bool {
    getsockopt(socket, TcpRepair) == Ok(1) && setsockopt(socket, TcpRepair, &0).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    /// Needs CAP_NET_ADMIN (repair mode) and the right to take another's descriptors: root.
    #[test]
    fn a_socket_left_in_repair_mode_is_taken_out_and_works_again() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root (TCP repair mode): run the tests as root, as scripts/test.sh does"
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        setsockopt(&client.as_fd(), TcpRepair, &1).unwrap();
        let before = release(&[std::process::id() as i32]);
        assert_eq!(before, 1, "the one socket in repair mode");
        assert_eq!(getsockopt(&client.as_fd(), TcpRepair), Ok(0));
        assert_eq!(release(&[std::process::id() as i32]), 0, "none left");
        use std::io::{Read, Write};
        (&client).write_all(b"ok").unwrap();
        let mut buf = [0u8; 2];
        (&server).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ok");
    }
}
