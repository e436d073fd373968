//! When CRIU is gone before the plugin's `exit` settled everything: what the guardian does alone,
//! and the lines it leaves in syslog and the image directory.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Agent, Phase, MAX_ALONE};

/// How long the tasks of a successful dump may take to start dying once CRIU is gone, before
/// the guardian takes them for resumed (a failed post-dump script).
const COMMIT_GRACE: Duration = Duration::from_secs(2);
/// How long the half-restored processes of a killed restore may take to die (freeing their
/// memory) before the guardian says which are left.
const KILL_LIMIT: Duration = Duration::from_secs(60);
use crate::guardian::proto::{Level, NotReturned, Outcome, Returned};

impl Agent {
    /// CRIU ended before the plugin had settled everything.
    pub(super) fn criu_gone(&mut self) {
        self.out.close();
        if self.watch.restore() {
            self.restore_gone();
            return;
        }
        match self.phase {
            Phase::RolledBack if self.settled.load(Ordering::SeqCst) => {}
            Phase::RolledBack => {
                // The rollback the plugin asked for is already queued: see it through.
                self.finish_alone("after the dump failed or the tasks were to keep running");
            }
            Phase::Committed => {
                // CRIU's SIGKILLs may not have been acted on yet: a moment's grace.
                let when = "after a dump CRIU called successful, the dumped processes were left \
                            running (a failed post-dump script makes CRIU resume them)";
                if self.left_alive_after_commit() {
                    if self.cuda_alive() {
                        self.finish_alone(when);
                    }
                    self.unpause_kfds(when);
                }
            }
            _ => {
                if self.tracked.values().any(|t| t.touched) {
                    self.finish_alone("in the middle of a dump");
                }
                self.unpause_kfds("in the middle of a dump");
            }
        }
    }

