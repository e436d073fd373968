//! A host for tests of the logic without CRIU: records what the backends asked of it.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use super::*;

#[derive(Default)]
pub struct FakeThreads {
    pub log: Mutex<Vec<String>>,
    /// pid -> the stop signal CRIU found it in when it seized it.
    pub seized_stopped: Mutex<Vec<(i32, i32)>>,
}

impl ThreadControl for FakeThreads {
    fn release(&self, pid: i32, tid: i32) -> Result<Released, ThreadError> {
        self.log.lock().unwrap().push(format!("release {tid}"));
        Ok(Released {
            pid,
            tid,
            saved_mask: Some(0),
        })
    }
    fn recapture(&self, r: &Released) -> Result<(), ThreadError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("recapture {}", r.tid));
        Ok(())
    }
    fn take_signal(&self, _r: &Released) -> Option<i32> {
        None
    }
    fn raise(&self, pid: i32, sig: i32) {
        self.log.lock().unwrap().push(format!("raise {pid} {sig}"));
    }
    fn seized_stop_signal(&self, pid: i32) -> Option<i32> {
        let s = self.seized_stopped.lock().unwrap();
        s.iter().find(|(p, _)| *p == pid).map(|(_, sig)| *sig)
    }
}

/// A task's pid in the image and one of its ranges.
pub type Deferred = (i32, Range<u64>);

pub struct FakeHost {
    pub final_state: Option<FinalState>,
    pub image_dir: Option<PathBuf>,
    /// CRIU's work directory (`None`: the image directory, as CRIU has it without --work-dir).
    pub work_dir: Option<PathBuf>,
    pub required: Mutex<Vec<String>>,
    pub interrupt_only: Mutex<bool>,
    pub threads: FakeThreads,
    pub root: Option<i32>,
    pub seize_left: Option<Duration>,
    /// What `defer_pages` was asked (`None`: a CRIU that cannot, like stock CRIU).
    pub deferred: Option<Mutex<Vec<Deferred>>>,
    /// What this CRIU does with io_uring rings.
    pub rings: process_facts::refusal::RingSupport,
}

impl FakeHost {
    pub fn new(image_dir: Option<PathBuf>) -> FakeHost {
        FakeHost {
            final_state: Some(FinalState::Dead),
            image_dir,
            work_dir: None,
            required: Mutex::new(Vec::new()),
            interrupt_only: Mutex::new(false),
            threads: FakeThreads::default(),
            root: None,
            seize_left: Some(Duration::from_secs(10)),
            deferred: Some(Mutex::new(Vec::new())),
            rings: process_facts::refusal::RingSupport::None,
        }
    }
}

impl Host for FakeHost {
    fn final_state(&self) -> Option<FinalState> {
        self.final_state
    }
    fn require_on_restore(&self, name: &str) -> bool {
        self.required.lock().unwrap().push(name.to_owned());
        true
    }
    fn use_interrupt_only_seizing(&self) -> bool {
        *self.interrupt_only.lock().unwrap() = true;
        true
    }
    fn image_dir(&self) -> Option<PathBuf> {
        self.image_dir.clone()
    }
    fn work_dir(&self) -> Option<PathBuf> {
        self.work_dir.clone().or_else(|| self.image_dir.clone())
    }
    fn dump_root(&self) -> Option<i32> {
        self.root
    }
    fn seize_time_left(&self) -> Option<Duration> {
        self.seize_left
    }
    fn criu_pid(&self) -> i32 {
        std::process::id() as i32
    }
    fn threads(&self) -> &dyn ThreadControl {
        &self.threads
    }
    fn ring_support(&self) -> process_facts::refusal::RingSupport {
        self.rings
    }
    fn defer_pages(&self, pid: i32, range: Range<u64>) -> Option<bool> {
        self.deferred.as_ref()?.lock().unwrap().push((pid, range));
        Some(true)
    }
}

/// A hook's verdict, or a panic with its error's message: tests compare verdicts, and errors by
/// their variant ([`HookError::gpu_error`]).
pub fn verdict<T>(r: &HookResult<T>) -> &Verdict<T> {
    match r {
        Ok(v) => v,
        Err(e) => panic!("the hook failed: {e}"),
    }
}
