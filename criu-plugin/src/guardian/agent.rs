//! The guardian's side: makes every driver call the plugin asks for, keeps a journal of what
//! each process was before the dump, and watches CRIU. If CRIU goes away before the plugin's
//! `exit` has finished, the guardian finishes the job alone: it brings every process it touched
//! back to its state before the dump, or kills a half-restored tree, and says so in syslog and in
//! `gpu-guardian.log` in the image directory.
//!
//! Calls on one process run one after another on a worker thread of their own (the driver
//! serialises them anyway, and a rollback must come after a call still in flight); calls on
//! different processes run at once. A driver call is never abandoned: a call whose caller died
//! may still land (measured: docs/driver-facts.md), so the guardian waits for each of its own
//! calls to return before it decides what is left to undo.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::{code, CudaError, DeviceMap, DriverInfo, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;
use rustix::event::{poll, PollFd, PollFlags};

use super::proto::{
    self, Act, Answer, DriverFailure, Level, Op, Order, Outcome, Report, Returned, Watch,
};

/// The driver as the guardian uses it.
pub trait GpuDriver: Send + Sync {
    fn info(&self) -> DriverInfo;
    fn restore_tid(&self, pid: i32) -> Result<i32, CudaError>;
    fn state(&self, pid: i32) -> Result<ProcessState, CudaError>;
    fn lock(&self, pid: i32, timeout: Duration) -> Result<(), CudaError>;
    fn checkpoint(&self, pid: i32) -> Result<(), CudaError>;
    fn restore(&self, pid: i32, map: &DeviceMap) -> Result<(), CudaError>;
    fn unlock(&self, pid: i32) -> Result<(), CudaError>;
    fn inventory(&self) -> Result<Inventory, String>;
}

/// The machine the guardian acts on.
pub trait Machine: Send + Sync + 'static {
    fn driver(&self) -> Result<&dyn GpuDriver, String>;
    /// Whether `pid` is still the process that started at `starttime` (not a reused pid).
    fn alive(&self, pid: i32, starttime: u64) -> bool;
    fn kill(&self, pid: i32);
    /// The descendants of `pid` with their start times.
    fn descendants(&self, pid: i32) -> Vec<(i32, u64)>;
    /// `pid`'s start time if it started no earlier than this process (not an older process
    /// that happens to have that pid).
    fn started_since_me(&self, pid: i32) -> Option<u64>;
    /// Where the guardian writes when CRIU is gone: syslog and the image directory's log.
    fn record(&self, level: Level, line: &str);
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

enum Job {
    Act { seq: u64, act: Act },
    RollBack { done: Sender<Outcome> },
}

/// One journaled process and its worker.
struct Tracked {
    comm: String,
    starttime: u64,
    jobs: Sender<Job>,
    /// A call that changes state was sent: there may be something to undo.
    touched: bool,
    rolled_back: bool,
}

struct Worker {
    pid: i32,
    comm: String,
    starttime: u64,
    /// The state before the dump, as the first state query found it.
    initial: Option<ProcessState>,
    machine: Arc<dyn Machine>,
    out: Arc<Outbox>,
}

fn failure(op: Op, e: CudaError) -> DriverFailure {
    DriverFailure {
        op,
        code: e.code,
        name: e.name,
        description: e.description,
    }
}

fn no_driver(op: Op, why: String) -> DriverFailure {
    DriverFailure {
        op,
        code: code::NOT_INITIALIZED,
        name: "CUDA_ERROR_NOT_INITIALIZED".into(),
        description: why,
    }
}

impl Worker {
    fn run(mut self, jobs: Receiver<Job>) {
        for job in jobs {
            match job {
                Job::Act { seq, act } => {
                    let result = self.act(&act);
                    match (&result, &act) {
                        (Ok(Answer::State(state)), _) => {
                            self.initial.get_or_insert(*state);
                        }
                        // A lock only succeeds on a running process.
                        (Ok(_), Act::Lock { .. }) => {
                            self.initial.get_or_insert(ProcessState::Running);
                        }
                        _ => {}
                    }
                    self.out.report(&Report::Done {
                        seq,
                        pid: self.pid,
                        result,
                    });
                }
                Job::RollBack { done } => {
                    let result = self.roll_back();
                    let _ = done.send(Outcome {
                        pid: self.pid,
                        comm: self.comm.clone(),
                        result,
                    });
                }
            }
        }
    }

