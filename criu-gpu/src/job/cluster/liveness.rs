//! The end of a restore (or of a snapshot) of a job launched by torchrun with a dynamic
//! rendezvous ([`super::torchrun`]): CRIU leaves every node's processes stopped
//! (`--leave-stopped`); once every node's are back (`held`), the node that serves the
//! rendezvous store holds its agent's threads but the store's, sets every node's heartbeat to
//! now through the store, and lets the agent go; once that is done (`fresh`), every node's
//! processes go on. No agent runs before the heartbeats are fresh, so none can find another
//! (or itself) older than its limit, however long the job was away.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::hold::Hold;
use super::op::Op;
use super::torchrun::{Agent, Refresher};
use crate::out;

/// What becomes of this node's stopped processes if the job cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfFailed {
    /// A restore: they end (the images are unchanged; the restore can be run again).
    End,
    /// A snapshot: they go on as they are (the job was running before it).
    GoOn,
}

/// Lets this node's stopped processes `tree` go on, after the heartbeats of the job's
/// rendezvous are fresh; `release` runs just before they go on (the snapshot's network lock).
pub fn resume(
    op: &Op,
    agents: &[Agent],
    tree: &[i32],
    limit: Duration,
    if_failed: IfFailed,
    release: impl FnOnce(),
) -> Result<(), String> {
    let result = fresh(op, agents, limit);
    if result.is_err() && if_failed == IfFailed::End {
        signal_all(tree, Signal::SIGKILL);
        return result.map_err(|why| {
            format!("{why}; this node's restored processes were ended, the images are unchanged")
        });
    }
    release();
    signal_all(tree, Signal::SIGCONT);
    result
}

fn fresh(op: &Op, agents: &[Agent], limit: Duration) -> Result<(), String> {
    op.meet("held", "the hold (every node back, stopped)", limit)?;
    if let Some(agent) = agents.iter().find(|a| serves_here(a)) {
        if let Err(why) = refresh(agent) {
            op.abort(&why);
            return Err(why);
        }
    }
    op.meet("fresh", "the refresh of the heartbeats", limit)
}

/// Holds the agent but its store, refreshes the heartbeats, lets the agent go.
fn refresh(agent: &Agent) -> Result<(), String> {
    let _hold = Hold::all_but_store(agent.pid)?;
    let mut helper = Refresher::start(agent)?;
    let said = helper.refresh().map_err(|e| {
        format!(
            "the heartbeats of torchrun's rendezvous {} at {}:{} could not be refreshed: {e}",
            agent.run_id, agent.host, agent.port
        )
    })?;
    out::line(format!(
        "torchrun: rendezvous {} at {}:{} (agent {}): {said}",
        agent.run_id, agent.host, agent.port, agent.pid
    ));
    Ok(())
}

/// The agent serves its rendezvous store on this node: it runs a TCPStore's threads and this
/// node listens on the rendezvous port (whatever address the node has now: a part restored on
/// another address keeps its old endpoint on its command line).
fn serves_here(agent: &Agent) -> bool {
    super::hold::has_store_thread(agent.pid) && listens(agent.pid, agent.port)
}

/// A TCP socket of `pid`'s network namespace listens on `port`.
fn listens(pid: i32, port: u16) -> bool {
    ["tcp", "tcp6"].iter().any(|t| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{t}"))
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // local_address "ADDR:PORT" (hex), st 0A: LISTEN.
                f.len() > 3
                    && f[3] == "0A"
                    && f[1]
                        .rsplit_once(':')
                        .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                        == Some(port)
            })
    })
}

fn signal_all(pids: &[i32], sig: Signal) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid), sig);
    }
}
