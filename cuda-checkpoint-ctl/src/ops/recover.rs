//! Bringing a process back to running after an interrupted checkpoint (CRIU killed, a tool
//! that gave up): wait for the action still in progress, then undo whatever state it left.
//!
//! An orphaned action goes on after its caller died once the driver took it, and the state
//! cannot be read until it ends (docs/driver-facts.md, F3 and F4), so a recovery first waits,
//! bounded, then acts on the state that action left, and reads again if another controller
//! raced it (F6: such an action answers CUDA_ERROR_ILLEGAL_STATE).

use std::time::{Duration, Instant};

use crate::driver::{code, Call, DeviceMap, ProcessState};
use crate::error::{Error, Result};
use crate::ops::target::Target;
use crate::ops::Timings;
use process_facts::process;

/// How many times another controller may change the state under us before we give up.
const RACES: usize = 5;
/// After this long without the state, say what we are waiting for.
const PATIENCE: Duration = Duration::from_secs(1);
const PAUSE: Duration = Duration::from_millis(50);

/// Drives `t` back to running: checkpointed -> restore (onto `map`) -> unlock, locked ->
/// unlock. Fails loudly on a process whose GPU state is lost. `first` receives the state found.
pub fn recover(
    t: &Target,
    map: &DeviceMap,
    tm: &mut Timings,
    first: &mut Option<ProcessState>,
) -> Result<()> {
    let deadline = t.wait.map(|w| Instant::now() + w);
    for _ in 0..RACES {
        let state = settled_state(t, deadline)?;
        first.get_or_insert(state);
        let step = match state {
            ProcessState::Running => return Ok(()),
            ProcessState::Failed => {
                return Err(Error::GpuStateLost {
                    pid: t.pid,
                    comm: t.comm.clone(),
                })
            }
            ProcessState::Locked => t.unlock(tm),
            ProcessState::Checkpointed => restore(t, map, tm).and_then(|()| t.unlock(tm)),
            ProcessState::Checkpointing | ProcessState::Restoring => {
                std::thread::sleep(PAUSE);
                continue;
            }
            ProcessState::Unknown(_) => {
                return Err(Error::WrongState {
                    pid: t.pid,
                    state,
                    why: "a state this tool does not know; see the driver's documentation",
                })
            }
        };
        match step {
            Ok(()) => {}
            Err(Error::Cuda(c)) if matches!(c.code, code::ILLEGAL_STATE | code::NOT_READY) => {
                tracing::info!(pid = t.pid, error = %c, "the state changed under us; reading it again");
                std::thread::sleep(PAUSE);
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::Raced {
        pid: t.pid,
        comm: t.comm.clone(),
    })
}

fn restore(t: &Target, map: &DeviceMap, tm: &mut Timings) -> Result<()> {
    t.restore(map, tm).map_err(|e| match e {
        // The process is there, yet the driver answers as if it were not: F10.
        Error::Cuda(source) if source.code == code::OPERATING_SYSTEM && process::exists(t.pid) => {
            Error::Unrestorable {
                pid: t.pid,
                comm: t.comm.clone(),
                source,
            }
        }
        other => other,
    })
}

/// The state once no action is in progress (F4), waiting until `deadline` at most, or until
/// the process has stayed held for a while (it cannot finish then).
fn settled_state(t: &Target, deadline: Option<Instant>) -> Result<ProcessState> {
    let start = Instant::now();
    let pid = t.pid;
    let pending = t.driver.start(move |d| d.state(pid));
    let first_look = deadline.map_or(PATIENCE, |d| {
        d.saturating_duration_since(start).min(PATIENCE)
    });
    if let Some(r) = pending.wait_for(first_look) {
        return Ok(r?);
    }
    tracing::warn!(
        "waiting for an action in progress on process {pid} ({})",
        t.comm
    );
    t.finish(Call::GetState, pending, start, deadline)
}
