//! The system calls that make a guardian a process of its own, and its syslog lines: the crate's
//! `unsafe` for forking and for libc's syslog.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
use rustix::process::{pidfd_open, PidfdFlags};

/// The guardian's name in `ps` (at most 15 bytes).
const NAME: &std::ffi::CStr = c"criu-gpu-guard";

/// Forks `body` into a process detached from CRIU (a grandchild in a session of its own, so a
/// Ctrl-C or a signal to CRIU's process group does not reach it), connected to the caller by a
/// SOCK_SEQPACKET socketpair. `body` gets its end of the link, a pidfd of CRIU (readable once
/// CRIU is gone) and CRIU's pid. Returns the caller's end and the guardian's pid.
pub fn spawn(
    keep: &[RawFd],
    body: impl FnOnce(OwnedFd, OwnedFd, i32),
) -> std::io::Result<(OwnedFd, i32)> {
    let count = || {
        std::fs::read_to_string("/proc/self/status")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|n| n.trim().parse::<u32>().ok())
    };
    // Threads the plugin joined may take a moment to leave the kernel.
    let mut threads = count().unwrap_or(0);
    for _ in 0..50 {
        if threads == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        threads = count().unwrap_or(0);
    }
    if threads != 1 {
        // fork() copies one thread; locks held by the others would never be released.
        return Err(std::io::Error::other(format!(
            "CRIU runs {threads} threads, a fork is only safe with one"
        )));
    }
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let criu_pid = rustix::process::getpid();
    let criu = pidfd_open(criu_pid, PidfdFlags::empty())?;
    let (pid_r, pid_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // SAFETY: CRIU runs a single thread here (checked above), so the child gets no lock held by
    // another thread; the child only continues into `body` and ends with _exit.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            drop(ours);
            drop(pid_r);
            // SAFETY: as above; this is the intermediate child, which forks once more and exits.
            match unsafe { libc::fork() } {
                -1 => exit(1),
                0 => {}
                grandchild => {
                    let _ = rustix::io::write(&pid_w, &grandchild.to_ne_bytes());
                    exit(0);
                }
            }
            drop(pid_w);
            let mut kept = vec![theirs.as_raw_fd(), criu.as_raw_fd()];
            kept.extend_from_slice(keep);
            become_guardian(&kept);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                body(theirs, criu, criu_pid.as_raw_nonzero().get())
            }));
            exit(if r.is_ok() { 0 } else { 1 })
        }
        child => {
            drop(theirs);
            drop(criu);
            drop(pid_w);
            // Reap the intermediate child at once: CRIU must see no unknown child later.
            let mut status = 0;
            // SAFETY: waits for our own child, writing its status into a local.
            unsafe { libc::waitpid(child, &mut status, 0) };
            let mut buf = [0u8; 4];
            let mut f = std::fs::File::from(pid_r);
            f.read_exact(&mut buf)?;
            Ok((ours, i32::from_ne_bytes(buf)))
        }
    }
}

fn exit(code: i32) -> ! {
    // SAFETY: _exit ends the process at once, running none of CRIU's atexit handlers.
    unsafe { libc::_exit(code) }
}

/// Detaches the new process from everything it inherited from CRIU: session, signal
/// dispositions and mask, every fd but `keep`, CRIU's log.
fn become_guardian(keep: &[RawFd]) {
    crate::log::enter_guardian();
    let _ = rustix::process::setsid();
    // SAFETY: resetting dispositions to default and unblocking signals in a fresh,
    // single-threaded process; SIGPIPE is ignored (writes to a closed peer return EPIPE).
    unsafe {
        for sig in 1..libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_NAME, NAME.as_ptr());
    }
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in open.into_iter().filter(|fd| *fd > 2 && !keep.contains(fd)) {
        // SAFETY: the fd was inherited from CRIU and is owned by no Rust object in this process
        // (the listing also names the directory's own fd, closed already: EBADF is fine).
        unsafe { libc::close(fd) };
    }
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for target in 0..3 {
            // SAFETY: dup2 onto the standard fds, which no Rust object owns.
            unsafe { libc::dup2(null.as_raw_fd(), target) };
        }
    }
}

/// One line to syslog (the journal on systemd machines), as "criu-gpu-guardian[PID]".
pub fn syslog(error: bool, line: &str) {
    static IDENT: &std::ffi::CStr = c"criu-gpu-guardian";
    let Ok(text) = CString::new(line.replace('\0', " ")) else {
        return;
    };
    let priority = if error {
        libc::LOG_ERR
    } else {
        libc::LOG_NOTICE
    };
    // SAFETY: a static ident; a constant "%s" format with one NUL-terminated argument.
    unsafe {
        libc::openlog(IDENT.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON);
        libc::syslog(priority, c"%s".as_ptr(), text.as_ptr());
    }
}
