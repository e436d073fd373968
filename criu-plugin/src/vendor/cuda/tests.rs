//! The CUDA backend's decisions against a fake machine: what is locked, checkpointed, undone,
//! restored, and what is refused.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_checkpoint_ctl::driver::{Call, CudaError, DeviceMap, DriverInfo, GpuUuid, ProcessState};
use cuda_checkpoint_ctl::inventory::{Gpu, GpuUsage, Inventory};

use super::*;
use crate::abi::criu::TASK_ALIVE;
use crate::core::testing::FakeHost;

#[derive(Default)]
struct Machine {
    states: BTreeMap<i32, ProcessState>,
    stopped: Vec<i32>,
    fail: BTreeMap<(i32, Call), u32>,
    calls: Vec<String>,
    killed: Vec<i32>,
    /// pid -> ns pid (restored processes in a new pid namespace).
    ns: BTreeMap<i32, i32>,
    tree: Vec<i32>,
    gpu_free: u64,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<Machine>>);

fn err(call: Call, pid: i32, code: u32) -> CudaError {
    CudaError {
        call,
        pid,
        code,
        name: format!("CUDA_ERROR_{code}"),
        description: format!("error {code}"),
    }
}

impl Fake {
    fn act(
        &self,
        pid: i32,
        call: Call,
        from: ProcessState,
        to: ProcessState,
    ) -> Result<(), CudaError> {
        let mut m = self.0.lock().unwrap();
        m.calls.push(format!("{call:?} {pid}"));
        if let Some(code) = m.fail.get(&(pid, call)) {
            return Err(err(call, pid, *code));
        }
        let s = m.states.get_mut(&pid).ok_or_else(|| err(call, pid, 3))?;
        if *s != from {
            return Err(err(call, pid, code::ILLEGAL_STATE));
        }
        *s = to;
        Ok(())
    }
    fn state_of(&self, pid: i32) -> ProcessState {
        self.0.lock().unwrap().states[&pid]
    }
    fn calls(&self) -> Vec<String> {
        self.0.lock().unwrap().calls.clone()
    }
}

const GPU: GpuUuid = GpuUuid([1; 16]);

impl CudaSystem for Fake {
    fn driver_info(&self) -> DriverInfo {
        DriverInfo {
            library: "fake".into(),
            cuda_version: Some(13000),
            simulated: Some("fake".into()),
        }
    }
    fn restore_thread_id(&self, pid: i32) -> Result<i32, CudaError> {
        let m = self.0.lock().unwrap();
        m.states
            .contains_key(&pid)
            .then_some(pid + 1000)
            .ok_or_else(|| err(Call::GetRestoreThreadId, pid, 3))
    }
    fn state(&self, pid: i32) -> Result<ProcessState, CudaError> {
        let m = self.0.lock().unwrap();
        m.states
            .get(&pid)
            .copied()
            .ok_or_else(|| err(Call::GetState, pid, 3))
    }
    fn lock(&self, pid: i32, _t: Duration) -> Result<(), CudaError> {
        self.act(pid, Call::Lock, ProcessState::Running, ProcessState::Locked)
    }
    fn checkpoint(&self, pid: i32) -> Result<(), CudaError> {
        self.act(
            pid,
            Call::Checkpoint,
            ProcessState::Locked,
            ProcessState::Checkpointed,
        )
    }
    fn restore(&self, pid: i32, map: &DeviceMap) -> Result<(), CudaError> {
        if !map.is_empty() {
            self.0
                .lock()
                .unwrap()
                .calls
                .push(format!("map {pid} {map}"));
        }
        self.act(
            pid,
            Call::Restore,
            ProcessState::Checkpointed,
            ProcessState::Locked,
        )
    }
    fn unlock(&self, pid: i32) -> Result<(), CudaError> {
        self.act(
            pid,
            Call::Unlock,
            ProcessState::Locked,
            ProcessState::Running,
        )
    }
    fn inventory(&self) -> Option<Inventory> {
        let m = self.0.lock().unwrap();
        Some(Inventory {
            nvml_library: "fake".into(),
            driver_version: "580".into(),
            cuda_version: Some(13000),
            gpus: vec![Gpu {
                index: 0,
                uuid: GPU,
                name: "Fake".into(),
                memory_total: 80 << 30,
                memory_used: (80 << 30) - m.gpu_free,
                memory_free: m.gpu_free,
            }],
            processes: m
                .states
                .keys()
                .map(|&pid| GpuUsage {
                    pid,
                    gpu: GPU,
                    memory: Some(1 << 30),
                })
                .collect(),
        })
    }
    fn maps_libcuda(&self, pid: i32) -> bool {
        self.0.lock().unwrap().states.contains_key(&pid)
    }
    fn is_stopped(&self, pid: i32) -> bool {
        self.0.lock().unwrap().stopped.contains(&pid)
    }
    fn ns_pid(&self, pid: i32) -> Option<i32> {
        Some(*self.0.lock().unwrap().ns.get(&pid).unwrap_or(&pid))
    }
    fn comm(&self, _pid: i32) -> Option<String> {
        Some("app".into())
    }
    fn tree(&self, _root: i32) -> Vec<i32> {
        self.0.lock().unwrap().tree.clone()
    }
    fn kill(&self, pid: i32) {
        self.0.lock().unwrap().killed.push(pid);
    }
}

