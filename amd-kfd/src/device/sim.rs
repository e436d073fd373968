//! A simulated KFD, for machines without an AMD GPU.
//!
//! Its "kernel state" lives in files under a root directory (`AMD_KFD_SIM_ROOT`):
//!
//! ```text
//! ROOT/topology/            the machine's GPUs, laid out like /sys/class/kfd/kfd/topology/nodes
//! ROOT/proc/PID/kfd         the process's KFD device file: a character device CRIU does not know,
//!                           so it hands it to the plugin, as it does /dev/kfd
//! ROOT/proc/PID/state.json  GPUs, buffers, queues, paused / waiting-for-RESUME
//! ROOT/proc/PID/bo-N.mem    buffer contents; the process maps them, as it maps VRAM: CRIU dumps
//!                           such a mapping as a file mapping and leaves the contents to the plugin
//! ```
//!
//! It enforces the kernel's rules: PROCESS_INFO, CHECKPOINT and UNPAUSE only from the process
//! that opened the file or from the thread that ptrace-traces it (CRIU, having seized it);
//! PROCESS_INFO pauses the queues and CHECKPOINT requires that, with counts that match; UNPAUSE
//! only when paused; RESTORE only from the restored process itself, onto as many GPUs as it
//! sees, present in the topology; RESUME only from outside, after RESTORE, once the process has
//! its buffers mapped again. The application's GPU work waits while its queues are paused or
//! RESUME is pending.

use std::fs;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Checkpoint, Kfd, KfdError, ProcessInfo};
use crate::topology::Topology;
use crate::uapi::{BoBucket, DeviceBucket, INVALID_FD};

pub const ROOT_ENV: &str = "AMD_KFD_SIM_ROOT";
/// The device numbers of the simulated KFD file: those of /dev/loop-control, which opens
/// harmlessly everywhere and which CRIU leaves to plugins (misc major, unknown minor).
pub const DEVICE_MAJOR: u32 = 10;
pub const DEVICE_MINOR: u32 = 237;
/// KFD ioctl version the simulation claims.
pub const VERSION: (u32, u32) = (1, 16);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimGpu {
    pub user_gpu_id: u32,
    pub actual_gpu_id: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimBo {
    pub handle: u32,
    pub addr: u64,
    pub size: u64,
    /// User gpu_id.
    pub gpu_id: u32,
    pub alloc_flags: u32,
}

/// One process's KFD state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimProcess {
    pub pid: u32,
    pub gpus: Vec<SimGpu>,
    pub bos: Vec<SimBo>,
    /// Queue state (opaque, as the kernel's MQDs are to user space).
    pub queues: Vec<u8>,
    pub paused: bool,
    pub resume_pending: bool,
}

/// The private data the simulated kernel hands out at CHECKPOINT.
#[derive(Serialize, Deserialize)]
struct PrivData {
    version: u32,
    bos: Vec<SimBo>,
    queues: Vec<u8>,
}

fn err(op: &'static str, errno: i32, msg: impl Into<String>) -> KfdError {
    KfdError::new(op, errno, msg)
}

pub struct SimKfd {
    root: PathBuf,
}

impl SimKfd {
    pub fn new(root: PathBuf) -> SimKfd {
        SimKfd { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn topology_dir(&self) -> PathBuf {
        self.root.join("topology")
    }

    pub fn proc_dir(&self, pid: u32) -> PathBuf {
        self.root.join(format!("proc/{pid}"))
    }

    pub fn bo_path(&self, pid: u32, handle: u32) -> PathBuf {
        self.proc_dir(pid).join(format!("bo-{handle}.mem"))
    }

    pub fn load(&self, pid: u32) -> Option<SimProcess> {
        let text = fs::read(self.proc_dir(pid).join("state.json")).ok()?;
        serde_json::from_slice(&text).ok()
    }

    pub fn store(&self, p: &SimProcess) -> std::io::Result<()> {
        let dir = self.proc_dir(p.pid);
        let tmp = dir.join(".state.json.tmp");
        fs::write(&tmp, serde_json::to_vec(p).map_err(std::io::Error::other)?)?;
        fs::rename(tmp, dir.join("state.json"))
    }

    /// The owner of a simulated KFD file, from its path (`ROOT/proc/PID/kfd`).
    fn owner(&self, fd: BorrowedFd<'_>) -> Option<u32> {
        self.owner_of(Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())))
    }

