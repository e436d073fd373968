//! The simulated driver inside a CUDA process: contexts, device memory, "kernels", the API lock,
//! and the helper ("restore") thread that carries out checkpoint actions ([`helper`]).
//!
//! Semantics reproduced from NVIDIA's driver (docs/driver-facts.md):
//! * `lock` stops new CUDA calls at their entry and waits for calls in progress and submitted
//!   work to finish; with a timeout, counted from when the helper takes the request, it gives
//!   up with CUDA_ERROR_NOT_READY and leaves the process running (F1, F2).
//! * `checkpoint` (locked only) copies device memory into the process's own memory and closes
//!   the device connection; the device frees the memory. The GPUs the driver saw are recorded.
//! * `restore` (checkpointed only) reconnects, reallocates at the same device addresses
//!   (optionally on other GPUs, by a complete map of the recorded GPUs, F8) and copies the data
//!   back; the process stays locked. Without room on the GPU it fails and the process cannot be
//!   restored any more (F10).
//! * `unlock` (locked only) lets CUDA calls run again.
//! * Wrong state: `CUDA_ERROR_ILLEGAL_STATE` (F6). Every action runs on the helper thread, so a
//!   stopped process cannot complete one (F2).
//! * Device ordinals are the GPUs `CUDA_VISIBLE_DEVICES` shows, read once at `cuInit` (F21,
//!   [`crate::visible`]); memory, the checkpoint's record of GPUs (F8) and restore maps are the
//!   machine's GPUs, by UUID.

mod gate;
mod helper;
mod link;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock};

use self::gate::Gate;
pub use self::helper::check_pairs;
use self::link::{connect, Link};
use crate::control::{MEMFD_FD_MIN, MEMFD_NAME};
use crate::errors::code;
use crate::proto::{self, DeviceDesc, Reply, Request, CHUNK};
use crate::shm::{self, ControlPage, HostBuf};
use crate::visible;

/// First device address handed out; allocations are 2 MiB aligned, like the real driver's.
const VA_BASE: u64 = 0x7e00_0000_0000;
const VA_ALIGN: u64 = 2 << 20;

pub type CuResult<T> = Result<T, u32>;

/// One device allocation.
struct Alloc {
    size: u64,
    device: u32,
    uuid: [u8; 16],
    /// The contents while the process is checkpointed.
    host: Option<HostBuf>,
}

pub struct Runtime {
    socket: String,
    gate: Gate,
    link: Mutex<Link>,
    /// Every GPU of the machine, as the daemon lists them (nvidia-smi's order).
    gpus: Mutex<Vec<DeviceDesc>>,
    /// The GPUs this process enumerates, by UUID: device ordinal N is the Nth (F21).
    visible: Mutex<Vec<[u8; 16]>>,
    allocs: Mutex<BTreeMap<u64, Alloc>>,
    next_va: AtomicU64,
    /// The GPUs the driver saw at the last checkpoint: a restore map must name each (F8).
    checkpoint_gpus: Mutex<Vec<[u8; 16]>>,
    /// Set when a restore failed for lack of GPU memory: no restore works after that (F10).
    unrestorable: AtomicBool,
    /// Set when a checkpoint failed: the driver answers every later one UNKNOWN (F19).
    uncheckpointable: AtomicBool,
    ctl: ControlPage,
    /// Kept open so a controller finds the page in /proc/PID/fd; the helper's own description
    /// of it, through which it sees the controllers' locks.
    ctl_fd: OwnedFd,
}

static RUNTIME: OnceLock<CuResult<Runtime>> = OnceLock::new();
static HELPER: Once = Once::new();
/// Set in a forked child: CUDA state belongs to the parent.
static FORKED: AtomicBool = AtomicBool::new(false);
static CTL_FD: AtomicI32 = AtomicI32::new(-1);
static SOCKET_FD: AtomicI32 = AtomicI32::new(-1);

thread_local! {
    static CURRENT_DEVICE: Cell<Option<u32>> = const { Cell::new(None) };
}

extern "C" fn after_fork_in_child() {
    FORKED.store(true, Ordering::SeqCst);
    shm::close_raw(CTL_FD.load(Ordering::SeqCst));
    shm::close_raw(SOCKET_FD.load(Ordering::SeqCst));
}