fn machine(procs: &[(i32, ProcessState)]) -> Fake {
    let f = Fake::default();
    {
        let mut m = f.0.lock().unwrap();
        m.states = procs.iter().copied().collect();
        m.tree = procs.iter().map(|p| p.0).collect();
        m.gpu_free = 60 << 30;
    }
    f
}

fn backend(f: &Fake) -> Cuda {
    let f = f.clone();
    Cuda::with_loader(Box::new(move || {
        Ok(Box::new(f.clone()) as Box<dyn CudaSystem>)
    }))
}

fn dump(f: &Fake, host: &FakeHost, pids: &[i32]) -> (Cuda, Vec<HookResult>) {
    let mut c = backend(f);
    c.init(host, Stage::Dump, &Claims::default()).unwrap();
    let mut r: Vec<HookResult> = pids.iter().map(|&p| c.pause_devices(host, p)).collect();
    if r.iter().all(|x| x.is_ok()) {
        r.extend(pids.iter().map(|&p| c.checkpoint_devices(host, p)));
    }
    (c, r)
}

const R: ProcessState = ProcessState::Running;
const L: ProcessState = ProcessState::Locked;
const C: ProcessState = ProcessState::Checkpointed;

#[test]
fn a_dump_locks_then_checkpoints_all_and_records_them() {
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::new(Some(dir.path().to_path_buf()));
    let f = machine(&[(10, R), (11, R)]);
    let (mut c, r) = dump(&f, &host, &[10, 99, 11]);
    assert_eq!(
        r[1],
        Ok(Verdict::NotMine),
        "a process without CUDA is not ours"
    );
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!((f.state_of(10), f.state_of(11)), (C, C));
    assert_eq!(
        *host.required.lock().unwrap(),
        ["criu_gpu_cuda"],
        "inventory entry added once"
    );
    // The driver threads ran during the checkpoint and were stopped again.
    let log = host.threads.log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "release 1010",
            "release 1011",
            "recapture 1010",
            "recapture 1011"
        ]
    );
    let img: CudaImage = record::read(dir.path(), placement::RECORD, placement::FORMAT)
        .unwrap()
        .unwrap();
    assert_eq!(img.processes.len(), 2);
    assert_eq!(img.processes[0].gpus[0].memory, Some(1 << 30));
    c.exit(&host, Stage::Dump, true);
    assert_eq!(
        (f.state_of(10), f.state_of(11)),
        (C, C),
        "tasks die: nothing undone"
    );
}

