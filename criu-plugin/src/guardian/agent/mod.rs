//! The guardian's side: makes every driver call the plugin asks for, keeps a journal of what
//! each process was before the dump, and watches CRIU. If CRIU goes away before the plugin's
//! `exit` has finished, the guardian finishes the job alone: it brings every process it touched
//! back to its state before the dump, or kills a half-restored tree, and says so in syslog and in
//! `gpu-guardian.log` (in the image directory on dump, CRIU's work directory on restore). What
//! each GPU vendor's dump changes is put back through one interface ([`vendor`]): the CUDA
//! processes' locks and checkpoints ([`cuda`]), the paused GPU queues of ROCm processes
//! ([`kfd`]); CRIU's own leftovers are the vendors' common part ([`alone`]).
//!
//! Calls on one process run one after another on a worker thread of their own (the driver
//! serialises them anyway, and a rollback must come after a call still in flight); calls on
//! different processes run at once. A driver call is never abandoned: a call whose caller died
//! may still land (measured: docs/driver-facts.md), so the guardian waits for each of its own
//! calls to return before it decides what is left to undo.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criu_gpu_host::thp::{Raised, Thp, Want};
use criu_gpu_image::digest::FileDigest;
use criu_gpu_image::restorable;
use rustix::event::{poll, PollFd, PollFlags};

mod alone;
mod cuda;
mod kfd;
mod vendor;
mod worker;

use self::vendor::{Ctx, Moment, VendorUndo};
use super::machine::Machine;
use super::proto::{self, Level, Order, Report, Watch};

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
    /// What each GPU vendor's dump changed, to put back if CRIU ends first.
    vendors: Vec<Box<dyn VendorUndo>>,
    phase: Phase,
    /// Restore: the restored tree as RESUME_DEVICES_LATE found it.
    tree: BTreeSet<i32>,
    /// Restore: the pids (in their own namespace) the image's processes will have.
    expected: Vec<i32>,
    bye: bool,
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
        let vendors = vendor::all(&Ctx {
            machine: machine.clone(),
            out: out.clone(),
            criu_pid,
        });
        Ok(Agent {
            watch,
            machine,
            out,
            link,
            criu,
            criu_pid,
            vendors,
            phase: Phase::Working,
            tree: BTreeSet::new(),
            expected: Vec::new(),
            bye: false,
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
                        && self.finish_alone(Moment::Bye)
                    {
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
        let mut vendors = self.vendors.iter();
        match self.phase {
            Phase::RolledBack => vendors.all(|v| v.settled()),
            Phase::Restored => true,
            Phase::Committed => !vendors.any(|v| v.alive()),
            Phase::Working => self.watch.restore() || vendors.all(|v| v.is_empty()),
        }
    }

    /// Carries out one order of the plugin; `files` came with it.
    fn handle(&mut self, order: Order, files: Vec<OwnedFd>) {
        match order {
            Order::RollBack => {
                self.phase = Phase::RolledBack;
                self.hand_to_vendors(order, files);
            }
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
            Order::Bye => self.bye = true,
            order => self.hand_to_vendors(order, files),
        }
    }

    /// Hands a vendor's order to the vendor that takes it.
    fn hand_to_vendors(&mut self, order: Order, files: Vec<OwnedFd>) {
        let mut left = Some((order, files));
        for v in &mut self.vendors {
            match left.take() {
                Some((order, files)) => left = v.take(order, files),
                None => return,
            }
        }
        if let Some((order, _)) = left {
            self.out.log(
                Level::Warn,
                format!("no GPU vendor takes the order {order:?}"),
            );
        }
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
}
