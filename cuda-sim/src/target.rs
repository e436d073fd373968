//! The simulated driver inside a CUDA process: contexts, device memory, "kernels", the API lock,
//! and the helper ("restore") thread that carries out checkpoint actions.
//!
//! Semantics reproduced from NVIDIA's driver (../shared/notes/cuda-driver-facts.md):
//! * `lock` stops new CUDA calls at their entry and waits for calls in progress and submitted
//!   work to finish; with a timeout it gives up and leaves the process running.
//! * `checkpoint` (locked only) copies device memory into the process's own memory and closes
//!   the device connection; the device frees the memory.
//! * `restore` (checkpointed only) reconnects, reallocates at the same device addresses
//!   (optionally on other GPUs, by UUID pairs) and copies the data back; the process stays locked.
//! * `unlock` (locked only) lets CUDA calls run again.
//! * Wrong state: `CUDA_ERROR_ILLEGAL_STATE`. Every action runs on the helper thread, so a
//!   stopped process cannot complete one.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, Once, OnceLock};
use std::time::{Duration, Instant};

use crate::control::{state, ControlBlock, Op, Request as CtlRequest, MEMFD_FD_MIN, MEMFD_NAME};
use crate::errors::code;
use crate::proto::{self, DeviceDesc, Reply, Request, CHUNK};
use crate::shm::{self, ControlPage, HostBuf};

/// First device address handed out; allocations are 2 MiB aligned, like the real driver's.
const VA_BASE: u64 = 0x7e00_0000_0000;
const VA_ALIGN: u64 = 2 << 20;

pub type CuResult<T> = Result<T, u32>;

/// The API lock.
#[derive(Default)]
struct Gate {
    m: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Locked by the checkpoint API: calls wait at their entry.
    locked: bool,
    /// A lock is being taken: new calls wait, calls in progress finish.
    closing: bool,
    /// Calls in progress.
    active: usize,
}

struct GateGuard<'a>(&'a Gate);

impl Gate {
    fn enter(&self) -> GateGuard<'_> {
        let mut g = self.m.lock().unwrap();
        while g.locked || g.closing {
            g = self.cv.wait(g).unwrap();
        }
        g.active += 1;
        GateGuard(self)
    }

    /// Stops new calls and waits for the running ones, until `deadline`.
    fn close(&self, deadline: Option<Instant>) -> bool {
        let mut g = self.m.lock().unwrap();
        g.closing = true;
        while g.active > 0 {
            match deadline {
                None => g = self.cv.wait(g).unwrap(),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        g.closing = false;
                        self.cv.notify_all();
                        return false;
                    }
                    g = self.cv.wait_timeout(g, left).unwrap().0;
                }
            }
        }
        true
    }

    fn set(&self, locked: bool) {
        let mut g = self.m.lock().unwrap();
        g.locked = locked;
        g.closing = false;
        self.cv.notify_all();
    }
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        let mut g = self.0.m.lock().unwrap();
        g.active -= 1;
        self.0.cv.notify_all();
    }
}

/// The connection to the GPU daemon: the "device file".
#[derive(Default)]
struct Link {
    stream: Option<UnixStream>,
    /// Submitted asynchronous work not yet completed.
    pending: usize,
    /// First error of asynchronous work, reported by the next synchronising call.
    sticky: u32,
}

fn lost(_: std::io::Error) -> u32 {
    code::UNKNOWN
}

impl Link {
    fn stream(&mut self) -> CuResult<&mut UnixStream> {
        self.stream.as_mut().ok_or(code::NOT_INITIALIZED)
    }

    /// Waits for submitted work, until `deadline`.
    fn drain(&mut self, deadline: Option<Instant>) -> CuResult<()> {
        while self.pending > 0 {
            let s = self.stream()?;
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                let ts = rustix::time::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: left.subsec_nanos() as i64,
                };
                let mut fds = [rustix::event::PollFd::new(
                    &*s,
                    rustix::event::PollFlags::IN,
                )];
                if rustix::event::poll(&mut fds, Some(&ts)).map_err(|_| code::UNKNOWN)? == 0 {
                    return Err(code::TIMEOUT);
                }
            }
            let answer = proto::recv_answer(s).map_err(lost)?;
            self.pending -= 1;
            if let Err(c) = answer {
                if self.sticky == 0 {
                    self.sticky = c;
                }
            }
        }
        match std::mem::take(&mut self.sticky) {
            0 => Ok(()),
            c => Err(c),
        }
    }

    fn call(&mut self, req: &Request) -> CuResult<Reply> {
        self.drain(None)?;
        let s = self.stream()?;
        req.send(s).and_then(|()| s.flush()).map_err(lost)?;
        proto::recv_answer(s).map_err(lost)?
    }

    fn submit(&mut self, req: &Request) -> CuResult<()> {
        let s = self.stream()?;
        req.send(s).map_err(lost)?;
        self.pending += 1;
        Ok(())
    }

    fn write(&mut self, dptr: u64, offset: u64, data: &[u8]) -> CuResult<()> {
        self.drain(None)?;
        let s = self.stream()?;
        proto::send_write(s, dptr, offset, data).map_err(lost)?;
        proto::recv_answer(s).map_err(lost)?.map(|_| ())
    }

    fn read(&mut self, dptr: u64, offset: u64, dst: &mut [u8]) -> CuResult<()> {
        self.drain(None)?;
        let s = self.stream()?;
        Request::Read {
            dptr,
            offset,
            len: dst.len() as u64,
        }
        .send(s)
        .map_err(lost)?;
        proto::recv_data_into(s, dst).map_err(lost)?
    }
}

