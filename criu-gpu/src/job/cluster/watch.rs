//! This node's processes while its part of a dump runs: one that ends before the commit (a rank
//! killed, crashed, or stopped by its launcher) leaves a part that is not the job's, so the node
//! stops the dump of every node at once, instead of letting the others wait for lock rounds its
//! plugin will never report (a rank gone before CRIU's seize is simply not in the tree CRIU
//! dumps). After the commit the processes end with the dump, as they should.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use process_facts::process;

use super::op::Op;
use crate::job::facts::JobFacts;

/// How often the processes are looked at.
const EVERY: Duration = Duration::from_millis(100);

/// A process of this node's part, as the preflight saw it.
#[derive(Debug, Clone)]
pub struct Member {
    pub pid: i32,
    pub comm: String,
    pub starttime: u64,
}

impl Member {
    /// Still the same process, and not on its way out.
    fn alive(&self) -> bool {
        process::starttime(self.pid) == Some(self.starttime) && !process::is_dying(self.pid)
    }
}

pub fn members(facts: &JobFacts) -> Vec<Member> {
    facts
        .members
        .iter()
        .map(|m| Member {
            pid: m.pid,
            comm: m.comm.clone(),
            starttime: m.starttime,
        })
        .collect()
}

/// The first process of `members` that has ended, in words.
pub fn gone(members: &[Member]) -> Option<String> {
    members.iter().find(|m| !m.alive()).map(|m| {
        format!(
            "process {} ({}) of this node's part ended during the dump, before every node's \
             part was complete",
            m.pid, m.comm
        )
    })
}

/// Watches `members` until dropped or the operation is decided; the first that ends stops
/// the operation for every node.
pub struct Watch {
    done: Arc<AtomicBool>,
}

impl Watch {
    pub fn start(op: Arc<Op>, members: Vec<Member>) -> Watch {
        let done = Arc::new(AtomicBool::new(false));
        let stop = done.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) && !op.decided() {
                if let Some(why) = gone(&members) {
                    op.abort(&why);
                    return;
                }
                std::thread::sleep(EVERY);
            }
        });
        Watch { done }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}