/// `cuInit`: connects to the GPU, publishes the control page, starts the helper thread.
pub fn init() -> CuResult<()> {
    if FORKED.load(Ordering::SeqCst) {
        return Err(code::NOT_INITIALIZED);
    }
    let rt = RUNTIME
        .get_or_init(Runtime::start)
        .as_ref()
        .map_err(|c| *c)?;
    HELPER.call_once(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("cuda-restore".into())
            .spawn(move || {
                let _ = tx.send(rustix::thread::gettid().as_raw_nonzero().get());
                rt.serve_controller();
            })
            .expect("spawn the driver helper thread");
        let tid = rx.recv().expect("helper thread id");
        rt.ctl.block().restore_tid.store(tid, Ordering::SeqCst);
        shm::at_fork_child(after_fork_in_child);
    });
    Ok(())
}

/// The runtime for an API call, or the error a real driver gives before `cuInit`.
pub fn runtime() -> CuResult<&'static Runtime> {
    if FORKED.load(Ordering::SeqCst) {
        return Err(code::NOT_INITIALIZED);
    }
    match RUNTIME.get() {
        Some(Ok(rt)) => Ok(rt),
        _ => Err(code::NOT_INITIALIZED),
    }
}

/// Runs an API call through the API lock.
pub fn api<T>(f: impl FnOnce(&Runtime) -> CuResult<T>) -> CuResult<T> {
    let rt = runtime()?;
    let _g = rt.gate.enter();
    f(rt)
}

impl Runtime {
    fn start() -> CuResult<Runtime> {
        Runtime::start_on(&proto::socket_path(), visible::from_env().as_deref())
    }

    /// Connects to the daemon at `socket`, showing the GPUs `visible_spec` (the value of
    /// `CUDA_VISIBLE_DEVICES`) names; none visible: CUDA_ERROR_NO_DEVICE, as without a GPU.
    fn start_on(socket: &str, visible_spec: Option<&str>) -> CuResult<Runtime> {
        let socket = socket.to_owned();
        let (stream, gpus) = connect(&socket)?;
        let uuids: Vec<[u8; 16]> = gpus.iter().map(|d| d.uuid).collect();
        let visible: Vec<[u8; 16]> = visible::select(visible_spec, &uuids)
            .into_iter()
            .map(|i| uuids[i])
            .collect();
        if visible.is_empty() {
            return Err(code::NO_DEVICE);
        }
        let memfd = shm::control_memfd(MEMFD_NAME).map_err(|_| code::OPERATING_SYSTEM)?;
        let fd = rustix::io::fcntl_dupfd_cloexec(&memfd, MEMFD_FD_MIN)
            .map_err(|_| code::OPERATING_SYSTEM)?;
        drop(memfd);
        let ctl = ControlPage::map(&fd, true).map_err(|_| code::OPERATING_SYSTEM)?;
        ctl.block()
            .init(rustix::process::getpid().as_raw_nonzero().get(), 0);
        CTL_FD.store(fd.as_raw_fd(), Ordering::SeqCst);
        SOCKET_FD.store(stream.as_raw_fd(), Ordering::SeqCst);
        Ok(Runtime {
            socket,
            gate: Gate::default(),
            link: Mutex::new(Link::connected(stream)),
            gpus: Mutex::new(gpus),
            visible: Mutex::new(visible),
            allocs: Mutex::new(BTreeMap::new()),
            next_va: AtomicU64::new(VA_BASE),
            checkpoint_gpus: Mutex::new(Vec::new()),
            unrestorable: AtomicBool::new(false),
            uncheckpointable: AtomicBool::new(false),
            ctl,
            ctl_fd: fd,
        })
    }