#[test]
fn a_failed_checkpoint_is_undone_for_every_process() {
    let host = FakeHost::new(Some(tempfile::tempdir().unwrap().keep()));
    let f = machine(&[(10, R), (11, R), (12, L)]);
    f.0.lock()
        .unwrap()
        .fail
        .insert((11, Call::Checkpoint), code::OUT_OF_MEMORY);
    let (mut c, r) = dump(&f, &host, &[10, 11, 12]);
    let e = r[3].clone().unwrap_err();
    assert!(
        e.0.contains("process 11") && e.0.contains("returned to its state"),
        "{e}"
    );
    c.exit(&host, Stage::Dump, false);
    assert_eq!(f.state_of(10), R, "checkpointed: restored and unlocked");
    assert_eq!(f.state_of(11), R, "only locked: unlocked");
    assert_eq!(
        f.state_of(12),
        L,
        "locked by someone else before: left locked"
    );
}

#[test]
fn leave_running_returns_every_process_to_running() {
    let mut host = FakeHost::new(Some(tempfile::tempdir().unwrap().keep()));
    host.final_state = Some(TASK_ALIVE);
    let f = machine(&[(10, R), (11, C)]);
    let (mut c, r) = dump(&f, &host, &[10, 11]);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&host, Stage::Dump, true);
    assert_eq!(f.state_of(10), R);
    assert_eq!(f.state_of(11), C, "checkpointed before the dump: left so");
    assert!(!f.calls().contains(&"Restore 11".to_string()));
}

#[test]
fn a_lock_failure_fails_the_dump_and_unlocks_the_others() {
    let host = FakeHost::new(None);
    let f = machine(&[(10, R), (11, R)]);
    f.0.lock()
        .unwrap()
        .fail
        .insert((11, Call::Lock), code::TIMEOUT);
    let (mut c, r) = dump(&f, &host, &[10, 11]);
    let e = r[1].clone().unwrap_err();
    assert!(
        e.0.contains("timed out") && e.0.contains("CRIU_GPU_LOCK_TIMEOUT_MS"),
        "{e}"
    );
    c.exit(&host, Stage::Dump, false);
    assert_eq!((f.state_of(10), f.state_of(11)), (R, R));
}

#[test]
fn stopped_processes_and_pre_dumps_are_refused_before_any_lock() {
    let host = FakeHost::new(None);
    let f = machine(&[(10, R)]);
    f.0.lock().unwrap().stopped.push(10);
    let (_, r) = dump(&f, &host, &[10]);
    assert!(r[0].clone().unwrap_err().0.contains("kill -CONT 10"));
    let f = machine(&[(10, R)]);
    let mut c = backend(&f);
    c.init(&host, Stage::PreDump, &Claims::default()).unwrap();
    let e = c.pause_devices(&host, 10).unwrap_err();
    assert!(e.0.contains("pre-dump is not supported"), "{e}");
    assert!(c.pause_devices(&host, 99).unwrap() == Verdict::NotMine);
    assert_eq!(f.state_of(10), R);
    assert!(f.calls().is_empty(), "nothing was locked");
}

fn image_dir_with(procs: &[(i32, ProcessState)]) -> std::path::PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let host = FakeHost::new(Some(dir.clone()));
    let f = machine(procs);
    let (mut c, r) = dump(&f, &host, &procs.iter().map(|p| p.0).collect::<Vec<_>>());
    assert!(r.iter().all(|x| x.is_ok()));
    c.exit(&host, Stage::Dump, true);
    dir
}

fn claims() -> Claims {
    Claims {
        ours: Some(true),
        others: vec![],
    }
}

