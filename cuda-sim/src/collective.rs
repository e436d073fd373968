//! Collectives between processes, as NCCL's kernels behave on the GPU: a rank's collective
//! kernel, once it runs, waits on the device until every rank of its group has launched the
//! matching one. A rank locked before it launched its part never launches it, so its peers'
//! kernels never finish, and a lock of a peer waits for that kernel until it gives up
//! (docs/driver-facts.md, F18: measured with two NCCL ranks on two H200s and on two H100s).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a collective waits for its peers before it fails, as NCCL's watchdog would end a
/// job whose peer is gone (PyTorch's default is 10 minutes).
pub const PEER_WAIT: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Meeting {
    arrived: u32,
    left: u32,
}

/// Where the ranks of every group meet, keyed by (group, step).
#[derive(Default)]
pub struct Rendezvous {
    meetings: Mutex<HashMap<(u64, u64), Meeting>>,
    cv: Condvar,
}

/// How often a waiting rank's kernel checks that its process is still there.
const GONE_EVERY: Duration = Duration::from_millis(100);

impl Rendezvous {
    /// Arrives at step `seq` of `group` and waits until `ranks` members have, at most `limit`.
    /// `false` when the peers did not come in time, or when `gone()` says the caller's process
    /// ended: a process that dies takes its kernels with it, so its arrival no longer counts
    /// (else a job restored to before that step would meet it there as a third rank).
    pub fn meet(
        &self,
        group: u64,
        seq: u64,
        ranks: u32,
        limit: Duration,
        gone: impl Fn() -> bool,
    ) -> bool {
        let key = (group, seq);
        let until = Instant::now() + limit;
        let mut all = self.meetings.lock().unwrap();
        all.entry(key).or_default().arrived += 1;
        self.cv.notify_all();
        loop {
            let m = all
                .get_mut(&key)
                .expect("a meeting lives until its last rank left");
            if m.arrived >= ranks {
                m.left += 1;
                if m.left >= ranks {
                    all.remove(&key);
                }
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || gone() {
                // Gone from the meeting: a later arrival waits for a full group again.
                m.arrived -= 1;
                return false;
            }
            all = self.cv.wait_timeout(all, left.min(GONE_EVERY)).unwrap().0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_rank_waits_until_its_peer_launched_the_same_step() {
        let r = Arc::new(Rendezvous::default());
        let peer = {
            let r = r.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                r.meet(1, 5, 2, PEER_WAIT, || false)
            })
        };
        let start = Instant::now();
        assert!(r.meet(1, 5, 2, PEER_WAIT, || false));
        assert!(start.elapsed() >= Duration::from_millis(90));
        assert!(peer.join().unwrap());
        assert!(r.meetings.lock().unwrap().is_empty());
    }

    #[test]
    fn a_rank_whose_peer_never_comes_gives_up_and_other_groups_do_not_count() {
        let r = Rendezvous::default();
        assert!(!r.meet(1, 5, 2, Duration::from_millis(50), || false));
        assert!(!r.meet(2, 5, 2, Duration::from_millis(50), || false));
        assert!(r.meetings.lock().unwrap().values().all(|m| m.arrived == 0));
    }

    #[test]
    fn a_rank_whose_process_died_no_longer_counts_at_its_step() {
        let r = Arc::new(Rendezvous::default());
        // A rank arrives at step 5 and its process dies there.
        let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiting = {
            let (r, dead) = (r.clone(), dead.clone());
            std::thread::spawn(move || {
                r.meet(1, 5, 2, PEER_WAIT, || {
                    dead.load(std::sync::atomic::Ordering::Relaxed)
                })
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        dead.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(!waiting.join().unwrap());
        // Restored to before step 5, both ranks meet there, as two, and nothing is left over.
        let peer = {
            let r = r.clone();
            std::thread::spawn(move || r.meet(1, 5, 2, PEER_WAIT, || false))
        };
        assert!(r.meet(1, 5, 2, PEER_WAIT, || false));
        assert!(peer.join().unwrap());
        assert!(r.meetings.lock().unwrap().is_empty());
    }
}
