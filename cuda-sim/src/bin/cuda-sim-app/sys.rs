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