    /// The owner of the simulated KFD file a `/proc/PID/fd/N` link points to.
    fn owner_of(&self, fd_link: &Path) -> Option<u32> {
        let link = fs::read_link(fd_link).ok()?;
        let rest = link.strip_prefix(self.root.join("proc")).ok()?;
        let mut parts = rest.iter();
        let pid = parts.next()?.to_str()?.parse().ok()?;
        (parts.next()? == "kfd" && parts.next().is_none()).then_some(pid)
    }

    fn live(&self, op: &'static str, fd: BorrowedFd<'_>) -> Result<SimProcess, KfdError> {
        let pid = self
            .owner(fd)
            .ok_or_else(|| err(op, libc::EBADF, "not a simulated KFD file"))?;
        self.load(pid)
            .ok_or_else(|| err(op, libc::ENODEV, format!("process {pid} has no KFD state")))
    }

    /// [`SimKfd::live`] for a CRIU operation, with the kernel's rule for its caller
    /// (`kfd_ioctl`): the process that opened the file, or the thread that traces its leader.
    fn criu_op(&self, op: &'static str, fd: BorrowedFd<'_>) -> Result<SimProcess, KfdError> {
        let p = self.live(op, fd)?;
        let caller = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        if p.pid == std::process::id() || tracer(p.pid) == Some(caller) {
            return Ok(p);
        }
        Err(err(
            op,
            libc::EBADF,
            format!(
                "process {}'s KFD file used by thread {caller}, which neither belongs to it nor \
                 traces it",
                p.pid
            ),
        ))
    }

    fn save(&self, op: &'static str, p: &SimProcess) -> Result<(), KfdError> {
        self.store(p).map_err(|e| err(op, libc::EIO, e.to_string()))
    }

    fn topology(&self) -> Result<Topology, KfdError> {
        Topology::parse(&self.topology_dir()).map_err(|e| err("topology", libc::EIO, e.to_string()))
    }

    /// Creates the device file for `pid` and opens it (the process's own `open("/dev/kfd")`).
    pub fn create_device(&self, pid: u32) -> std::io::Result<OwnedFd> {
        let dir = self.proc_dir(pid);
        fs::create_dir_all(&dir)?;
        let node = dir.join("kfd");
        if !node.exists() {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &node,
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o600),
                rustix::fs::makedev(DEVICE_MAJOR, DEVICE_MINOR),
            )?;
        }
        Ok(fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(node)?
            .into())
    }

    fn priv_data(op: &'static str, p: &SimProcess) -> Result<Vec<u8>, KfdError> {
        serde_json::to_vec(&PrivData {
            version: 1,
            bos: p.bos.clone(),
            queues: p.queues.clone(),
        })
        .map_err(|e| err(op, libc::EIO, e.to_string()))
    }

    fn find_bo<'a>(
        &self,
        op: &'static str,
        p: &'a SimProcess,
        b: &BoBucket,
    ) -> Result<&'a SimBo, KfdError> {
        p.bos
            .iter()
            .find(|x| x.addr == b.addr && x.size == b.size)
            .ok_or_else(|| err(op, libc::EINVAL, format!("no buffer at {:#x}", b.addr)))
    }
}

/// The thread that traces `pid` (`TracerPid`: a thread id), if any.
fn tracer(pid: u32) -> Option<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))?
        .trim()
        .parse()
        .ok()
        .filter(|t| *t != 0)
}

fn fake_offset(handle: u32) -> u64 {
    (handle as u64 + 1) << 20
}

impl Kfd for SimKfd {
    fn describe(&self) -> String {
        format!("SIMULATED KFD at {}", self.root.display())
    }

    fn topology_root(&self) -> PathBuf {
        self.topology_dir()
    }

    fn version(&self) -> Result<(u32, u32), KfdError> {
        Ok(VERSION)
    }

    fn is_kfd_file(&self, fd: BorrowedFd<'_>) -> bool {
        self.owner(fd).is_some()
    }

    fn is_kfd_link(&self, fd_link: &Path) -> bool {
        self.owner_of(fd_link).is_some()
    }

    fn render_minor(&self, _fd: BorrowedFd<'_>) -> Option<u32> {
        None
    }

