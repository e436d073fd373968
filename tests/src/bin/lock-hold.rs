//! `lock-hold KIND FILE [PROGRAM ARGS...]`: holds a lock of KIND on FILE for as long as it lives,
//! as a process of a job may, then starts PROGRAM (the job's GPU process) as its child. KIND:
//! - `flock`: flock(2);
//! - `posix`: a POSIX record lock (fcntl F_SETLK);
//! - `ofd`: an open-file-description lock (F_OFD_SETLK: /proc/locks names pid -1);
//! - `lease`: a read lease (F_SETLEASE);
//! - `posix-thread`: a POSIX lock taken by a second thread, which stays;
//! - `inherited-flock`: an flock the `flock` command took on a file description this process
//!   holds and then exited, as a script's `exec 9>FILE; flock -n 9` leaves the programs it starts
//!   (/proc/locks names the command's pid, long gone).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, FdFlag, Flock, FlockArg};
use nix::libc;

fn write_lock() -> libc::flock {
    libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

fn open_rw(path: &str) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Takes the lock; what must stay open (or alive) for it to be held.
fn lock(kind: &str, path: &str) -> Box<dyn std::any::Any> {
    match kind {
        "flock" => Box::new(Flock::lock(open_rw(path), FlockArg::LockExclusive).expect("flock")),
        "posix" | "ofd" => {
            let f = open_rw(path);
            let lock = write_lock();
            let arg = match kind {
                "posix" => FcntlArg::F_SETLK(&lock),
                _ => FcntlArg::F_OFD_SETLK(&lock),
            };
            fcntl(f.as_fd(), arg).unwrap_or_else(|e| panic!("{kind} lock: {e}"));
            Box::new(f)
        }
        "lease" => {
            drop(open_rw(path));
            let f = File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: fcntl(F_SETLEASE) on an fd this function owns, with an integer argument.
            let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
            assert_eq!(r, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());
            Box::new(f)
        }
        "posix-thread" => {
            let path = path.to_owned();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let f = open_rw(&path);
                fcntl(f.as_fd(), FcntlArg::F_SETLK(&write_lock())).expect("posix lock");
                tx.send(()).unwrap();
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            });
            rx.recv().expect("the locking thread");
            Box::new(())
        }
        "inherited-flock" => {
            let f = open_rw(path);
            fcntl(f.as_fd(), FcntlArg::F_SETFD(FdFlag::empty())).expect("clear FD_CLOEXEC");
            let ok = Command::new("flock")
                .args(["-n", &f.as_raw_fd().to_string()])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "flock -n FD");
            Box::new(f)
        }
        _ => panic!("unknown lock kind {kind}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(kind), Some(path)) = (args.first(), args.get(1)) else {
        panic!("usage: lock-hold KIND FILE [PROGRAM ARGS...]");
    };
    let _held = lock(kind, path);
    let _child = args.get(2).map(|program| {
        Command::new(program)
            .args(&args[3..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e}"))
    });
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