#[test]
fn a_restore_brings_back_the_whole_tree_at_once() {
    let dir = image_dir_with(&[(10, R), (11, L)]);
    let host = FakeHost::new(Some(dir));
    // Restored in a new pid namespace: other real pids, the same namespace pids.
    let f = machine(&[(500, C), (501, C), (502, R)]);
    {
        let mut m = f.0.lock().unwrap();
        m.ns = [(500, 10), (501, 11), (502, 12)].into_iter().collect();
        m.states.remove(&502);
    }
    let mut c = backend(&f);
    c.init(&host, Stage::Restore, &claims()).unwrap();
    assert_eq!(c.resume_devices_late(&host, 500), Ok(Verdict::Done(())));
    assert_eq!(c.resume_devices_late(&host, 501), Ok(Verdict::Done(())));
    assert_eq!(c.resume_devices_late(&host, 502), Ok(Verdict::NotMine));
    assert_eq!(f.state_of(500), R);
    assert_eq!(f.state_of(501), L, "it was locked before the dump");
    assert!(f.0.lock().unwrap().killed.is_empty());
}

#[test]
fn a_failed_restore_kills_the_tree_so_criu_fails() {
    let dir = image_dir_with(&[(10, R), (11, R)]);
    let host = FakeHost::new(Some(dir));
    let f = machine(&[(10, C), (11, C)]);
    f.0.lock()
        .unwrap()
        .fail
        .insert((11, Call::Restore), code::OUT_OF_MEMORY);
    let mut c = backend(&f);
    c.init(&host, Stage::Restore, &claims()).unwrap();
    assert_eq!(c.resume_devices_late(&host, 10), Ok(Verdict::Done(())));
    let e = c.resume_devices_late(&host, 11).unwrap_err();
    assert!(e.0.contains("CRIU_GPU_DEVICE_MAP"), "{e}");
    assert_eq!(f.0.lock().unwrap().killed, vec![11, 10]);
}

#[test]
fn restore_is_refused_before_anything_starts_when_gpus_lack_room() {
    let dir = image_dir_with(&[(10, R), (11, R)]);
    let host = FakeHost::new(Some(dir));
    let f = machine(&[]);
    f.0.lock().unwrap().gpu_free = 1 << 30; // the two processes need 2 GiB
    let mut c = backend(&f);
    let e = c.init(&host, Stage::Restore, &claims()).unwrap_err();
    assert!(
        e.0.contains("2.00 GiB") && e.0.contains("1.00 GiB free"),
        "{e}"
    );
}

#[test]
fn restore_without_a_driver_names_the_cause() {
    let dir = image_dir_with(&[(10, R)]);
    let host = FakeHost::new(Some(dir));
    let mut c = Cuda::with_loader(Box::new(|| Err("libcuda.so.1 is not installed".into())));
    let e = c.init(&host, Stage::Restore, &claims()).unwrap_err();
    assert!(
        e.0.contains("CUDA state of 1 process") && e.0.contains("not installed"),
        "{e}"
    );
}

#[test]
fn images_without_cuda_state_need_no_driver() {
    let host = FakeHost::new(Some(tempfile::tempdir().unwrap().keep()));
    let mut c = Cuda::with_loader(Box::new(|| panic!("must not load the driver")));
    c.init(&host, Stage::Restore, &Claims::default()).unwrap();
    assert_eq!(c.resume_devices_late(&host, 1), Ok(Verdict::NotMine));
}

#[test]
fn a_record_missing_from_an_image_that_needs_it_is_refused() {
    let host = FakeHost::new(Some(tempfile::tempdir().unwrap().keep()));
    let mut c = Cuda::with_loader(Box::new(|| panic!("must not load the driver")));
    let e = c.init(&host, Stage::Restore, &claims()).unwrap_err();
    assert!(e.0.contains("gpu-cuda.json is missing"), "{e}");
}

#[test]
fn a_dump_without_a_driver_stays_out_of_the_way() {
    let host = FakeHost::new(None);
    let mut c = Cuda::with_loader(Box::new(|| Err("no driver".into())));
    c.init(&host, Stage::Dump, &Claims::default()).unwrap();
    assert_eq!(c.pause_devices(&host, 1), Ok(Verdict::NotMine));
    assert_eq!(c.checkpoint_devices(&host, 1), Ok(Verdict::NotMine));
    c.exit(&host, Stage::Dump, false);
}