    fn process_info(&self, fd: BorrowedFd<'_>) -> Result<ProcessInfo, KfdError> {
        let mut p = self.criu_op("PROCESS_INFO", fd)?;
        if p.gpus.is_empty() {
            return Err(err("PROCESS_INFO", libc::ENODEV, "the process uses no GPU"));
        }
        if p.paused {
            return Err(err(
                "PROCESS_INFO",
                libc::EBUSY,
                "queues already paused (a dump in progress?)",
            ));
        }
        p.paused = true;
        self.save("PROCESS_INFO", &p)?;
        Ok(ProcessInfo {
            pid: p.pid,
            num_devices: p.gpus.len() as u32,
            num_bos: p.bos.len() as u32,
            num_objects: 1,
            priv_data_size: Self::priv_data("PROCESS_INFO", &p)?.len() as u64,
        })
    }

    fn checkpoint(&self, fd: BorrowedFd<'_>, info: &ProcessInfo) -> Result<Checkpoint, KfdError> {
        let p = self.criu_op("CHECKPOINT", fd)?;
        if !p.paused {
            return Err(err(
                "CHECKPOINT",
                libc::EINVAL,
                "queues not paused: PROCESS_INFO first",
            ));
        }
        let priv_data = Self::priv_data("CHECKPOINT", &p)?;
        if info.num_devices as usize != p.gpus.len()
            || info.num_bos as usize != p.bos.len()
            || info.num_objects != 1
            || info.priv_data_size != priv_data.len() as u64
        {
            return Err(err(
                "CHECKPOINT",
                libc::EINVAL,
                "counts do not match PROCESS_INFO's",
            ));
        }
        Ok(Checkpoint {
            devices: p
                .gpus
                .iter()
                .map(|g| DeviceBucket {
                    user_gpu_id: g.user_gpu_id,
                    actual_gpu_id: g.actual_gpu_id,
                    ..DeviceBucket::default()
                })
                .collect(),
            bos: p
                .bos
                .iter()
                .map(|b| BoBucket {
                    addr: b.addr,
                    size: b.size,
                    offset: fake_offset(b.handle),
                    gpu_id: b.gpu_id,
                    alloc_flags: b.alloc_flags,
                    dmabuf_fd: INVALID_FD,
                    ..BoBucket::default()
                })
                .collect(),
            priv_data,
        })
    }

    fn read_bo(
        &self,
        fd: BorrowedFd<'_>,
        bo: &BoBucket,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), KfdError> {
        let p = self.live("read buffer", fd)?;
        let b = self.find_bo("read buffer", &p, bo)?;
        fs::File::open(self.bo_path(p.pid, b.handle))
            .and_then(|f| f.read_exact_at(dst, offset))
            .map_err(|e| err("read buffer", libc::EIO, e.to_string()))
    }

    fn release(&self, _bos: &[BoBucket]) {}

    fn unpause(&self, fd: BorrowedFd<'_>) -> Result<(), KfdError> {
        let mut p = self.criu_op("UNPAUSE", fd)?;
        if !p.paused {
            return Err(err("UNPAUSE", libc::EINVAL, "queues are not paused"));
        }
        p.paused = false;
        self.save("UNPAUSE", &p)
    }

    fn open_for_restore(&self, min_fd: i32) -> Result<OwnedFd, KfdError> {
        let pid = std::process::id();
        // A new KFD file means a new KFD process: what is left under this pid belongs to a
        // dead process that had it (the simulation has no kernel to clean up after exits).
        let _ = fs::remove_dir_all(self.proc_dir(pid));
        let f = self
            .create_device(pid)
            .map_err(|e| err("open", e.raw_os_error().unwrap_or(libc::EIO), e.to_string()))?;
        rustix::io::fcntl_dupfd_cloexec(&f, min_fd)
            .map_err(|e| err("open", e.raw_os_error(), e.to_string()))
    }

    fn open_render(&self, _minor: u32, min_fd: i32) -> Result<OwnedFd, KfdError> {
        let f = fs::File::open("/dev/null").map_err(|e| err("open", libc::EIO, e.to_string()))?;
        rustix::io::fcntl_dupfd_cloexec(&f, min_fd)
            .map_err(|e| err("open", e.raw_os_error(), e.to_string()))
    }

