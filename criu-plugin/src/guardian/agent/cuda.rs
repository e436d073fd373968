//! NVIDIA: the journaled CUDA processes, each with a worker making its driver calls, and the way
//! back to their state before the dump (locks and checkpoints undone through the driver).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::vendor::{Ctx, Moment, VendorUndo};
use super::worker::{no_driver, Job, Tracked, Worker};
use super::MAX_ALONE;
use crate::guardian::proto::{Act, Level, Op, Order, Outcome, Report};

/// The CUDA processes of the watched command.
pub(super) struct CudaUndo {
    ctx: Ctx,
    tracked: BTreeMap<i32, Tracked>,
    /// The rollback the plugin asked for has reported every process.
    settled: Arc<AtomicBool>,
}

impl CudaUndo {
    pub(super) fn new(ctx: Ctx) -> CudaUndo {
        CudaUndo {
            ctx,
            tracked: BTreeMap::new(),
            settled: Arc::new(AtomicBool::new(false)),
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
            machine: self.ctx.machine.clone(),
            out: self.ctx.out.clone(),
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
                self.ctx.out.report(&Report::Done {
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

    /// Asks NVML for the machine's GPUs on a thread of its own.
    fn inventory(&self, seq: u64) {
        let machine = self.ctx.machine.clone();
        let out = self.ctx.out.clone();
        std::thread::spawn(move || {
            let inventory = machine.cuda().and_then(|d| d.inventory());
            out.report(&Report::Inventory { seq, inventory });
        });
    }

    /// Rolls every process back and reports the outcomes once all are in.
    fn roll_back(&mut self) {
        let waiting = self.roll_back_all();
        let n = self.tracked.len();
        let out = self.ctx.out.clone();
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

    /// Queues a rollback behind whatever each process still has in flight.
    fn roll_back_all(&mut self) -> Receiver<Outcome> {
        let (tx, rx) = channel();
        for t in self.tracked.values_mut().filter(|t| !t.rolled_back) {
            t.rolled_back = true;
            let _ = t.jobs.send(Job::RollBack { done: tx.clone() });
        }
        rx
    }

    /// Returns every process to its state before the dump without CRIU, and records it.
    fn return_all(&mut self, when: &str) {
        let out = self.ctx.out.clone();
        out.log(
            Level::Error,
            format!(
                "CRIU (pid {}) ended {when}; returning the CUDA processes {} to their state \
                 before the dump",
                self.ctx.criu_pid,
                super::alone::pids(self.tracked.keys().copied())
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
                    out.log(o.level(), o.line());
                }
                Err(_) if started.elapsed() > MAX_ALONE => {
                    out.log(
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
                Err(_) => out.log(
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

impl VendorUndo for CudaUndo {
    fn take(&mut self, order: Order, files: Vec<OwnedFd>) -> Option<(Order, Vec<OwnedFd>)> {
        match order {
            Order::Track {
                pid,
                starttime,
                comm,
            } => self.track(pid, starttime, comm),
            Order::Act { seq, pid, act } => self.act(seq, pid, act),
            Order::Inventory { seq } => self.inventory(seq),
            Order::RollBack => self.roll_back(),
            other => return Some((other, files)),
        }
        None
    }

    fn pids(&self) -> Vec<i32> {
        self.tracked.keys().copied().collect()
    }

    fn is_empty(&self) -> bool {
        !self.tracked.values().any(|t| t.touched)
    }

    fn alive(&self) -> bool {
        self.tracked
            .iter()
            .any(|(p, t)| self.ctx.machine.alive(*p, t.starttime))
    }

    fn settled(&self) -> bool {
        self.settled.load(Ordering::SeqCst)
    }

    fn undoes_at(&self, moment: Moment) -> bool {
        match moment {
            // A rollback the plugin asked for is already queued: see it through.
            Moment::RollingBack => true,
            Moment::Committed => self.alive(),
            // The driver takes the calls from anyone: no need to wait for CRIU's end.
            Moment::Bye | Moment::Midway => !self.is_empty(),
        }
    }

    fn undo(&mut self, moment: Moment) {
        self.return_all(moment.when());
    }
}
