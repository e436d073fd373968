//! The guardian's side: makes every driver call the plugin asks for, keeps a journal of what
//! each process was before the dump, and watches CRIU. If CRIU goes away before the plugin's
//! `exit` has finished, the guardian finishes the job alone: it brings every process it touched
//! back to its state before the dump, or kills a half-restored tree, and says so in syslog and in
//! `gpu-guardian.log` (in the image directory on dump, CRIU's work directory on restore). For a
//! ROCm dump it holds the KFD file of each
//! process whose GPU queues the dump pauses, and restarts them if CRIU goes first ([`kfd`]).
//!
//! Calls on one process run one after another on a worker thread of their own (the driver
//! serialises them anyway, and a rollback must come after a call still in flight); calls on
//! different processes run at once. A driver call is never abandoned: a call whose caller died
//! may still land (measured: docs/driver-facts.md), so the guardian waits for each of its own
//! calls to return before it decides what is left to undo.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criu_gpu_host::thp::{Raised, Thp, Want};
use criu_gpu_image::digest::FileDigest;
use criu_gpu_image::restorable;
use rustix::event::{poll, PollFd, PollFlags};

mod alone;
mod kfd;
mod worker;

use self::kfd::KfdHold;
use self::worker::{no_driver, Job, Tracked, Worker};
use super::machine::Machine;
use super::proto::{self, Act, Level, Op, Order, Outcome, Report, Watch};

/// Threads hashing image files during a restore.
const VERIFY_THREADS: usize = 4;

/// The node's huge page policy raised by this guardian: put back when dropped, so whatever ends
/// the guardian puts it back.
struct ThpHold {
    thp: Thp,
    out: Arc<Outbox>,
}

impl Drop for ThpHold {
    fn drop(&mut self) {
        match self.thp.lower(std::process::id() as i32) {
            Ok(Some(p)) => self.out.log(
                Level::Info,
                format!("transparent huge pages put back to {}", p.as_str()),
            ),
            Ok(None) => {}
            Err(e) => self.out.log(
                Level::Warn,
                format!("the transparent huge page policy could not be put back: {e}"),
            ),
        }
    }
}

/// How long the guardian keeps going alone before it gives up waiting and says what is left.
pub const MAX_ALONE: Duration = Duration::from_secs(3600);
/// How long it waits after a successful dump for CRIU to kill the tasks.
pub const MAX_LINGER: Duration = Duration::from_secs(600);

/// Where messages go: to the plugin while it listens, to the machine's record once alone.
struct Outbox {
    link: Mutex<Option<OwnedFd>>,
    machine: Arc<dyn Machine>,
}

impl Outbox {
    /// Stops talking to the plugin: from now on messages go to the machine's record.
    fn close(&self) {
        self.link.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn report(&self, r: &Report) -> bool {
        let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        match link.as_ref() {
            Some(fd) if proto::send(fd, r) => true,
            _ => {
                *link = None;
                false
            }
        }
    }

    fn log(&self, level: Level, text: String) {
        if !self.report(&Report::Log {
            level,
            text: text.clone(),
        }) {
            self.machine.record(level, &text);
        }
    }

    fn alone(&self) -> bool {
        self.link
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }
}

/// What the guardian knows of the command it watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Calls come in; nothing is settled.
    Working,
    /// The plugin asked for a rollback.
    RolledBack,
    /// A dump succeeded: the tasks are about to be killed by CRIU.
    Committed,
    /// A restore's GPU state is back.
    Restored,
}

/// The guardian of one CRIU command.
pub struct Agent {
    watch: Watch,
    machine: Arc<dyn Machine>,
    out: Arc<Outbox>,
    link: OwnedFd,
    /// Readable once CRIU is gone (a pidfd, or a pipe in tests).
    criu: OwnedFd,
    criu_pid: i32,
    tracked: BTreeMap<i32, Tracked>,
    /// AMD: the KFD files of processes whose GPU queues the dump pauses.
    kfds: BTreeMap<i32, KfdHold>,
    phase: Phase,
    /// Restore: the restored tree as RESUME_DEVICES_LATE found it.
    tree: BTreeSet<i32>,
    /// Restore: the pids (in their own namespace) the image's processes will have.
    expected: Vec<i32>,
    bye: bool,
    /// The rollback the plugin asked for has reported every process.
    settled: Arc<AtomicBool>,
    thp: Option<ThpHold>,
}

impl Agent {
    pub fn new(
        watch: Watch,
        machine: Arc<dyn Machine>,
        link: OwnedFd,
        criu: OwnedFd,
        criu_pid: i32,
    ) -> std::io::Result<Agent> {
        let out = Arc::new(Outbox {
            link: Mutex::new(Some(link.try_clone()?)),
            machine: machine.clone(),
        });
        Ok(Agent {
            watch,
            machine,
            out,
            link,
            criu,
            criu_pid,
            tracked: BTreeMap::new(),
            kfds: BTreeMap::new(),
            phase: Phase::Working,
            tree: BTreeSet::new(),
            expected: Vec::new(),
            bye: false,
            settled: Arc::new(AtomicBool::new(false)),
            thp: None,
        })
    }

