//! When CRIU is gone before the plugin's `exit` settled everything: what the guardian does alone,
//! and the lines it leaves in syslog and the image directory.

use std::time::{Duration, Instant};

use super::vendor::Moment;
use super::{Agent, Phase};

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
        let moment = match self.phase {
            Phase::RolledBack if self.vendors.iter().all(|v| v.settled()) => return,
            Phase::RolledBack => Moment::RollingBack,
            // CRIU's SIGKILLs may not have been acted on yet: a moment's grace.
            Phase::Committed if !self.left_alive_after_commit() => return,
            Phase::Committed => Moment::Committed,
            Phase::Working | Phase::Restored => Moment::Midway,
        };
        self.finish_alone(moment);
    }

    /// Whether a dumped process is still alive once CRIU, which was to kill them all after a
    /// successful dump, is gone (waiting a moment for its SIGKILLs to land).
    fn left_alive_after_commit(&self) -> bool {
        let grace = Instant::now() + COMMIT_GRACE;
        loop {
            let alive = self.vendors.iter().any(|v| v.alive());
            if !alive || Instant::now() > grace {
                return alive;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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

    /// Puts back alone, at `moment`, what CRIU left and every vendor that has something to
    /// undo then holds; whether any had.
    pub(super) fn finish_alone(&mut self, moment: Moment) -> bool {
        let undoing: Vec<usize> = (0..self.vendors.len())
            .filter(|i| self.vendors[*i].undoes_at(moment))
            .collect();
        if undoing.is_empty() {
            return false;
        }
        // The job's processes go on: their sockets must leave repair mode, and the network
        // CRIU locked for them must pass again.
        let watched: Vec<i32> = self.vendors.iter().flat_map(|v| v.pids()).collect();
        if let Some(line) = self.machine.leftovers().release_repair(&watched) {
            self.out.log(Level::Warn, line);
        }
        if let Some(line) = self.machine.leftovers().unlock_network(false) {
            self.out.log(Level::Warn, line);
        }
        for i in undoing {
            self.vendors[i].undo(moment);
        }
        true
    }
}

pub(super) fn pids(list: impl IntoIterator<Item = i32>) -> String {
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
