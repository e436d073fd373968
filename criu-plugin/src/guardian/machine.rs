//! The machine as the guardian process sees it: NVIDIA's driver and NVML (loaded in the
//! guardian, never in CRIU), AMD's KFD, processes through /proc, and the record it leaves when
//! it acts alone (syslog and `gpu-guardian.log` in the image directory).

use std::io::Write;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;
use std::time::Duration;

use cuda_checkpoint_ctl::driver::{CudaError, DeviceMap, Driver, DriverInfo, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;
use process_facts::process;

use super::agent::{GpuDriver, Machine, Unpaused};
use super::lineage::Lineage;
use super::proto::Level;

/// The guardian's log file: in the image directory on dump, CRIU's work directory on restore.
pub const LOG_FILE: &str = "gpu-guardian.log";

pub struct Real {
    driver: OnceLock<Result<Driver, String>>,
    /// AMD's KFD (the simulated one in test builds, where `AMD_KFD_SIM_ROOT` names it).
    kfd: OnceLock<Option<Box<dyn amd_kfd::device::Kfd>>>,
    image_dir: Option<OwnedFd>,
    log_dir: Option<OwnedFd>,
    /// Restore: what the watched CRIU creates.
    lineage: Option<Lineage>,
    /// The watched CRIU's run id (its network lock on dump).
    run_id: Option<String>,
    /// Dump: the root of the dumped tree, as CRIU has it.
    dump_root: Option<i32>,
    started: std::time::SystemTime,
}

impl Real {
    pub fn new(dirs: super::Dirs, lineage: Option<Lineage>, run_id: Option<String>) -> Real {
        Real {
            driver: OnceLock::new(),
            kfd: OnceLock::new(),
            image_dir: dirs.images,
            log_dir: dirs.log,
            lineage,
            run_id,
            dump_root: None,
            started: std::time::SystemTime::now(),
        }
    }

    pub fn dumping(self, dump_root: Option<i32>) -> Real {
        Real { dump_root, ..self }
    }
}

impl GpuDriver for Driver {
    fn info(&self) -> DriverInfo {
        Driver::info(self).clone()
    }
    fn restore_tid(&self, pid: i32) -> Result<i32, CudaError> {
        self.restore_thread_id(pid)
    }
    fn state(&self, pid: i32) -> Result<ProcessState, CudaError> {
        Driver::state(self, pid)
    }
    fn lock(&self, pid: i32, timeout: Duration) -> Result<(), CudaError> {
        Driver::lock(self, pid, Some(timeout))
    }
    fn checkpoint(&self, pid: i32) -> Result<(), CudaError> {
        Driver::checkpoint(self, pid)
    }
    fn restore(&self, pid: i32, map: &DeviceMap) -> Result<(), CudaError> {
        Driver::restore(self, pid, map)
    }
    fn unlock(&self, pid: i32) -> Result<(), CudaError> {
        Driver::unlock(self, pid)
    }
    fn inventory(&self) -> Result<Inventory, String> {
        Inventory::query(None).map_err(|e| e.to_string())
    }
}

impl Machine for Real {
    fn driver(&self) -> Result<&dyn GpuDriver, String> {
        match self
            .driver
            .get_or_init(|| Driver::load(None).map_err(|e| e.to_string()))
        {
            Ok(d) => Ok(d),
            Err(e) => Err(e.clone()),
        }
    }

    fn alive(&self, pid: i32, starttime: u64) -> bool {
        process::starttime(pid) == Some(starttime) && !process::is_dying(pid)
    }

    fn kill(&self, pid: i32) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    fn created(&self) -> Vec<(i32, i32)> {
        self.lineage
            .as_ref()
            .map(Lineage::alive)
            .unwrap_or_default()
    }

    fn unlock_network(&self, restore: bool) -> Option<String> {
        // A restore's lock is named by the run that dumped the image.
        let id = if restore {
            let dir = self.image_dir()?;
            criu_gpu_image::criu_image::dump_run_id(&dir).ok()??
        } else {
            self.run_id.clone()?
        };
        match criu_gpu_image::netlock::unlock(&id) {
            Ok(criu_gpu_image::netlock::Unlocked::Removed) => Some(format!(
                "took back CRIU's network lock (nftables table {}): the job's connections carry \
                 packets again",
                criu_gpu_image::netlock::table(&id)
            )),
            Ok(criu_gpu_image::netlock::Unlocked::NotLocked) => None,
            Err(e) => Some(format!(
                "could not look at CRIU's network lock ({}): {e}; if the network is blocked, run \
                 `nft delete table {}`",
                criu_gpu_image::netlock::table(&id),
                criu_gpu_image::netlock::table(&id)
            )),
        }
    }

    fn release_repair(&self, tracked: &[i32]) -> Option<String> {
        // The dumped tree; without its root, the GPU processes and theirs.
        let roots = self.dump_root.map_or_else(|| tracked.to_vec(), |r| vec![r]);
        let mut tree: Vec<i32> = roots.into_iter().flat_map(process::tree).collect();
        tree.sort_unstable();
        tree.dedup();
        let n = super::repair::release(&tree);
        (n > 0).then(|| {
            format!(
                "took {n} TCP socket(s) of the job out of the repair mode CRIU had put them in: \
                 the connections work again (a process that used one before this saw an error)"
            )
        })
    }

    fn remove_ghosts(&self) -> Vec<String> {
        let Some(dir) = self.image_dir() else {
            return Vec::new();
        };
        let left = criu_gpu_image::criu_image::leftover_ghosts(&dir, self.started);
        left.unwrap_or_default()
            .into_iter()
            .filter(|p| std::fs::remove_file(p).is_ok())
            .map(|p| {
                format!(
                    "removed {}, an unlinked file of the image that the killed restore had made \
                     for a moment (the next restore makes it again)",
                    p.display()
                )
            })
            .collect()
    }

    fn kill_created(&self, pid: i32) {
        if let Some(l) = &self.lineage {
            l.kill(pid);
        }
    }

    fn unpause_kfd(&self, pid: i32, file: BorrowedFd<'_>) -> Result<Unpaused, String> {
        match self.kfd.get_or_init(amd_kfd::device::detect) {
            Some(kfd) => super::kfd::unpause(kfd.as_ref(), pid, file),
            None => Err("this machine has no KFD (/dev/kfd)".to_owned()),
        }
    }

    fn thp(&self) -> Option<criu_gpu_image::thp::Thp> {
        Some(criu_gpu_image::thp::Thp::default())
    }

    fn image_dir(&self) -> Option<std::path::PathBuf> {
        let fd = self.image_dir.as_ref()?.as_raw_fd();
        Some(format!("/proc/self/fd/{fd}").into())
    }

    fn record(&self, level: Level, line: &str) {
        super::sys::syslog(matches!(level, Level::Error | Level::Warn), line);
        let Some(dir) = &self.log_dir else {
            return;
        };
        let Ok(fd) = rustix::fs::openat(
            dir,
            LOG_FILE,
            rustix::fs::OFlags::WRONLY
                | rustix::fs::OFlags::CREATE
                | rustix::fs::OFlags::APPEND
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::from_raw_mode(0o644),
        ) else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut f = std::fs::File::from(fd);
        let _ = writeln!(
            f,
            "{now} criu-gpu-guardian[{}] {level:?}: {line}",
            std::process::id()
        );
    }
}
