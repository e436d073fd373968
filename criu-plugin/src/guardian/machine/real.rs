//! The real machine as the guardian sees it: processes through /proc, NVIDIA's driver and NVML
//! (loaded in the guardian, never in CRIU), AMD's KFD, CRIU's leftovers ([`super::criu`]), and
//! the record it leaves when it acts alone (syslog and `gpu-guardian.log`: in the image
//! directory on dump, CRIU's work directory on restore).

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use criu_gpu_host::settings::Settings;
use process_facts::process;

use super::amd::AsTracer;
use super::criu::CriuLeftovers;
use super::cuda::Nvidia;
use super::{CudaDriver, KfdQueues, Leftovers, Machine};
use crate::guardian::lineage::Lineage;
use crate::guardian::proto::Level;
use crate::guardian::Dirs;

/// The guardian's log file: in the image directory on dump, CRIU's work directory on restore.
pub const LOG_FILE: &str = "gpu-guardian.log";

pub struct Real {
    /// The command's settings: which driver libraries to load, which KFD.
    settings: Arc<Settings>,
    driver: OnceLock<Result<Nvidia, String>>,
    /// AMD's KFD (the simulated one in test builds, where `AMD_KFD_SIM_ROOT` names it).
    kfd: OnceLock<Option<AsTracer>>,
    /// Held open: the leftovers reach the image directory through /proc/self/fd.
    _image_dir: Option<OwnedFd>,
    log_dir: Option<OwnedFd>,
    /// Restore: what the watched CRIU creates.
    lineage: Option<Lineage>,
    criu: CriuLeftovers,
}

impl Real {
    pub fn new(
        dirs: Dirs,
        lineage: Option<Lineage>,
        run_id: Option<String>,
        settings: Arc<Settings>,
    ) -> Real {
        let path = dirs
            .images
            .as_ref()
            .map(|fd| format!("/proc/self/fd/{}", fd.as_raw_fd()).into());
        Real {
            settings,
            driver: OnceLock::new(),
            kfd: OnceLock::new(),
            _image_dir: dirs.images,
            log_dir: dirs.log,
            lineage,
            criu: CriuLeftovers {
                image_dir: path,
                run_id,
                dump_root: None,
                started: std::time::SystemTime::now(),
            },
        }
    }

    pub fn dumping(mut self, dump_root: Option<i32>) -> Real {
        self.criu.dump_root = dump_root;
        self
    }
}

impl Machine for Real {
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

    fn kill_created(&self, pid: i32) {
        if let Some(l) = &self.lineage {
            l.kill(pid);
        }
    }

    fn record(&self, level: Level, line: &str) {
        crate::guardian::sys::syslog(matches!(level, Level::Error | Level::Warn), line);
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

    fn image_dir(&self) -> Option<std::path::PathBuf> {
        self.criu.image_dir.clone()
    }

    fn leftovers(&self) -> &dyn Leftovers {
        &self.criu
    }

    fn cuda(&self) -> Result<&dyn CudaDriver, String> {
        match self.driver.get_or_init(|| Nvidia::load(&self.settings)) {
            Ok(d) => Ok(d),
            Err(e) => Err(e.clone()),
        }
    }

    fn amd(&self) -> Result<&dyn KfdQueues, String> {
        let kfd = self.kfd.get_or_init(|| self.settings.kfd().map(AsTracer));
        match kfd {
            Some(k) => Ok(k),
            None => Err("this machine has no KFD (/dev/kfd)".to_owned()),
        }
    }
}
