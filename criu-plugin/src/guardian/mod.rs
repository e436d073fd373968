//! The guardian: a small process of its own, forked from CRIU when a command first touches GPU
//! state, that makes the driver calls for the plugin and outlives CRIU. CRIU can end at any
//! point (SIGKILL, a runtime's SIGTERM, its own `BUG()` after the seize timeout); the plugin's
//! `exit` then never runs, but the guardian sees CRIU go (a pidfd) and puts back what the plugin
//! changed (see [`agent`]).
//!
//! Its driver calls survive CRIU too: the driver finishes a call whose caller died (measured), so
//! a call made from CRIU could land after CRIU's death with nobody left to undo it. Keeping
//! libcuda and NVML out of CRIU's process also means no CUDA state is ever created in CRIU.
//!
//! For ROCm processes it holds what undoes a dump's pause of their GPU queues
//! ([`machine::amd`]).
//!
//! This module is the plugin's end: a [`Guardian`] sends orders and waits for reports, on CRIU's
//! thread, with a deadline; each request returns a typed [`Ticket`] for its reply. Log lines the
//! guardian sends are written into CRIU's log there.

// Every function here reads as named steps (clippy.toml: at most 80 lines).
#![warn(clippy::too_many_lines)]

pub mod agent;
pub mod lineage;
pub mod machine;
pub mod proto;
mod sys;
mod ticket;

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criu_gpu_host::settings::Settings;
use criu_gpu_host::thp::{Raised, Want};
use criu_gpu_image::digest::FileDigest;
use cuda_checkpoint_ctl::driver::DriverInfo;
use cuda_checkpoint_ctl::inventory::Inventory;
use rustix::event::{poll, PollFd, PollFlags};

use self::proto::{Act, Answer, Level, Order, Outcome, Report, Watch};
use self::ticket::Slot;
pub use self::ticket::{Kind, Reply, Ticket, Verified};

/// How long the guardian may take to load the driver and say so.
const HELLO: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum GuardianError {
    #[error("cannot start the guardian process: {0}")]
    Spawn(String),
    #[error(
        "the guardian process (pid {0}) ended unexpectedly; GPU processes it was acting on may \
         be left paused: run `cuda-checkpoint-ctl --recover --all`"
    )]
    Gone(i32),
    #[error("the guardian process did not start within {0:?}")]
    Silent(Duration),
}

/// Starts the guardian of a command: the C edge forks it from CRIU ([`Guardian::fork`]); tests
/// run one on a thread. Backends get one and call it when they first touch GPU state.
pub type SpawnGuardian = Arc<dyn Fn(Watch) -> Result<Guardian, GuardianError> + Send + Sync>;

/// The plugin's end of a guardian.
pub struct Guardian {
    link: OwnedFd,
    pid: i32,
    /// The guardian's greeting: the driver it loaded (it loads while CRIU goes on).
    driver: Option<Result<DriverInfo, String>>,
    next: u64,
    /// Every request's reply, by the sequence number of its [`Ticket`]: waited for (of the
    /// ticket's kind), or come.
    replies: BTreeMap<u64, Slot>,
    settled: Option<Vec<Outcome>>,
    buf: Vec<u8>,
}

/// The directories a guardian keeps handles on.
pub struct Dirs {
    /// The image directory: the image files it checks, a restore's run id.
    pub images: Option<OwnedFd>,
    /// Where its log goes (machine::LOG_FILE): the image directory on dump, CRIU's work
    /// directory on restore.
    pub log: Option<OwnedFd>,
}

impl Guardian {
    /// Forks the guardian process watching the CRIU command this process runs. Must be
    /// called while CRIU runs a single thread (hooks run on it; the plugin's own threads are
    /// all joined by then).
    /// `run_id`: this CRIU run's id, which names its network lock (taken back if CRIU dies);
    /// `dump_root`: the root of the tree a dump dumps (whose sockets are taken out of repair
    /// mode if CRIU dies); `settings`: the command's (which driver libraries to load).
    pub fn fork(
        watch: Watch,
        dirs: Dirs,
        run_id: Option<String>,
        dump_root: Option<i32>,
        settings: Arc<Settings>,
    ) -> Result<Guardian, GuardianError> {
        // A restore's forks are followed from before the first one (the guardian's own).
        let events = match watch.restore() {
            true => lineage::subscribe()
                .inspect_err(|e| {
                    tracing::debug!(
                        "no process events from the kernel ({e}): the restored processes are \
                         followed through /proc"
                    )
                })
                .ok(),
            false => None,
        };
        let keep: Vec<RawFd> = dirs
            .images
            .iter()
            .chain(dirs.log.iter())
            .chain(events.iter())
            .map(|d| d.as_raw_fd())
            .collect();
        let (link, pid) = sys::spawn(&keep, move |link, criu, criu_pid| {
            let lineage = watch
                .restore()
                .then(|| lineage::Lineage::follow(events, criu_pid));
            let machine = machine::Real::new(dirs, lineage, run_id, settings).dumping(dump_root);
            let machine = Arc::new(machine);
            if let Ok(agent) = agent::Agent::new(watch, machine, link, criu, criu_pid) {
                agent.run();
            }
        })
        .map_err(|e| GuardianError::Spawn(e.to_string()))?;
        Ok(Guardian::connect(link, pid))
    }

