//! `ptrace-hold PID [--only TID | --except TID]`: holds threads of a process in a ptrace stop,
//! as a debugger does (gdb attaches to every thread), until its stdin closes; then lets them
//! go. Prints `held` once every chosen thread is stopped. `--only` holds one thread (a debugger
//! on the CUDA driver thread), `--except` all but one (CRIU's C plugin, which lets only the
//! driver thread run while it checkpoints).

use std::io::Write;

use nix::sys::ptrace;
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

fn threads(pid: i32) -> Vec<i32> {
    let dir = format!("/proc/{pid}/task");
    let mut tids: Vec<i32> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: ptrace-hold PID [--only TID | --except TID]";
    let pid: i32 = args.first().and_then(|a| a.parse().ok()).expect(usage);
    let tid = |i: usize| -> i32 { args.get(i).and_then(|a| a.parse().ok()).expect(usage) };
    let tids: Vec<i32> = match args.get(1).map(String::as_str) {
        None => threads(pid),
        Some("--only") => vec![tid(2)],
        Some("--except") => {
            let spared = tid(2);
            threads(pid).into_iter().filter(|&t| t != spared).collect()
        }
        Some(_) => panic!("{usage}"),
    };
    for &t in &tids {
        let t = Pid::from_raw(t);
        ptrace::seize(t, ptrace::Options::empty()).unwrap_or_else(|e| panic!("seize {t}: {e}"));
        ptrace::interrupt(t).unwrap_or_else(|e| panic!("interrupt {t}: {e}"));
        waitpid(t, Some(WaitPidFlag::__WALL)).unwrap_or_else(|e| panic!("wait for {t}: {e}"));
    }
    println!("held");
    let _ = std::io::stdout().flush();
    let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
    for &t in &tids {
        let _ = ptrace::detach(Pid::from_raw(t), None);
    }
}