    fn link(&self) -> MutexGuard<'_, Link> {
        self.link.lock().unwrap()
    }

    /// The GPUs this process enumerates, in ordinal order.
    pub fn devices(&self) -> Vec<DeviceDesc> {
        (0..).map_while(|o| self.device(o).ok()).collect()
    }

    pub fn device(&self, ordinal: u32) -> CuResult<DeviceDesc> {
        self.gpu_of(ordinal).map(|(_, d)| d)
    }

    /// Device ordinal `ordinal`: its index among the machine's GPUs (what the daemon calls it),
    /// and its description; CUDA_ERROR_INVALID_DEVICE for an ordinal the process does not see.
    fn gpu_of(&self, ordinal: u32) -> CuResult<(u32, DeviceDesc)> {
        let uuid = *self
            .visible
            .lock()
            .unwrap()
            .get(ordinal as usize)
            .ok_or(code::INVALID_DEVICE)?;
        let gpus = self.gpus.lock().unwrap();
        let index = gpus
            .iter()
            .position(|d| d.uuid == uuid)
            .ok_or(code::INVALID_DEVICE)?;
        Ok((index as u32, gpus[index].clone()))
    }

    pub fn set_current(&self, ordinal: Option<u32>) -> CuResult<()> {
        if let Some(o) = ordinal {
            self.device(o)?;
        }
        CURRENT_DEVICE.with(|c| c.set(ordinal));
        Ok(())
    }

    pub fn current(&self) -> CuResult<u32> {
        CURRENT_DEVICE
            .with(|c| c.get())
            .ok_or(code::INVALID_CONTEXT)
    }

    pub fn mem_alloc(&self, size: u64) -> CuResult<u64> {
        if size == 0 {
            return Err(code::INVALID_VALUE);
        }
        let (device, DeviceDesc { uuid, .. }) = self.gpu_of(self.current()?)?;
        let span = size.div_ceil(VA_ALIGN) * VA_ALIGN;
        let dptr = self.next_va.fetch_add(span, Ordering::SeqCst);
        self.link().call(&Request::Alloc { device, dptr, size })?;
        self.allocs.lock().unwrap().insert(
            dptr,
            Alloc {
                size,
                device,
                uuid,
                host: None,
            },
        );
        Ok(dptr)
    }

    pub fn mem_free(&self, dptr: u64) -> CuResult<()> {
        if self.allocs.lock().unwrap().remove(&dptr).is_none() {
            return Err(code::INVALID_VALUE);
        }
        self.link().call(&Request::Free { dptr }).map(|_| ())
    }

    /// The allocation holding `[dptr, dptr+len)`: its base and the offset into it.
    fn locate(&self, dptr: u64, len: u64) -> CuResult<(u64, u64)> {
        let allocs = self.allocs.lock().unwrap();
        let (&base, a) = allocs
            .range(..=dptr)
            .next_back()
            .ok_or(code::INVALID_VALUE)?;
        let off = dptr - base;
        if off.checked_add(len).is_none_or(|end| end > a.size) {
            return Err(code::INVALID_VALUE);
        }
        Ok((base, off))
    }

    pub fn htod(&self, dptr: u64, src: &[u8]) -> CuResult<()> {
        let (base, off) = self.locate(dptr, src.len() as u64)?;
        let mut link = self.link();
        for (i, chunk) in src.chunks(CHUNK).enumerate() {
            link.write(base, off + (i * CHUNK) as u64, chunk)?;
        }
        Ok(())
    }

    pub fn dtoh(&self, dst: &mut [u8], dptr: u64) -> CuResult<()> {
        let (base, off) = self.locate(dptr, dst.len() as u64)?;
        let mut link = self.link();
        for (i, chunk) in dst.chunks_mut(CHUNK).enumerate() {
            link.read(base, off + (i * CHUNK) as u64, chunk)?;
        }
        Ok(())
    }

    pub fn memset32(&self, dptr: u64, value: u32, count: u64, asynchronous: bool) -> CuResult<()> {
        let (base, off) = self.locate(dptr, count.saturating_mul(4))?;
        let req = Request::Memset32 {
            dptr: base,
            offset: off,
            count,
            value,
        };
        let mut link = self.link();
        if asynchronous {
            link.submit(&req)
        } else {
            link.call(&req).map(|_| ())
        }
    }

    /// A kernel that keeps the GPU busy for `ms`, submitted asynchronously.
    pub fn busy_kernel(&self, ms: u32) -> CuResult<()> {
        self.link().submit(&Request::Busy { ms })
    }

    /// A collective kernel of a job's step (see [`crate::collective`]), submitted asynchronously.
    pub fn collective(&self, group: u64, seq: u64, ranks: u32, ms: u32) -> CuResult<()> {
        self.link().submit(&Request::Collective {
            group,
            seq,
            ranks,
            ms,
        })
    }

    pub fn synchronize(&self) -> CuResult<()> {
        self.link().drain(None)
    }

    pub fn mem_info(&self) -> CuResult<(u64, u64)> {
        let (device, _) = self.gpu_of(self.current()?)?;
        match self.link().call(&Request::MemInfo { device })? {
            Reply::MemInfo { free, total } => Ok((free, total)),
            _ => Err(code::UNKNOWN),
        }
    }
}