fn connect(socket: &str) -> CuResult<(UnixStream, Vec<DeviceDesc>)> {
    let mut s = UnixStream::connect(socket).map_err(|_| code::NO_DEVICE)?;
    Request::Hello { app: true }.send(&mut s).map_err(lost)?;
    match proto::recv_answer(&mut s).map_err(lost)?? {
        Reply::Hello { devices, .. } if !devices.is_empty() => Ok((s, devices)),
        _ => Err(code::NO_DEVICE),
    }
}

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
    devices: Mutex<Vec<DeviceDesc>>,
    allocs: Mutex<BTreeMap<u64, Alloc>>,
    next_va: AtomicU64,
    ctl: ControlPage,
    /// Kept open so a controller finds the page in /proc/PID/fd.
    _ctl_fd: OwnedFd,
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
        let socket = proto::socket_path();
        let (stream, devices) = connect(&socket)?;
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
            link: Mutex::new(Link {
                stream: Some(stream),
                ..Link::default()
            }),
            devices: Mutex::new(devices),
            allocs: Mutex::new(BTreeMap::new()),
            next_va: AtomicU64::new(VA_BASE),
            ctl,
            _ctl_fd: fd,
        })
    }

    fn link(&self) -> MutexGuard<'_, Link> {
        self.link.lock().unwrap()
    }

    pub fn devices(&self) -> Vec<DeviceDesc> {
        self.devices.lock().unwrap().clone()
    }

    pub fn device(&self, ordinal: u32) -> CuResult<DeviceDesc> {
        self.devices()
            .get(ordinal as usize)
            .cloned()
            .ok_or(code::INVALID_DEVICE)
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
        let device = self.current()?;
        let uuid = self.device(device)?.uuid;
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

    pub fn synchronize(&self) -> CuResult<()> {
        self.link().drain(None)
    }

    pub fn mem_info(&self) -> CuResult<(u64, u64)> {
        let device = self.current()?;
        match self.link().call(&Request::MemInfo { device })? {
            Reply::MemInfo { free, total } => Ok((free, total)),
            _ => Err(code::UNKNOWN),
        }
    }

    // ---- the helper thread ----

    fn block(&self) -> &ControlBlock {
        self.ctl.block()
    }

    fn serve_controller(&self) -> ! {
        loop {
            let req = self.block().next_request();
            let result = self.perform(&req);
            self.block().complete(result);
        }
    }

    fn perform(&self, req: &CtlRequest) -> u32 {
        let needed = match req.op {
            Op::Lock => state::RUNNING,
            Op::Checkpoint | Op::Unlock => state::LOCKED,
            Op::Restore => state::CHECKPOINTED,
        };
        if self.block().state() != needed {
            return code::ILLEGAL_STATE;
        }
        if req.fault != 0 {
            return req.fault;
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
        };
        result.err().unwrap_or(code::SUCCESS)
    }

    fn lock(&self, timeout_ms: u32) -> CuResult<()> {
        let deadline =
            (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
        if !self.gate.close(deadline) {
            return Err(code::TIMEOUT);
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
            if e != code::OUT_OF_MEMORY {
                // The device went away under us: nothing consistent is left to go back to.
                self.block().set_state(state::FAILED);
            }
            return Err(e);
        }
        // Let go of the device: the daemon frees the device memory.
        *link = Link::default();
        SOCKET_FD.store(-1, Ordering::SeqCst);
        self.block().set_state(state::CHECKPOINTED);
        Ok(())
    }

    fn restore(&self, pairs: &[([u8; 16], [u8; 16])]) -> CuResult<()> {
        let mut current = self.link();
        let (stream, devices) = connect(&self.socket)?;
        let mut link = Link {
            stream: Some(stream),
            ..Link::default()
        };
        let mut allocs = self.allocs.lock().unwrap();
        let mut placed = Vec::new();
        for (&dptr, a) in allocs.iter() {
            let uuid = if pairs.is_empty() {
                a.uuid
            } else {
                // Once a map is given it must name every device the process used.
                pairs
                    .iter()
                    .find(|(old, _)| *old == a.uuid)
                    .map(|(_, new)| *new)
                    .ok_or(code::INVALID_VALUE)?
            };
            let device = devices
                .iter()
                .position(|d| d.uuid == uuid)
                .ok_or(code::INVALID_DEVICE)? as u32;
            // An error drops `link`, and with it everything allocated so far.
            link.call(&Request::Alloc {
                device,
                dptr,
                size: a.size,
            })?;
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
        *self.devices.lock().unwrap() = devices;
        SOCKET_FD.store(
            link.stream.as_ref().map_or(-1, |s| s.as_raw_fd()),
            Ordering::SeqCst,
        );
        *current = link;
        self.block().set_state(state::LOCKED);
        Ok(())
    }
}