    /// Whether a dumped process is still alive once CRIU, which was to kill them all after a
    /// successful dump, is gone (waiting a moment for its SIGKILLs to land).
    fn left_alive_after_commit(&self) -> bool {
        let grace = Instant::now() + COMMIT_GRACE;
        loop {
            let alive = self.cuda_alive()
                || self
                    .kfds
                    .iter()
                    .any(|(p, k)| self.machine.alive(*p, k.starttime));
            if !alive || Instant::now() > grace {
                return alive;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn cuda_alive(&self) -> bool {
        self.tracked
            .iter()
            .any(|(p, t)| self.machine.alive(*p, t.starttime))
    }

    /// A restore's CRIU ended.
    fn restore_gone(&mut self) {
        let criu = self.criu_pid;
        // The plugin's `exit` ran: CRIU failed the restore itself and killed what it made.
        if self.bye || self.phase != Phase::Working {
            return;
        }
        // A process CRIU forked may fork its own children until it is killed (the tree's root,
        // once CRIU let it): kills in rounds, each taking in what the last one left, until
        // nothing is alive.
        let deadline = Instant::now() + KILL_LIMIT;
        let mut killed: Vec<i32> = Vec::new();
        loop {
            let alive = self.half_restored();
            if alive.is_empty() {
                break;
            }
            let new: Vec<i32> = alive
                .iter()
                .filter(|p| !killed.contains(p))
                .copied()
                .collect();
            if !new.is_empty() {
                self.out.log(
                    Level::Error,
                    format!(
                        "CRIU (pid {criu}) ended in the middle of a restore, before the GPU state \
                         was back: killing the half-restored processes it created, {}; the \
                         images are unchanged: restore again",
                        pids(new.iter().copied())
                    ),
                );
                killed.extend(&new);
            }
            if Instant::now() > deadline {
                self.out.log(
                    Level::Error,
                    format!(
                        "half-restored processes {} are still alive {} s after they were \
                         killed (a process in the kernel that does not die): the next restore \
                         of these images fails until they are gone",
                        pids(alive.iter().copied()),
                        KILL_LIMIT.as_secs()
                    ),
                );
                break;
            }
            for pid in alive.iter().rev() {
                self.machine.kill_created(*pid);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.leave_retryable();
    }

    /// What this CRIU created that is alive, and of that what the images name: never a process
    /// of another restore that took the same pids.
    fn half_restored(&self) -> Vec<i32> {
        self.machine
            .created()
            .into_iter()
            .filter(|(pid, ns)| {
                self.expected.is_empty() || self.expected.contains(ns) || self.tree.contains(pid)
            })
            .map(|(pid, _)| pid)
            .collect()
    }

    /// After a restore killed half-way: what else it left in the way of the next one.
    fn leave_retryable(&self) {
        for line in self.machine.leftovers().remove_ghosts() {
            self.out.log(Level::Warn, line);
        }
        if let Some(line) = self.machine.leftovers().unlock_network(true) {
            self.out.log(Level::Warn, line);
        }
    }

    /// Rolls every process back without CRIU, and records what happened.
    pub(super) fn finish_alone(&mut self, when: &str) {
        let criu = self.criu_pid;
        // The job's processes go on: their sockets must leave repair mode, and the network
        // CRIU locked for them must pass again.
        let tracked: Vec<i32> = self.tracked.keys().copied().collect();
        if let Some(line) = self.machine.leftovers().release_repair(&tracked) {
            self.out.log(Level::Warn, line);
        }
        if let Some(line) = self.machine.leftovers().unlock_network(false) {
            self.out.log(Level::Warn, line);
        }
        self.out.log(
            Level::Error,
            format!(
                "CRIU (pid {criu}) ended {when}; returning the CUDA processes {} to their state \
                 before the dump",
                pids(tracked.iter().copied())
            ),
        );
        // Already queued rollbacks report to the plugin's (closed) link; queue fresh ones so
        // their outcomes come here. A second rollback of a process already back does nothing.
        for t in self.tracked.values_mut() {
            t.rolled_back = false;
        }
        let rx = self.roll_back_all();
        let started = Instant::now();
        let mut left: BTreeMap<i32, String> = self
            .tracked
            .iter()
            .map(|(p, t)| (*p, t.comm.clone()))
            .collect();
        while !left.is_empty() {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(o) => {
                    left.remove(&o.pid);
                    self.out.log(o.level(), o.line());
                }
                Err(_) if started.elapsed() > MAX_ALONE => {
                    self.out.log(
                        Level::Error,
                        format!(
                            "giving up after {} s: processes {:?} still have a GPU action in \
                             flight (stopped, or the GPU hangs); once they can run: \
                             `cuda-checkpoint-ctl --recover --pid PID`",
                            MAX_ALONE.as_secs(),
                            left
                        ),
                    );
                    return;
                }
                Err(_) => self.out.log(
                    Level::Warn,
                    format!(
                        "still waiting for a GPU action in flight on {:?} (a process that cannot \
                         run, or a GPU that does not answer)",
                        left
                    ),
                ),
            }
        }
    }
}

fn pids(list: impl IntoIterator<Item = i32>) -> String {
    list.into_iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Outcome {
    pub(super) fn level(&self) -> Level {
        if self.result.is_ok() {
            Level::Info
        } else {
            Level::Error
        }
    }

    /// One line for the logs.
    pub fn line(&self) -> String {
        let (pid, comm) = (self.pid, &self.comm);
        match &self.result {
            Ok(Returned::To(s)) => {
                format!("process {pid} ({comm}) returned to its state before the dump ({s})")
            }
            Ok(Returned::Gone) => format!("process {pid} ({comm}) has exited; nothing to return"),
            Ok(Returned::Untouched) => format!("process {pid} ({comm}) was not changed"),
            Err(NotReturned::Lost) => format!(
                "the GPU state of process {pid} ({comm}) is lost: the driver reports it failed, \
                 and nothing can return it to its state before the dump; restart it"
            ),
            Err(NotReturned::Other(e)) => format!(
                "process {pid} ({comm}) could not be returned to its state before the dump: {e}; \
                 when it can run, try `cuda-checkpoint-ctl --recover --pid {pid}`"
            ),
        }
    }
}