    /// The plugin's end of a guardian running at the other end of `link`. Orders can be sent at
    /// once; the guardian takes them once it has loaded the driver.
    pub fn connect(link: OwnedFd, pid: i32) -> Guardian {
        Guardian {
            link,
            pid,
            driver: None,
            next: 1,
            replies: BTreeMap::new(),
            settled: None,
            buf: vec![0u8; proto::MAX_MESSAGE],
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The driver the guardian loaded, or why it could not (waiting for its greeting).
    pub fn driver(&mut self) -> Result<Result<&DriverInfo, &str>, GuardianError> {
        let deadline = Instant::now() + HELLO;
        while self.driver.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(GuardianError::Silent(HELLO));
            }
            self.next_report(left.min(Duration::from_millis(50)))?;
        }
        Ok(self.loaded())
    }

    /// The driver, once the greeting came.
    pub fn loaded(&self) -> Result<&DriverInfo, &str> {
        match &self.driver {
            Some(Ok(d)) => Ok(d),
            Some(Err(e)) => Err(e),
            None => Err("the guardian has not said yet"),
        }
    }

    pub fn order(&mut self, o: &Order) -> Result<(), GuardianError> {
        if proto::send(&self.link, o) {
            Ok(())
        } else {
            Err(GuardianError::Gone(self.pid))
        }
    }

    /// Sends `order` (made with the new sequence number) and waits for a reply of kind `T`.
    fn request<T: Kind>(
        &mut self,
        order: impl FnOnce(u64) -> Order,
    ) -> Result<Ticket<T>, GuardianError> {
        let seq = self.next;
        self.next += 1;
        self.order(&order(seq))?;
        self.replies.insert(seq, Slot::waiting::<T>());
        Ok(Ticket::new(seq))
    }

    /// Sends a driver call; its answer is taken with [`Guardian::take`] once it came.
    pub fn act(&mut self, pid: i32, act: Act) -> Result<Ticket<Answer>, GuardianError> {
        self.request(|seq| Order::Act { seq, pid, act })
    }

    /// Asks for NVML's view of the machine.
    pub fn ask_inventory(&mut self) -> Result<Ticket<Inventory>, GuardianError> {
        self.request(|seq| Order::Inventory { seq })
    }

    /// Asks the guardian to raise the node's huge page policy (see [`criu_gpu_host::thp`]).
    pub fn raise_thp(&mut self, want: Want) -> Result<Ticket<Raised>, GuardianError> {
        self.request(|seq| Order::RaiseThp { seq, want })
    }

    /// Has the guardian check image files against their digests while CRIU goes on.
    pub fn verify(&mut self, files: Vec<FileDigest>) -> Result<Ticket<Verified>, GuardianError> {
        self.request(|seq| Order::Verify { seq, files })
    }

    /// The reply to `ticket`, once it came (then it is gone from here).
    pub fn take<T: Kind>(&mut self, ticket: Ticket<T>) -> Option<T::Result> {
        if !self.has(ticket) {
            return None;
        }
        match self.replies.remove(&ticket.seq()) {
            Some(Slot::Came(reply)) => T::open(reply),
            _ => None,
        }
    }

    /// Whether the reply to `ticket` came.
    pub fn has<T: Kind>(&self, ticket: Ticket<T>) -> bool {
        matches!(self.replies.get(&ticket.seq()), Some(Slot::Came(r)) if T::is(r))
    }

    /// Hands the guardian a KFD file of process `pid` before its GPU queues are paused through
    /// it: if CRIU ends before [`Order::ReleaseKfd`], the guardian restarts them (see
    /// [`agent`]). The guardian holds the file from the moment this returns, also if CRIU dies
    /// right after.
    pub fn hold_kfd(
        &mut self,
        pid: i32,
        starttime: u64,
        comm: String,
        file: BorrowedFd<'_>,
    ) -> Result<(), GuardianError> {
        let order = Order::HoldKfd {
            pid,
            starttime,
            comm,
        };
        if proto::send_with_fd(&self.link, &order, file) {
            Ok(())
        } else {
            Err(GuardianError::Gone(self.pid))
        }
    }

