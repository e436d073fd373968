//! The driver's helper ("restore") thread: takes a controller's request from the control page
//! and carries it out inside the process, with the faults a test injected
//! ([`crate::fault`]). Each rule cites the measured fact it follows (docs/driver-facts.md).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::link::{connect, Link};
use super::{CuResult, Runtime, SOCKET_FD};
use crate::control::{state, ControlBlock, Op, Request};
use crate::errors::code;
use crate::fault::Fault;
use crate::proto::{Request as GpuRequest, CHUNK};
use crate::shm::HostBuf;

/// A GPU pair of a restore map: (GPU at checkpoint, GPU to restore onto).
pub type Pair = ([u8; 16], [u8; 16]);

/// F8: a restore map must name every GPU the driver saw at checkpoint exactly once on the old
/// side, and GPUs of this machine, each once, on the new side; else CUDA_ERROR_INVALID_VALUE.
pub fn check_pairs(
    at_checkpoint: &[[u8; 16]],
    present: &[[u8; 16]],
    pairs: &[Pair],
) -> CuResult<()> {
    let distinct = |side: &dyn Fn(&Pair) -> [u8; 16]| {
        pairs
            .iter()
            .enumerate()
            .all(|(i, p)| pairs[..i].iter().all(|q| side(q) != side(p)))
    };
    let complete = pairs.len() == at_checkpoint.len()
        && pairs.iter().all(|(old, _)| at_checkpoint.contains(old))
        && distinct(&|p| p.0);
    let placeable = pairs.iter().all(|(_, new)| present.contains(new)) && distinct(&|p| p.1);
    if complete && placeable {
        Ok(())
    } else {
        Err(code::INVALID_VALUE)
    }
}

/// Where a restore map sends each of `gpus` (a GPU it does not name stays).
fn moved(gpus: &[[u8; 16]], pairs: &[Pair]) -> Vec<[u8; 16]> {
    gpus.iter()
        .map(|u| {
            pairs
                .iter()
                .find(|(old, _)| old == u)
                .map_or(*u, |(_, new)| *new)
        })
        .collect()
}

impl Runtime {
    pub(super) fn block(&self) -> &ControlBlock {
        self.ctl.block()
    }

    pub(super) fn serve_controller(&self) -> ! {
        loop {
            self.serve_one();
        }
    }