    fn restore(
        &self,
        fd: BorrowedFd<'_>,
        devices: &[DeviceBucket],
        bos: &mut [BoBucket],
        num_objects: u32,
        priv_data: &[u8],
    ) -> Result<(), KfdError> {
        const OP: &str = "RESTORE";
        let pid = self
            .owner(fd)
            .ok_or_else(|| err(OP, libc::EBADF, "not a simulated KFD file"))?;
        if pid != std::process::id() {
            return Err(err(
                OP,
                libc::EPERM,
                "RESTORE must be issued by the restored process itself",
            ));
        }
        if self.load(pid).is_some() {
            return Err(err(OP, libc::EBUSY, "this process already has KFD state"));
        }
        let pd: PrivData = serde_json::from_slice(priv_data)
            .map_err(|_| err(OP, libc::EINVAL, "private data not from this kernel"))?;
        if pd.version != 1 || pd.bos.len() != bos.len() || num_objects != 1 {
            return Err(err(
                OP,
                libc::EINVAL,
                "private data does not match the buffers",
            ));
        }
        let topo = self.topology()?;
        if devices.len() != topo.gpus().count() {
            return Err(err(
                OP,
                libc::EINVAL,
                format!(
                    "{} devices given, the process sees {} GPUs",
                    devices.len(),
                    topo.gpus().count()
                ),
            ));
        }
        for d in devices {
            if d.user_gpu_id == 0 || topo.gpu(d.actual_gpu_id).is_none() {
                return Err(err(
                    OP,
                    libc::EINVAL,
                    format!("no GPU {:#x} here", d.actual_gpu_id),
                ));
            }
        }
        for (b, s) in bos.iter_mut().zip(&pd.bos) {
            if (b.addr, b.size) != (s.addr, s.size) {
                return Err(err(
                    OP,
                    libc::EINVAL,
                    "buffers do not match the private data",
                ));
            }
            let f = fs::File::create(self.bo_path(pid, s.handle))
                .map_err(|e| err(OP, libc::EIO, e.to_string()))?;
            f.set_len(s.size)
                .map_err(|e| err(OP, libc::EIO, e.to_string()))?;
            b.restored_offset = fake_offset(s.handle);
            b.dmabuf_fd = INVALID_FD;
        }
        let p = SimProcess {
            pid,
            gpus: devices
                .iter()
                .map(|d| SimGpu {
                    user_gpu_id: d.user_gpu_id,
                    actual_gpu_id: d.actual_gpu_id,
                })
                .collect(),
            bos: pd.bos,
            queues: pd.queues,
            // Queues stay evicted, and memory notifiers blocked, until RESUME.
            paused: true,
            resume_pending: true,
        };
        self.save(OP, &p)
    }

    fn write_bo(
        &self,
        fd: BorrowedFd<'_>,
        bo: &BoBucket,
        offset: u64,
        src: &[u8],
    ) -> Result<(), KfdError> {
        let pid = self
            .owner(fd)
            .ok_or_else(|| err("write buffer", libc::EBADF, "not a simulated KFD file"))?;
        let p = self
            .load(pid)
            .ok_or_else(|| err("write buffer", libc::ENODEV, "no KFD state: RESTORE first"))?;
        let b = self.find_bo("write buffer", &p, bo)?;
        fs::OpenOptions::new()
            .write(true)
            .open(self.bo_path(pid, b.handle))
            .and_then(|f| f.write_all_at(src, offset))
            .map_err(|e| err("write buffer", libc::EIO, e.to_string()))
    }

    fn resume(&self, pid: u32) -> Result<(), KfdError> {
        const OP: &str = "RESUME";
        if pid == std::process::id() {
            return Err(err(
                OP,
                libc::EPERM,
                "RESUME comes from CRIU, not from the restored process",
            ));
        }
        let mut p = self
            .load(pid)
            .filter(|_| Path::new(&format!("/proc/{pid}")).exists())
            .ok_or_else(|| err(OP, libc::ESRCH, format!("no KFD process {pid}")))?;
        if !p.resume_pending {
            return Err(err(OP, libc::EINVAL, "nothing to resume: not restored"));
        }
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        for b in &p.bos {
            let path = self.bo_path(pid, b.handle);
            if !maps.contains(&*path.to_string_lossy()) {
                return Err(err(
                    OP,
                    libc::EINVAL,
                    format!(
                        "buffer {:#x} is not mapped yet: RESUME must follow the mappings",
                        b.addr
                    ),
                ));
            }
        }
        p.resume_pending = false;
        p.paused = false;
        self.save(OP, &p)
    }
}