    fn act(&self, act: &Act) -> Result<Answer, DriverFailure> {
        let driver = self.machine.driver().map_err(|e| no_driver(Op::Probe, e))?;
        let pid = self.pid;
        match act {
            Act::Probe => driver
                .restore_tid(pid)
                .map(Answer::Thread)
                .map_err(|e| failure(Op::Probe, e)),
            Act::State => driver
                .state(pid)
                .map(Answer::State)
                .map_err(|e| failure(Op::State, e)),
            Act::Lock { timeout_ms } => driver
                .lock(pid, Duration::from_millis(*timeout_ms as u64))
                .map(|()| Answer::Done)
                .map_err(|e| failure(Op::Lock, e)),
            Act::Checkpoint => driver
                .checkpoint(pid)
                .map(|()| Answer::Done)
                .map_err(|e| failure(Op::Checkpoint, e)),
            Act::Resume { pairs, unlock } => {
                let map = DeviceMap::new(pairs.clone()).map_err(|e| DriverFailure {
                    op: Op::Restore,
                    code: code::INVALID_VALUE,
                    name: "CUDA_ERROR_INVALID_VALUE".into(),
                    description: e.to_string(),
                })?;
                driver
                    .restore(pid, &map)
                    .map_err(|e| failure(Op::Restore, e))?;
                if *unlock {
                    driver.unlock(pid).map_err(|e| failure(Op::Unlock, e))?;
                }
                Ok(Answer::Done)
            }
        }
    }

    /// Drives the process from the state the driver reports back to its state before the dump.
    fn roll_back(&self) -> Result<Returned, String> {
        let pid = self.pid;
        let Some(initial) = self.initial else {
            // Its state was never asked: nothing was done to it.
            return Ok(Returned::Untouched);
        };
        let driver = self.machine.driver()?;
        // A state change can race with us (another tool); look again a few times.
        for _ in 0..3 {
            if !self.machine.alive(pid, self.starttime) {
                return Ok(Returned::Gone);
            }
            let now = match driver.state(pid) {
                Ok(s) => s,
                Err(e) if e.code == code::OPERATING_SYSTEM => return Ok(Returned::Gone),
                Err(e) => return Err(e.to_string()),
            };
            let step = match (initial, now) {
                (want, now) if want == now => return Ok(Returned::To(now)),
                (_, ProcessState::Failed) => {
                    return Err(format!(
                        "the GPU state of process {pid} ({}) is lost: the driver reports it failed",
                        self.comm
                    ))
                }
                (ProcessState::Running | ProcessState::Locked, ProcessState::Checkpointed) => {
                    driver.restore(pid, &DeviceMap::default())
                }
                (ProcessState::Running, ProcessState::Locked) => driver.unlock(pid),
                (want, now) => {
                    return Err(format!(
                        "process {pid} ({}) is {now}, it was {want} before the dump, and the \
                         plugin never moves a process that way: someone else acted on it",
                        self.comm
                    ))
                }
            };
            match step {
                Ok(()) => continue,
                Err(e) if e.code == code::ILLEGAL_STATE => continue,
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!(
            "process {pid} ({}) kept changing state while it was being returned",
            self.comm
        ))
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
    phase: Phase,
    /// Restore: the restored tree as seen so far, killed if CRIU dies before the GPU state is back.
    tree: BTreeSet<(i32, u64)>,
    /// Restore: pids the restored processes will have.
    expected: Vec<i32>,
    bye: bool,
    /// The rollback the plugin asked for has reported every process.
    settled: Arc<AtomicBool>,
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
            phase: Phase::Working,
            tree: BTreeSet::new(),
            expected: Vec::new(),
            bye: false,
            settled: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Serves the plugin until its work is done or CRIU is gone, then finishes alone.
    pub fn run(mut self) {
        let driver = self.machine.driver().map(|d| d.info());
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
            // Watching a restore, CRIU's new children are looked for often: a restore of a small
            // tree is done in tens of milliseconds.
            let tick = if self.watch == Watch::Restore {
                20
            } else {
                100
            };
            let (order_waiting, criu_gone) = self.wait(Duration::from_millis(tick));
            if self.watch == Watch::Restore && self.phase == Phase::Working {
                self.tree.extend(self.machine.descendants(self.criu_pid));
            }
            if criu_gone {
                // What the plugin said before CRIU ended counts: read it first.
                while !self.out.alone() && self.wait(Duration::ZERO).0 {
                    match proto::recv::<Order>(&self.link, &mut buf) {
                        Ok(Some(Order::Bye)) => self.bye = true,
                        Ok(Some(order)) => self.handle(order),
                        Ok(None) | Err(_) => self.out.close(),
                    }
                }
                self.criu_gone();
                return;
            }
            if !order_waiting {
                continue;
            }
            match proto::recv::<Order>(&self.link, &mut buf) {
                Ok(Some(Order::Bye)) => {
                    self.bye = true;
                    bye_at = Some(Instant::now());
                    if self.watch != Watch::Restore
                        && self.phase == Phase::Working
                        && self.tracked.values().any(|t| t.touched)
                    {
                        self.finish_alone("without settling the processes it paused");
                        return;
                    }
                }
                Ok(Some(order)) => self.handle(order),
                // The plugin's end closed without a goodbye: CRIU is going away.
                Ok(None) | Err(_) if !self.bye => {
                    self.criu_gone();
                    return;
                }
                Ok(None) | Err(_) => self.out.close(),
            }
        }
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
            Phase::RolledBack => self.settled.load(Ordering::SeqCst),
            Phase::Restored => true,
            Phase::Committed => self
                .tracked
                .iter()
                .all(|(pid, t)| !self.machine.alive(*pid, t.starttime)),
            Phase::Working => {
                self.watch == Watch::Restore || !self.tracked.values().any(|t| t.touched)
            }
        }
    }