    pub fn has_settled(&self) -> bool {
        self.settled.is_some()
    }

    pub fn take_settled(&mut self) -> Option<Vec<Outcome>> {
        self.settled.take()
    }

    /// Takes reports until `ready` holds or `deadline` passes (then `Ok(false)`); `tick` runs
    /// at least every 50 ms (the thread window watches its threads there).
    pub fn wait_until(
        &mut self,
        deadline: Instant,
        tick: &mut dyn FnMut(),
        ready: &dyn Fn(&Guardian) -> bool,
    ) -> Result<bool, GuardianError> {
        loop {
            tick();
            if ready(self) {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            self.next_report(left.min(Duration::from_millis(50)))?;
        }
    }

    /// Waits for the replies to every one of `tickets` (see [`Guardian::wait_until`]).
    pub fn wait_all<T: Kind>(
        &mut self,
        tickets: &[Ticket<T>],
        deadline: Instant,
        tick: &mut dyn FnMut(),
    ) -> Result<bool, GuardianError> {
        self.wait_until(deadline, tick, &|g| tickets.iter().all(|t| g.has(*t)))
    }

    /// Reads one report if one comes within `within`, filing it; logs go to CRIU's log now.
    fn next_report(&mut self, within: Duration) -> Result<Option<Report>, GuardianError> {
        let ts = rustix::time::Timespec {
            tv_sec: within.as_secs() as i64,
            tv_nsec: within.subsec_nanos() as i64,
        };
        let mut fds = [PollFd::new(&self.link, PollFlags::IN)];
        match poll(&mut fds, Some(&ts)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => return Ok(None),
            Ok(_) => {}
            Err(_) => return Err(GuardianError::Gone(self.pid)),
        }
        let report = match proto::recv::<Report>(&self.link, &mut self.buf) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => return Err(GuardianError::Gone(self.pid)),
        };
        match &report {
            Report::Done { seq, result, .. } => self.file(*seq, Reply::Answer(result.clone())),
            Report::Inventory { seq, inventory } => {
                self.file(*seq, Reply::Inventory(inventory.clone()))
            }
            Report::Thp { seq, result } => self.file(*seq, Reply::Thp(result.clone())),
            Report::Verified { seq, result } => self.file(*seq, Reply::Verified(result.clone())),
            Report::Settled { outcomes } => self.settled = Some(outcomes.clone()),
            Report::Log { level, text } => log(*level, text),
            Report::Hello { driver } => self.driver = Some(driver.clone()),
        }
        Ok(Some(report))
    }

    /// Files a reply under its ticket, if a ticket of that kind waits for it: a reply of
    /// another kind (a confused guardian) is never taken for the one waited for.
    fn file(&mut self, seq: u64, reply: Reply) {
        match self.replies.get_mut(&seq) {
            Some(slot) if slot.waits_for(&reply) => *slot = Slot::Came(reply),
            _ => tracing::debug!(
                "the guardian answered request {seq}, which did not ask for {reply:?}; ignored"
            ),
        }
    }
}

fn log(level: Level, text: &str) {
    match level {
        Level::Error => tracing::error!("{text}"),
        Level::Warn => tracing::warn!("{text}"),
        Level::Info => tracing::info!("{text}"),
        Level::Debug => tracing::debug!("{text}"),
    }
}

/// Stands for CRIU to a guardian run on a thread ([`in_thread`]): while it is held, "CRIU" lives;
/// dropping it is CRIU ending.
pub struct Watched {
    alive: OwnedFd,
    agent: std::thread::JoinHandle<()>,
}

impl Watched {
    /// CRIU ends; the guardian's thread is returned, so that a test can wait until the guardian
    /// has done all it does alone before it looks for what it must not have done.
    pub fn end(self) -> std::thread::JoinHandle<()> {
        drop(self.alive);
        self.agent
    }
}

/// A guardian on a thread of this process over a socketpair, for tools outside CRIU
/// (`criu-gpu-check`) and tests (with a fake machine).
pub fn in_thread(
    watch: Watch,
    machine: Arc<dyn machine::Machine>,
) -> Result<(Guardian, Watched), GuardianError> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    let spawn = |e: std::io::Error| GuardianError::Spawn(e.to_string());
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| spawn(e.into()))?;
    let (gone_r, gone_w) = rustix::pipe::pipe().map_err(|e| spawn(e.into()))?;
    let agent = agent::Agent::new(watch, machine, theirs, gone_r, std::process::id() as i32)
        .map_err(spawn)?;
    let agent = std::thread::spawn(move || agent.run());
    let g = Guardian::connect(ours, std::process::id() as i32);
    let alive = gone_w;
    Ok((g, Watched { alive, agent }))
}