    /// Serves the plugin until its work is done or CRIU is gone, then finishes alone.
    pub fn run(mut self) {
        let driver = match self.watch.cuda() {
            true => self.machine.cuda().map(|d| d.info()),
            false => Err("this guardian serves AMD GPUs: no CUDA driver loaded".to_owned()),
        };
        self.out.report(&Report::Hello { driver });
        let mut buf = vec![0u8; proto::MAX_MESSAGE];
        let mut bye_at: Option<Instant> = None;
        loop {
            if self.bye && self.done() {
                return;
            }
            if bye_at.is_some_and(|t| t.elapsed() > MAX_LINGER) {
                self.out.log(
                    Level::Warn,
                    format!(
                        "CRIU (pid {}) has not ended the dumped processes within {} s of a \
                         successful dump; the guardian stops watching them",
                        self.criu_pid,
                        MAX_LINGER.as_secs()
                    ),
                );
                return;
            }
            let (order_waiting, criu_gone) = self.wait(Duration::from_millis(100));
            if criu_gone {
                self.drain(&mut buf);
                self.criu_gone();
                return;
            }
            if !order_waiting {
                continue;
            }
            match proto::recv_with_files::<Order>(&self.link, &mut buf) {
                Ok(Some((Order::Bye, _))) => {
                    self.bye = true;
                    bye_at = Some(Instant::now());
                    if !self.watch.restore()
                        && self.phase == Phase::Working
                        && self.tracked.values().any(|t| t.touched)
                    {
                        self.finish_alone("without settling the processes it paused");
                        return;
                    }
                }
                Ok(Some((order, files))) => self.handle(order, files),
                // The plugin's end closed without a goodbye: CRIU is going away.
                Ok(None) | Err(_) if !self.bye => {
                    self.drain(&mut buf);
                    self.criu_gone();
                    return;
                }
                Ok(None) | Err(_) => self.out.close(),
            }
        }
    }

    /// Reads every order the plugin sent before CRIU ended: what it said counts, also when a
    /// report of ours already failed (its orders stay queued on our end). A plugin end closed
    /// with reports of ours unread makes the next read fail with ECONNRESET once; the orders
    /// queued behind that are still read.
    fn drain(&mut self, buf: &mut [u8]) {
        for _ in 0..10_000 {
            if !self.order_pending() {
                return;
            }
            match proto::recv_with_files::<Order>(&self.link, &mut *buf) {
                Ok(Some((Order::Bye, _))) => self.bye = true,
                Ok(Some((order, files))) => self.handle(order, files),
                Ok(None) => return,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => continue,
                Err(_) => return,
            }
        }
    }

    /// Whether an order from the plugin is queued on the link, whatever became of our reports.
    fn order_pending(&self) -> bool {
        let mut fds = [PollFd::new(&self.link, PollFlags::IN)];
        let ts = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        poll(&mut fds, Some(&ts)).unwrap_or(0) > 0 && fds[0].revents().contains(PollFlags::IN)
    }

