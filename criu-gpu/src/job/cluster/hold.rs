//! Holding every thread of a stopped process but its TCPStore's: the threads are seized with
//! ptrace while they are in the group stop CRIU left them in (`--leave-stopped`), so that a
//! SIGCONT to the process wakes only the threads that were not seized (torch names its store
//! servers' threads `pt_tcpstore_uv` and `pt_tcpstore`). Dropping the hold detaches them and
//! they run. A seized thread stays in its trace stop whatever signal comes, until then.

use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

/// The threads of a store server (torch's TCPStore, libuv and the older backend).
fn is_store_thread(comm: &str) -> bool {
    comm.starts_with("pt_tcpstore")
}

/// `pid` runs a TCPStore server (the rendezvous' store is served by it).
pub fn has_store_thread(pid: i32) -> bool {
    threads(pid).iter().any(|(_, comm)| is_store_thread(comm))
}

/// Threads of one process held in a trace stop.
pub struct Hold {
    held: Vec<Pid>,
}

impl Hold {
    /// Holds every thread of the stopped process `pid` but its store's, then lets the store's
    /// threads run (SIGCONT). Fails, holding nothing, if the process has no store thread.
    pub fn all_but_store(pid: i32) -> Result<Hold, String> {
        let tids = threads(pid);
        if !tids.iter().any(|(_, comm)| is_store_thread(comm)) {
            return Err(format!(
                "process {pid} has no TCPStore thread (pt_tcpstore*): it does not serve the \
                 rendezvous"
            ));
        }
        let mut hold = Hold { held: Vec::new() };
        for (tid, comm) in tids.into_iter().filter(|(_, c)| !is_store_thread(c)) {
            let tid = Pid::from_raw(tid);
            ptrace::seize(tid, ptrace::Options::empty())
                .map_err(|e| format!("holding thread {tid} ({comm}) of {pid}: {e}"))?;
            hold.held.push(tid);
            // The seized thread reports its group stop (PTRACE_EVENT_STOP).
            waitpid(tid, Some(WaitPidFlag::__WALL))
                .map_err(|e| format!("waiting for thread {tid} of {pid} to stop: {e}"))?;
        }
        kill(Pid::from_raw(pid), Signal::SIGCONT)
            .map_err(|e| format!("waking the store of {pid}: {e}"))?;
        Ok(hold)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        for tid in &self.held {
            let _ = ptrace::detach(*tid, None);
        }
    }
}

/// The threads of `pid` and their names.
fn threads(pid: i32) -> Vec<(i32, String)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            Some((tid, comm.trim().to_owned()))
        })
        .collect()
}