    /// Takes one request, does it and posts the result.
    pub(super) fn serve_one(&self) {
        let req = self.block().next_request(&self.ctl_fd);
        let result = self.perform(&req);
        self.block().complete(result);
        if result == code::SUCCESS && req.op == Op::Lock && req.fault == Fault::Stop {
            // A Ctrl-Z between the lock and CRIU's seize: the whole process stops.
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::STOP,
            );
        }
    }

    pub(super) fn perform(&self, req: &Request) -> u32 {
        if req.op == Op::State {
            // Answered from the page once this thread gets to it (F11).
            return code::SUCCESS;
        }
        match req.fault {
            Fault::Hang => loop {
                std::thread::park();
            },
            Fault::Delay(ms) => std::thread::sleep(Duration::from_millis(ms as u64)),
            _ => {}
        }
        let needed = match req.op {
            Op::Lock => state::RUNNING,
            Op::Checkpoint | Op::Unlock => state::LOCKED,
            Op::Restore => state::CHECKPOINTED,
            Op::State => unreachable!("answered above"),
        };
        // F6: an action runs against the state the one before it left; `failed` takes none.
        if self.block().state() != needed {
            return code::ILLEGAL_STATE;
        }
        match req.fault {
            Fault::Error(c) => {
                if req.op == Op::Checkpoint {
                    self.uncheckpointable.store(true, Ordering::SeqCst);
                }
                return c;
            }
            Fault::Failed => {
                self.fail();
                return code::UNKNOWN;
            }
            _ => {}
        }
        let result = match req.op {
            Op::Lock => self.lock(req.timeout_ms),
            Op::Checkpoint => self.checkpoint(),
            Op::Restore => self.restore(&req.pairs),
            Op::Unlock => {
                self.gate.set(false);
                self.block().set_state(state::RUNNING);
                Ok(())
            }
            Op::State => Ok(()),
        };
        match (result, req.fault) {
            (Ok(()), Fault::ErrorAfter(c)) => c,
            (r, _) => r.err().unwrap_or(code::SUCCESS),
        }
    }

    /// F1: gives up with NOT_READY once `timeout_ms` passed since the helper took the request.
    fn lock(&self, timeout_ms: u32) -> CuResult<()> {
        let deadline =
            (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
        if !self.gate.close(deadline) {
            return Err(code::NOT_READY);
        }
        if let Err(e) = self.link().drain(deadline) {
            self.gate.set(false);
            return Err(e);
        }
        self.gate.set(true);
        self.block().set_state(state::LOCKED);
        Ok(())
    }

    fn checkpoint(&self) -> CuResult<()> {
        // F19: after a checkpoint that failed, the process stays locked with its data, and every
        // later checkpoint answers CUDA_ERROR_UNKNOWN before changing anything.
        if self.uncheckpointable.load(Ordering::SeqCst) {
            return Err(code::UNKNOWN);
        }
        let mut link = self.link();
        let mut allocs = self.allocs.lock().unwrap();
        let copied: CuResult<()> = allocs.iter_mut().try_for_each(|(&dptr, a)| {
            let mut host = HostBuf::new(a.size as usize).map_err(|_| code::OUT_OF_MEMORY)?;
            for (i, chunk) in host.as_mut_slice().chunks_mut(CHUNK).enumerate() {
                link.read(dptr, (i * CHUNK) as u64, chunk)?;
            }
            a.host = Some(host);
            Ok(())
        });
        if let Err(e) = copied {
            allocs.values_mut().for_each(|a| a.host = None);
            self.uncheckpointable.store(true, Ordering::SeqCst);
            if e != code::OUT_OF_MEMORY {
                // The device went away under us: nothing consistent is left to go back to.
                self.block().set_state(state::FAILED);
            }
            return Err(e);
        }
        // F8: the driver remembers every GPU it saw, not only those the process used.
        *self.checkpoint_gpus.lock().unwrap() =
            self.gpus.lock().unwrap().iter().map(|d| d.uuid).collect();
        // Let go of the device: the daemon frees the device memory.
        *link = Link::default();
        SOCKET_FD.store(-1, Ordering::SeqCst);
        self.block().set_state(state::CHECKPOINTED);
        Ok(())
    }

    fn restore(&self, pairs: &[Pair]) -> CuResult<()> {
        // F10: after a restore that ran out of GPU memory, every later restore fails with
        // CUDA_ERROR_OPERATING_SYSTEM.
        if self.unrestorable.load(Ordering::SeqCst) {
            return Err(code::OPERATING_SYSTEM);
        }
        let mut current = self.link();
        let (stream, devices) = connect(&self.socket)?;
        let present: Vec<[u8; 16]> = devices.iter().map(|d| d.uuid).collect();
        if !pairs.is_empty() {
            check_pairs(&self.checkpoint_gpus.lock().unwrap(), &present, pairs)?;
        }
        let visible = moved(&self.visible.lock().unwrap(), pairs);
        // Unmeasured: a GPU the process saw that is not here refuses the restore (stricter).
        if !visible.iter().all(|u| present.contains(u)) {
            return Err(code::INVALID_DEVICE);
        }
        let mut link = Link::connected(stream);
        let mut allocs = self.allocs.lock().unwrap();
        let mut placed = Vec::new();
        for (&dptr, a) in allocs.iter() {
            let uuid = moved(&[a.uuid], pairs)[0];
            let device = devices
                .iter()
                .position(|d| d.uuid == uuid)
                .ok_or(code::INVALID_DEVICE)? as u32;
            // An error drops `link`, and with it everything allocated so far.
            let allocated = link.call(&GpuRequest::Alloc {
                device,
                dptr,
                size: a.size,
            });
            if allocated == Err(code::OUT_OF_MEMORY) {
                self.unrestorable.store(true, Ordering::SeqCst);
            }
            allocated?;
            let host = a.host.as_ref().ok_or(code::ILLEGAL_STATE)?;
            for (i, chunk) in host.as_slice().chunks(CHUNK).enumerate() {
                link.write(dptr, (i * CHUNK) as u64, chunk)?;
            }
            placed.push((dptr, device, uuid));
        }
        for (dptr, device, uuid) in placed {
            let a = allocs.get_mut(&dptr).expect("own allocation");
            a.device = device;
            a.uuid = uuid;
            a.host = None;
        }
        *self.gpus.lock().unwrap() = devices;
        *self.visible.lock().unwrap() = visible;
        SOCKET_FD.store(
            link.stream.as_ref().map_or(-1, |s| s.as_raw_fd()),
            Ordering::SeqCst,
        );
        *current = link;
        self.block().set_state(state::LOCKED);
        Ok(())
    }

    /// The injected `failed` fault: the GPU state is lost. CUDA calls wait at the closed gate
    /// for good; only restarting the process helps.
    fn fail(&self) {
        self.gate.close(None);
        self.gate.set(true);
        *self.link() = Link::default();
        SOCKET_FD.store(-1, Ordering::SeqCst);
        self.allocs.lock().unwrap().clear();
        self.block().set_state(state::FAILED);
    }
}