    fn handle(&mut self, order: Order) {
        match order {
            Order::Track {
                pid,
                starttime,
                comm,
            } => {
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
            Order::Act { seq, pid, act } => match self.tracked.get_mut(&pid) {
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
            },
            Order::Inventory { seq } => {
                let machine = self.machine.clone();
                let out = self.out.clone();
                std::thread::spawn(move || {
                    let inventory = machine.driver().and_then(|d| d.inventory());
                    out.report(&Report::Inventory { seq, inventory });
                });
            }
            Order::RollBack => {
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
            Order::Commit => self.phase = Phase::Committed,
            Order::Restoring { tree } => self.tree.extend(tree),
            Order::Expect { pids } => self.expected = pids,
            Order::Restored => self.phase = Phase::Restored,
            Order::Bye => self.bye = true,
        }
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

    /// CRIU ended before the plugin had settled everything.
    fn criu_gone(&mut self) {
        self.out.close();
        let criu = self.criu_pid;
        match (self.watch, self.phase) {
            (Watch::Restore, Phase::Working) => {
                for &pid in &self.expected {
                    if let Some(st) = self.machine.started_since_me(pid) {
                        self.tree.insert((pid, st));
                    }
                }
                let alive: Vec<(i32, u64)> = self
                    .tree
                    .iter()
                    .copied()
                    .filter(|(p, st)| self.machine.alive(*p, *st))
                    .collect();
                if alive.is_empty() {
                    return;
                }
                self.out.log(
                    Level::Error,
                    format!(
                        "CRIU (pid {criu}) ended in the middle of a restore, before the GPU state \
                         was back: killing the half-restored processes {}; the images are \
                         unchanged: restore again",
                        pids(&alive)
                    ),
                );
                for (pid, _) in alive.iter().rev() {
                    self.machine.kill(*pid);
                }
            }
            (Watch::Restore, _) => {}
            (_, Phase::RolledBack) if self.settled.load(Ordering::SeqCst) => {}
            (_, Phase::RolledBack) => {
                // The rollback the plugin asked for is already queued: see it through.
                self.finish_alone("after the dump failed or the tasks were to keep running");
            }
            (_, Phase::Committed) => {
                let alive: Vec<i32> = self
                    .tracked
                    .iter()
                    .filter(|(p, t)| self.machine.alive(**p, t.starttime))
                    .map(|(p, _)| *p)
                    .collect();
                if !alive.is_empty() {
                    self.finish_alone(
                        "after a dump CRIU called successful, the dumped processes were left \
                         running (a failed post-dump script makes CRIU resume them)",
                    );
                }
            }
            _ => {
                if self.tracked.values().any(|t| t.touched) {
                    self.finish_alone("in the middle of a dump");
                }
            }
        }
    }

    /// Rolls every process back without CRIU, and records what happened.
    fn finish_alone(&mut self, when: &str) {
        let criu = self.criu_pid;
        let names: Vec<(i32, u64)> = self
            .tracked
            .iter()
            .map(|(p, t)| (*p, t.starttime))
            .collect();
        self.out.log(
            Level::Error,
            format!(
                "CRIU (pid {criu}) ended {when}; returning the CUDA processes {} to their state \
                 before the dump",
                pids(&names)
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

fn pids(list: &[(i32, u64)]) -> String {
    list.iter()
        .map(|(p, _)| p.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Outcome {
    fn level(&self) -> Level {
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
            Err(e) => format!(
                "process {pid} ({comm}) could not be returned to its state before the dump: {e}; \
                 when it can run, try `cuda-checkpoint-ctl --recover --pid {pid}`"
            ),
        }
    }
}
