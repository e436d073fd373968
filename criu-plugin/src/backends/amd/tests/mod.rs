//! The AMD backend against the simulated KFD, with this test process as the GPU application and
//! a real guardian (on a thread, over the real protocol) whose machine restarts queues through
//! the simulation: what is paused, saved, restarted, restored, refused, and what the guardian
//! does alone when CRIU dies.

mod dump;
mod messages;
mod restore;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use amd_kfd::device::sim::{SimBo, SimGpu, SimKfd, SimProcess};
use amd_kfd::device::Kfd;
use amd_kfd::topology::fixture;
use amd_kfd::uapi::alloc;

use super::error::AmdError;
use super::*;
use crate::core::testing::{verdict, FakeHost};
use crate::core::FinalState;
use crate::guardian::machine::{CudaDriver, KfdQueues, Machine, Unpaused};
use crate::guardian::proto::{Level, Watch};
use crate::guardian::{in_thread, Watched};

/// The AMD error a hook failed with.
fn failure<T: std::fmt::Debug>(r: &Result<T, HookError>) -> &AmdError {
    match r {
        Err(e) => e
            .gpu_error()
            .unwrap_or_else(|| panic!("not an AmdError: {e}")),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

/// A simulated AMD machine: its KFD's root, and CRIU's image directory.
struct World {
    _dir: tempfile::TempDir,
    root: PathBuf,
    images: PathBuf,
    host: FakeHost,
    guardians: Guardians,
}

/// The guardians the backend started, and what they wrote once alone.
#[derive(Clone, Default)]
struct Guardians {
    watches: Arc<Mutex<Vec<Watch>>>,
    /// "CRIU" for each guardian: dropping one is CRIU ending.
    criu: Arc<Mutex<Vec<Watched>>>,
    /// The threads of the guardians whose CRIU died.
    alone: Arc<Mutex<Vec<std::thread::JoinHandle<()>>>>,
    record: Arc<Mutex<Vec<String>>>,
}

impl Guardians {
    /// CRIU dies: every guardian is on its own.
    fn criu_dies(&self) {
        let ended: Vec<_> = self
            .criu
            .lock()
            .unwrap()
            .drain(..)
            .map(Watched::end)
            .collect();
        self.alone.lock().unwrap().extend(ended);
    }

    /// Waits until every guardian whose CRIU died has done what it does alone and ended: only
    /// then does the absence of an action prove anything.
    fn wait_ended(&self) {
        let start = Instant::now();
        while !self.alone.lock().unwrap().iter().all(|t| t.is_finished()) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a guardian did not end: {}",
                self.record()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn record(&self) -> String {
        self.record.lock().unwrap().join("\n")
    }

    /// Waits until the record mentions `what`.
    fn wait_for(&self, what: &str) -> String {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if self.record().contains(what) {
                return self.record();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the guardian did not record {what:?}: {}", self.record());
    }
}

/// The guardian's machine: no CUDA; KFD calls go to the simulation, which takes them from this
/// process, the KFD files' owner (the real machine's are made as the process's tracer).
struct Fake {
    kfd: SimKfd,
    record: Arc<Mutex<Vec<String>>>,
}

impl Machine for Fake {
    fn alive(&self, pid: i32, starttime: u64) -> bool {
        process_facts::process::starttime(pid) == Some(starttime)
    }
    fn kill(&self, _pid: i32) {}
    fn created(&self) -> Vec<(i32, i32)> {
        Vec::new()
    }
    fn kill_created(&self, _pid: i32) {}
    fn record(&self, level: Level, line: &str) {
        self.record
            .lock()
            .unwrap()
            .push(format!("{level:?}: {line}"));
    }
    fn cuda(&self) -> Result<&dyn CudaDriver, String> {
        Err("no CUDA here".into())
    }
    fn amd(&self) -> Result<&dyn KfdQueues, String> {
        Ok(self)
    }
}

impl KfdQueues for Fake {
    fn unpause(&self, _pid: i32, file: BorrowedFd<'_>) -> Result<Unpaused, String> {
        match self.kfd.unpause(file) {
            Ok(()) => Ok(Unpaused::Running),
            Err(e) if e.errno == Some(libc::EINVAL) => Ok(Unpaused::WasNot),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl World {
    fn new() -> World {
        let d = tempfile::tempdir().unwrap();
        fixture::single_gpu()
            .write(&d.path().join("topology"))
            .unwrap();
        let images = d.path().join("images");
        std::fs::create_dir_all(&images).unwrap();
        let mut host = FakeHost::new(Some(images.clone()));
        host.root = Some(std::process::id() as i32);
        World {
            root: d.path().to_path_buf(),
            images,
            host,
            guardians: Guardians::default(),
            _dir: d,
        }
    }

    fn kfd(&self) -> SimKfd {
        SimKfd::new(self.root.clone())
    }

    /// The backend on this machine with `settings` (KEY=VALUE lines).
    fn backend_with(&self, settings: &'static str) -> Amd {
        let root = self.root.clone();
        let g = self.guardians.clone();
        let spawn: SpawnGuardian = Arc::new(move |watch| {
            g.watches.lock().unwrap().push(watch);
            let machine = Arc::new(Fake {
                kfd: SimKfd::new(root.clone()),
                record: g.record.clone(),
            });
            let (guardian, criu) = in_thread(watch, machine)?;
            g.criu.lock().unwrap().push(criu);
            Ok(guardian)
        });
        let root = self.root.clone();
        Amd::with(
            Box::new(move || Some(Box::new(SimKfd::new(root.clone())) as Box<dyn Kfd>)),
            Arc::new(Settings::from_sources(&[], settings, "test.conf")),
            spawn,
        )
    }

    fn backend(&self) -> Amd {
        self.backend_with("")
    }

    /// Makes this process a KFD process; returns its KFD file.
    fn gpu_process(&self) -> OwnedFd {
        let k = self.kfd();
        let me = std::process::id();
        let _ = std::fs::remove_dir_all(k.proc_dir(me));
        let fd = k.create_device(me).unwrap();
        let gpu = fixture::single_gpu().gpus().next().unwrap().gpu_id;
        let bo = SimBo {
            handle: 0,
            addr: 0x7f00_0000_0000,
            size: 1 << 20,
            gpu_id: gpu,
            alloc_flags: alloc::VRAM,
        };
        std::fs::write(k.bo_path(me, 0), vec![0x5a; 1 << 20]).unwrap();
        k.store(&SimProcess {
            pid: me,
            gpus: vec![SimGpu {
                user_gpu_id: gpu,
                actual_gpu_id: gpu,
            }],
            bos: vec![bo],
            queues: vec![1, 2, 3],
            paused: false,
            resume_pending: false,
        })
        .unwrap();
        fd
    }

    fn paused(&self) -> bool {
        self.kfd().load(std::process::id()).unwrap().paused
    }

    /// A dump of this process (a KFD process) into the image directory, as file `id`; the
    /// queues are running again after.
    fn dumped(&self, id: u32) {
        let fd = self.gpu_process();
        let mut a = self.backend();
        a.init(&self.host, Stage::Dump, &Claims::default()).unwrap();
        a.dump_ext_file(&self.host, fd.as_fd(), id).unwrap();
        a.exit(&self.host, Stage::Dump, true);
        drop(fd);
    }
}

fn restore_claims() -> Claims {
    Claims {
        ours: true,
        listed: true,
        others: vec![],
    }
}

/// Closes an fd a hook handed over, as CRIU does once done with it.
fn close_handed_over(fd: i32) {
    assert!(fd >= 0);
    nix::unistd::close(fd).unwrap();
}