    /// Waits up to `timeout`: (an order is waiting, CRIU is gone).
    fn wait(&self, timeout: Duration) -> (bool, bool) {
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        if self.out.alone() {
            let mut fds = [PollFd::new(&self.criu, PollFlags::IN)];
            let n = poll(&mut fds, Some(&ts)).unwrap_or(0);
            return (false, n > 0);
        }
        let mut fds = [
            PollFd::new(&self.link, PollFlags::IN),
            PollFd::new(&self.criu, PollFlags::IN),
        ];
        if poll(&mut fds, Some(&ts)).is_err() {
            return (false, false);
        }
        (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
    }

    /// Whether nothing is left for the guardian to see through.
    fn done(&self) -> bool {
        match self.phase {
            Phase::RolledBack => self.settled.load(Ordering::SeqCst) && self.kfds.is_empty(),
            Phase::Restored => true,
            Phase::Committed => {
                self.tracked
                    .iter()
                    .all(|(pid, t)| !self.machine.alive(*pid, t.starttime))
                    && self
                        .kfds
                        .iter()
                        .all(|(pid, k)| !self.machine.alive(*pid, k.starttime))
            }
            Phase::Working => {
                self.watch.restore()
                    || (!self.tracked.values().any(|t| t.touched) && self.kfds.is_empty())
            }
        }
    }

    /// Carries out one order of the plugin; `files` came with it.
    fn handle(&mut self, order: Order, files: Vec<OwnedFd>) {
        match order {
            Order::Track {
                pid,
                starttime,
                comm,
            } => self.track(pid, starttime, comm),
            Order::Act { seq, pid, act } => self.act(seq, pid, act),
            Order::Inventory { seq } => {
                let machine = self.machine.clone();
                let out = self.out.clone();
                std::thread::spawn(move || {
                    let inventory = machine.cuda().and_then(|d| d.inventory());
                    out.report(&Report::Inventory { seq, inventory });
                });
            }
            Order::RollBack => self.roll_back(),
            Order::Commit => self.phase = Phase::Committed,
            Order::Restoring { tree } => self.tree.extend(tree.iter().map(|(p, _)| *p)),
            Order::Expect { pids } => self.expected = pids,
            Order::Restored => self.phase = Phase::Restored,
            Order::RaiseThp { seq, want } => {
                let result = self.raise_thp(want);
                self.out.report(&Report::Thp { seq, result });
            }
            Order::LowerThp => self.thp = None,
            Order::Verify { seq, files } => self.verify(seq, files),
            Order::HoldKfd {
                pid,
                starttime,
                comm,
            } => self.hold_kfd(pid, starttime, comm, files),
            Order::ReleaseKfd { pid } => self.release_kfd(pid),
            Order::Bye => self.bye = true,
        }
    }

    /// Starts a worker for process `pid`, which makes its driver calls in order.
    fn track(&mut self, pid: i32, starttime: u64, comm: String) {
        if self.tracked.contains_key(&pid) {
            return;
        }
        let (tx, rx) = channel();
        let w = Worker {
            pid,
            comm: comm.clone(),
            starttime,
            initial: None,
            machine: self.machine.clone(),
            out: self.out.clone(),
        };
        std::thread::spawn(move || w.run(rx));
        self.tracked.insert(
            pid,
            Tracked {
                comm,
                starttime,
                jobs: tx,
                touched: false,
                rolled_back: false,
            },
        );
    }

    /// Queues a driver call on process `pid`'s worker (refused for a process not tracked).
    fn act(&mut self, seq: u64, pid: i32, act: Act) {
        match self.tracked.get_mut(&pid) {
            Some(t) => {
                t.touched |= !matches!(act, Act::Probe | Act::State);
                let _ = t.jobs.send(Job::Act { seq, act });
            }
            None => {
                self.out.report(&Report::Done {
                    seq,
                    pid,
                    result: Err(no_driver(
                        Op::Probe,
                        format!("process {pid} is not tracked"),
                    )),
                });
            }
        }
    }

    /// Rolls every process back and reports the outcomes once all are in.
    fn roll_back(&mut self) {
        self.phase = Phase::RolledBack;
        let waiting = self.roll_back_all();
        let n = self.tracked.len();
        let out = self.out.clone();
        let settled = self.settled.clone();
        std::thread::spawn(move || {
            let outcomes: Vec<Outcome> = waiting.iter().take(n).collect();
            if !out.report(&Report::Settled {
                outcomes: outcomes.clone(),
            }) {
                // The plugin stopped waiting: the outcomes go to the record instead.
                for o in &outcomes {
                    out.log(o.level(), o.line());
                }
            }
            settled.store(true, Ordering::SeqCst);
        });
    }

    /// Raises the node's huge page policy, held (and put back) by the guardian.
    fn raise_thp(&mut self, want: Want) -> Result<Raised, String> {
        let Some(thp) = self.machine.leftovers().thp() else {
            return Err("not on this machine".to_owned());
        };
        let r = thp.raise(want, std::process::id() as i32);
        if matches!(r, Ok(Raised::From(_))) && self.thp.is_none() {
            self.thp = Some(ThpHold {
                thp,
                out: self.out.clone(),
            });
        }
        r.map_err(|e| e.to_string())
    }

    /// Checks image files against their digests on a thread of their own.
    fn verify(&self, seq: u64, files: Vec<FileDigest>) {
        let dir = self.machine.image_dir();
        let out = self.out.clone();
        std::thread::spawn(move || {
            let result = match dir {
                None => Err("the guardian has no image directory".to_owned()),
                // A few threads: the restore reads the same files meanwhile.
                Some(d) => {
                    restorable::verify_later(&d, &files, VERIFY_THREADS).map_err(|e| e.to_string())
                }
            };
            out.report(&Report::Verified { seq, result });
        });
    }

    /// Queues a rollback behind whatever each process still has in flight.
    fn roll_back_all(&mut self) -> Receiver<Outcome> {
        let (tx, rx) = channel();
        for t in self.tracked.values_mut().filter(|t| !t.rolled_back) {
            t.rolled_back = true;
            let _ = t.jobs.send(Job::RollBack { done: tx.clone() });
        }
        rx
    }
}
