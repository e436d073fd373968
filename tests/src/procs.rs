//! Processes and commands as the tests watch them: waiting, signals, reaping, output.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// Polls `f` until it returns true or `limit` passes.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    f()
}

pub fn pid_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie has exited already.
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits for a pid to disappear (CRIU restores a tree with the same pids).
pub fn wait_gone(pid: i32) {
    assert!(
        wait_until(Duration::from_secs(10), || !Path::new(&format!(
            "/proc/{pid}"
        ))
        .exists()),
        "pid {pid} is still there"
    );
}

/// Stopped by a signal (state T in /proc).
pub fn is_stopped(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// Waits for a background command and returns its output, or kills it after `limit`.
pub fn finish_within(child: Child, limit: Duration) -> Option<Output> {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.ok(),
        Err(_) => {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
            None
        }
    }
}

/// Kills a background command (a controller "dying") and reaps it.
pub fn kill_child(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

pub fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// Hands a child to a thread that reaps it when it dies, so its pid is free again at once
/// (CRIU restores processes with their old pids). Returns the pid.
pub fn reap_in_background(mut child: Child) -> i32 {
    let pid = child.id() as i32;
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    pid
}

/// `setsid PROGRAM`: a new session, so CRIU can dump the process as a tree root.
pub fn setsid_command(program: &Path) -> Command {
    let mut c = Command::new("setsid");
    c.arg(program);
    c
}

/// stdout of a command as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The exit status as the shell sees it (a CUDA error code modulo 256).
pub fn exit_code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}
