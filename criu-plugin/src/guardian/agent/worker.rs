//! One worker thread per journaled process: its driver calls one after another, and the way back
//! to the state it had before the dump.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use cuda_checkpoint_ctl::driver::{code, CudaError, DeviceMap, ProcessState};

use super::Outbox;
use crate::guardian::machine::Machine;
use crate::guardian::proto::{
    Act, Answer, DriverFailure, NotReturned, Op, Outcome, Report, Returned,
};

pub(super) enum Job {
    Act { seq: u64, act: Act },
    RollBack { done: Sender<Outcome> },
}

/// One journaled process and its worker.
pub(super) struct Tracked {
    pub(super) comm: String,
    pub(super) starttime: u64,
    pub(super) jobs: Sender<Job>,
    /// A call that changes state was sent: there may be something to undo.
    pub(super) touched: bool,
    pub(super) rolled_back: bool,
}

pub(super) struct Worker {
    pub(super) pid: i32,
    pub(super) comm: String,
    pub(super) starttime: u64,
    /// The state before the dump, as the first state query found it.
    pub(super) initial: Option<ProcessState>,
    pub(super) machine: Arc<dyn Machine>,
    pub(super) out: Arc<Outbox>,
}

fn failure(op: Op, e: CudaError) -> DriverFailure {
    DriverFailure {
        op,
        code: e.code,
        name: e.name,
        description: e.description,
    }
}

pub(super) fn no_driver(op: Op, why: String) -> DriverFailure {
    DriverFailure {
        op,
        code: code::NOT_INITIALIZED,
        name: "CUDA_ERROR_NOT_INITIALIZED".into(),
        description: why,
    }
}

impl Worker {
    pub(super) fn run(mut self, jobs: Receiver<Job>) {
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
        let driver = self.machine.cuda().map_err(|e| no_driver(Op::Probe, e))?;
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
            Act::Unlock => driver
                .unlock(pid)
                .map(|()| Answer::Done)
                .map_err(|e| failure(Op::Unlock, e)),
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
    fn roll_back(&self) -> Result<Returned, NotReturned> {
        let pid = self.pid;
        let Some(initial) = self.initial else {
            // Its state was never asked: nothing was done to it.
            return Ok(Returned::Untouched);
        };
        let driver = self.machine.cuda()?;
        // A state change can race with us (another tool); look again a few times.
        for _ in 0..3 {
            if !self.machine.alive(pid, self.starttime) {
                return Ok(Returned::Gone);
            }
            let now = match driver.state(pid) {
                Ok(s) => s,
                Err(e) if e.code == code::OPERATING_SYSTEM => return Ok(Returned::Gone),
                Err(e) => return Err(e.to_string().into()),
            };
            let step = match (initial, now) {
                (want, now) if want == now => return Ok(Returned::To(now)),
                (_, ProcessState::Failed) => return Err(NotReturned::Lost),
                (ProcessState::Running | ProcessState::Locked, ProcessState::Checkpointed) => {
                    driver.restore(pid, &DeviceMap::default())
                }
                (ProcessState::Running, ProcessState::Locked) => driver.unlock(pid),
                (want, now) => {
                    return Err(format!(
                        "process {pid} ({}) is {now}, it was {want} before the dump, and the \
                         plugin never moves a process that way: someone else acted on it",
                        self.comm
                    )
                    .into())
                }
            };
            match step {
                Ok(()) => continue,
                Err(e) if e.code == code::ILLEGAL_STATE => continue,
                Err(e) => return Err(e.to_string().into()),
            }
        }
        Err(format!(
            "process {pid} ({}) kept changing state while it was being returned",
            self.comm
        )
        .into())
    }
}
