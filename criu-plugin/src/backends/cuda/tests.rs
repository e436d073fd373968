//! The CUDA backend's decisions against a fake machine, through a real guardian (on a thread,
//! over the real protocol): what is locked, checkpointed, undone, restored, refused, and what the
//! guardian does alone when CRIU dies.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::{
    code, Call, CudaError, DeviceMap, DriverInfo, GpuUuid, ProcessState,
};
use cuda_checkpoint_ctl::inventory::{Gpu, GpuUsage, Inventory};
use cuda_checkpoint_ctl::process::Libraries;

use super::error::Held;
use super::procs::Procs;
use super::*;
use crate::core::testing::FakeHost;
use crate::core::{record, FinalState, Settings};
use crate::guardian::agent::{GpuDriver, Machine};
use crate::guardian::proto::Level;

const R: ProcessState = ProcessState::Running;
const L: ProcessState = ProcessState::Locked;
const C: ProcessState = ProcessState::Checkpointed;
const GPU: GpuUuid = GpuUuid([1; 16]);

/// A GPU driver and the processes it knows.
#[derive(Default)]
struct Gpus {
    states: BTreeMap<i32, ProcessState>,
    fail: BTreeMap<(i32, Call), u32>,
    /// Calls that do not return until `release` (a GPU that hangs, a stopped thread).
    hang: BTreeSet<(i32, Call)>,
    calls: Vec<String>,
    /// When each action ran: (pid, call, start, end).
    spans: Vec<(i32, Call, Instant, Instant)>,
    delay: Duration,
    dead: BTreeSet<i32>,
    free: u64,
    record: Vec<String>,
    lock_timeouts: Vec<Duration>,
}

#[derive(Clone, Default)]
struct Fake(Arc<(Mutex<Gpus>, Condvar)>);

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
    fn with(procs: &[(i32, ProcessState)]) -> Fake {
        let f = Fake::default();
        {
            let mut g = f.m();
            g.states = procs.iter().copied().collect();
            g.free = 60 << 30;
        }
        f
    }
    fn m(&self) -> std::sync::MutexGuard<'_, Gpus> {
        self.0 .0.lock().unwrap()
    }
    fn state(&self, pid: i32) -> ProcessState {
        self.m().states[&pid]
    }
    fn release(&self) {
        self.m().hang.clear();
        self.0 .1.notify_all();
    }
    fn act(
        &self,
        pid: i32,
        call: Call,
        from: ProcessState,
        to: ProcessState,
    ) -> Result<(), CudaError> {
        let start = Instant::now();
        let mut m = self.m();
        m.calls.push(format!("{call:?} {pid}"));
        while m.hang.contains(&(pid, call)) {
            m = self.0 .1.wait(m).unwrap();
        }
        let delay = m.delay;
        drop(m);
        std::thread::sleep(delay);
        let mut m = self.m();
        if m.dead.contains(&pid) {
            return Err(err(call, pid, code::OPERATING_SYSTEM));
        }
        if let Some(c) = m.fail.get(&(pid, call)) {
            return Err(err(call, pid, *c));
        }
        let s = m.states.get_mut(&pid).ok_or_else(|| err(call, pid, 3))?;
        if *s != from {
            return Err(err(call, pid, code::ILLEGAL_STATE));
        }
        *s = to;
        m.spans.push((pid, call, start, Instant::now()));
        Ok(())
    }
}

impl GpuDriver for Fake {
    fn info(&self) -> DriverInfo {
        DriverInfo {
            library: "fake".into(),
            cuda_version: Some(13000),
            simulated: Some("fake".into()),
        }
    }
    fn restore_tid(&self, pid: i32) -> Result<i32, CudaError> {
        let m = self.m();
        m.states
            .contains_key(&pid)
            .then_some(pid + 1000)
            .ok_or_else(|| err(Call::GetRestoreThreadId, pid, code::NOT_INITIALIZED))
    }
    fn state(&self, pid: i32) -> Result<ProcessState, CudaError> {
        let m = self.m();
        m.states
            .get(&pid)
            .copied()
            .ok_or_else(|| err(Call::GetState, pid, code::NOT_INITIALIZED))
    }
    fn lock(&self, pid: i32, timeout: Duration) -> Result<(), CudaError> {
        self.m().lock_timeouts.push(timeout);
        self.act(pid, Call::Lock, R, L)
    }
    fn checkpoint(&self, pid: i32) -> Result<(), CudaError> {
        self.act(pid, Call::Checkpoint, L, C)
    }
    fn restore(&self, pid: i32, map: &DeviceMap) -> Result<(), CudaError> {
        if !map.is_empty() {
            self.m().calls.push(format!("map {pid} {map}"));
        }
        self.act(pid, Call::Restore, C, L)
    }
    fn unlock(&self, pid: i32) -> Result<(), CudaError> {
        self.act(pid, Call::Unlock, L, R)
    }
    fn inventory(&self) -> Result<Inventory, String> {
        let m = self.m();
        Ok(Inventory {
            nvml_library: "fake".into(),
            driver_version: "580".into(),
            cuda_version: Some(13000),
            gpus: vec![Gpu {
                index: 0,
                uuid: GPU,
                name: "Fake".into(),
                memory_total: 80 << 30,
                memory_used: (80 << 30) - m.free,
                memory_free: m.free,
                minor: Some(0),
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
}

impl Machine for Fake {
    fn driver(&self) -> Result<&dyn GpuDriver, String> {
        Ok(self)
    }
    fn alive(&self, pid: i32, _starttime: u64) -> bool {
        !self.m().dead.contains(&pid)
    }
    fn kill(&self, pid: i32) {
        self.m().dead.insert(pid);
    }
    fn descendants(&self, _pid: i32) -> Vec<(i32, u64)> {
        Vec::new()
    }
    fn started_since_me(&self, pid: i32) -> Option<u64> {
        self.m().states.contains_key(&pid).then_some(1)
    }
    fn record(&self, level: Level, line: &str) {
        self.m().record.push(format!("{level:?}: {line}"));
    }
}

/// The processes as /proc shows them.
#[derive(Clone, Default)]
struct Tree(Arc<Mutex<TreeState>>);

#[derive(Default)]
struct TreeState {
    pids: Vec<i32>,
    cuda: BTreeSet<i32>,
    nccl: BTreeSet<i32>,
    held: BTreeMap<i32, Held>,
    /// pid -> ns pid (restored processes in a new pid namespace).
    ns: BTreeMap<i32, i32>,
    /// Tracer of every process (CRIU's pid once seized).
    tracer: i32,
    /// Processes whose root has no /dev/nvidiaN (a container restored with other devices).
    no_nodes: BTreeSet<i32>,
    killed: Vec<i32>,
}

impl Procs for Tree {
    fn tree(&self, _root: i32) -> Vec<i32> {
        self.0.lock().unwrap().pids.clone()
    }
    fn libraries(&self, pid: i32) -> std::io::Result<Libraries> {
        let t = self.0.lock().unwrap();
        Ok(Libraries {
            libcuda: t.cuda.contains(&pid),
            nccl: t.nccl.contains(&pid),
        })
    }
    fn comm(&self, _pid: i32) -> String {
        "app".into()
    }
    fn ns_pid(&self, pid: i32) -> Option<i32> {
        Some(*self.0.lock().unwrap().ns.get(&pid).unwrap_or(&pid))
    }
    fn starttime(&self, _pid: i32) -> Option<u64> {
        Some(1)
    }
    fn held(&self, pid: i32, _tid: Option<i32>, _criu: i32) -> Option<Held> {
        self.0.lock().unwrap().held.get(&pid).cloned()
    }
    fn tracer(&self, _pid: i32) -> i32 {
        self.0.lock().unwrap().tracer
    }
    fn has_gpu_node(&self, pid: i32, _minor: u32) -> bool {
        !self.0.lock().unwrap().no_nodes.contains(&pid)
    }
    fn kill(&self, pid: i32) {
        self.0.lock().unwrap().killed.push(pid);
    }
}

struct World {
    gpu: Fake,
    tree: Tree,
    host: FakeHost,
    settings: Vec<(String, String)>,
}

impl World {
    fn new(procs: &[(i32, ProcessState)], plain: &[i32]) -> World {
        let gpu = Fake::with(procs);
        let tree = Tree::default();
        {
            let mut t = tree.0.lock().unwrap();
            t.pids = procs
                .iter()
                .map(|p| p.0)
                .chain(plain.iter().copied())
                .collect();
            t.cuda = procs.iter().map(|p| p.0).collect();
            t.tracer = std::process::id() as i32;
        }
        let mut host = FakeHost::new(Some(tempfile::tempdir().unwrap().keep()));
        host.root = procs.first().map(|p| p.0);
        host.machine = Some(Arc::new(gpu.clone()));
        World {
            gpu,
            tree,
            host,
            settings: Vec::new(),
        }
    }

    fn set(mut self, k: &str, v: &str) -> World {
        self.settings.push((k.into(), v.into()));
        self
    }

    fn backend(&self) -> Cuda {
        let tree = self.tree.clone();
        let env = self.settings.clone();
        Cuda::with(
            Box::new(move || Box::new(tree.clone())),
            Box::new(move || Settings::from_sources(&env, "", "test")),
        )
    }

    /// init, PAUSE for every pid, CHECKPOINT for every pid (while all succeed).
    fn dump(&self, stage: Stage) -> (Cuda, Vec<HookResult>) {
        let mut c = self.backend();
        c.init(&self.host, stage, &Claims::default()).unwrap();
        let pids = self.tree.0.lock().unwrap().pids.clone();
        let mut r: Vec<HookResult> = pids
            .iter()
            .map(|&p| c.pause_devices(&self.host, p))
            .collect();
        if r.iter().all(|x| x.is_ok()) {
            r.extend(pids.iter().map(|&p| c.checkpoint_devices(&self.host, p)));
        }
        (c, r)
    }
}

fn err_text(r: &HookResult) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_dump_locks_every_cuda_process_at_the_first_pause_then_checkpoints_all() {
    let w = World::new(&[(10, R), (11, R)], &[99]);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(r[0], Ok(Verdict::Done(())));
    assert_eq!(
        r[2],
        Ok(Verdict::NotMine),
        "a process without CUDA is not ours"
    );
    let calls = w.gpu.m().calls.clone();
    let first_ckpt = calls
        .iter()
        .position(|c| c.starts_with("Checkpoint"))
        .unwrap();
    assert!(
        calls[..first_ckpt].contains(&"Lock 11".to_string()),
        "both locked before any checkpoint: {calls:?}"
    );
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (C, C));
    assert_eq!(*w.host.required.lock().unwrap(), ["criu_gpu_cuda"]);
    assert!(
        *w.host.interrupt_only.lock().unwrap(),
        "ptrace-only seizing for a CUDA tree"
    );
    let log = w.host.threads.log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "release 1010",
            "release 1011",
            "recapture 1010",
            "recapture 1011"
        ]
    );
    c.exit(&w.host, Stage::Dump, true);
    let dir = w.host.image_dir.clone().unwrap();
    let img: CudaImage = record::read(&dir, RECORD, FORMAT, VERSION)
        .unwrap()
        .unwrap();
    assert_eq!(img.processes.len(), 2);
    assert_eq!(img.processes[0].gpus[0].memory, Some(1 << 30));
    assert_eq!(img.gpus.len(), 1, "every GPU the driver saw");
    assert_eq!(
        (w.gpu.state(10), w.gpu.state(11)),
        (C, C),
        "tasks die: nothing undone"
    );
}

#[test]
fn a_tree_without_cuda_is_left_to_criu_alone() {
    let mut w = World::new(&[], &[5, 6]);
    w.host.root = Some(5);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| *x == Ok(Verdict::NotMine)), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
    assert!(
        !*w.host.interrupt_only.lock().unwrap(),
        "CRIU's seize mode untouched"
    );
    assert_eq!(*w.host.spawned.lock().unwrap(), 0, "no guardian");
}

#[test]
fn checkpoints_of_several_processes_overlap() {
    let w = World::new(&[(10, R), (11, R), (12, R)], &[]);
    w.gpu.m().delay = Duration::from_millis(300);
    let (_c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    let spans: Vec<_> = w
        .gpu
        .m()
        .spans
        .iter()
        .filter(|s| s.1 == Call::Checkpoint)
        .cloned()
        .collect();
    assert_eq!(spans.len(), 3);
    let latest_start = spans.iter().map(|s| s.2).max().unwrap();
    let earliest_end = spans.iter().map(|s| s.3).min().unwrap();
    assert!(
        latest_start < earliest_end,
        "all three ran at the same time"
    );
}

#[test]
fn a_failed_checkpoint_is_undone_for_every_process() {
    let w = World::new(&[(10, R), (11, R), (12, L)], &[]);
    w.gpu
        .m()
        .fail
        .insert((11, Call::Checkpoint), code::OUT_OF_MEMORY);
    let (mut c, r) = w.dump(Stage::Dump);
    let e = r.iter().find_map(|x| x.as_ref().err()).unwrap().to_string();
    assert!(
        e.contains("process 11") && e.contains("returned to its state"),
        "{e}"
    );
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!(w.gpu.state(10), R, "checkpointed: restored and unlocked");
    assert_eq!(w.gpu.state(11), R, "only locked: unlocked");
    assert_eq!(
        w.gpu.state(12),
        L,
        "locked by someone else before: left locked"
    );
}

#[test]
fn leave_running_returns_every_process_to_running() {
    let mut w = World::new(&[(10, R), (11, C)], &[]);
    w.host.final_state = Some(FinalState::Alive);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
    assert_eq!(w.gpu.state(10), R);
    assert_eq!(w.gpu.state(11), C, "checkpointed before the dump: left so");
    assert!(!w.gpu.m().calls.contains(&"Restore 11".to_string()));
}

#[test]
fn a_lock_that_gives_up_names_the_process_and_the_fix() {
    let w = World::new(&[(10, R), (11, R)], &[]);
    w.gpu.m().fail.insert((11, Call::Lock), 600);
    w.tree.0.lock().unwrap().nccl.insert(11);
    let (mut c, r) = w.dump(Stage::Dump);
    let e = err_text(&r[0]);
    assert!(
        e.contains("GPU work in process 11 (app) did not finish within")
            && e.contains("NCCL")
            && e.contains("CRIU_GPU_LOCK_TIMEOUT_MS"),
        "{e}"
    );
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (R, R));
}

#[test]
fn locks_fit_in_what_is_left_of_criu_seize_time() {
    let mut w = World::new(&[(10, R)], &[]).set("CRIU_GPU_LOCK_TIMEOUT_MS", "9000");
    w.host.seize_left = Some(Duration::from_secs(2));
    let (_c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    let t = w.gpu.m().lock_timeouts[0];
    assert!(t <= Duration::from_secs(2), "{t:?}");
}

#[test]
fn a_held_process_is_refused_before_anything_is_locked() {
    for held in [
        Held::Stopped,
        Held::Traced { by: 77 },
        Held::Thread { tid: 1010, by: 0 },
    ] {
        let w = World::new(&[(10, R), (11, R)], &[]);
        w.tree.0.lock().unwrap().held.insert(11, held.clone());
        let (mut c, r) = w.dump(Stage::Dump);
        let e = err_text(&r[0]);
        assert!(e.contains("nothing was locked"), "{e}");
        assert!(
            w.gpu.m().calls.iter().all(|c| !c.starts_with("Lock")),
            "{held:?}"
        );
        c.exit(&w.host, Stage::Dump, false);
    }
}

#[test]
fn pre_dumps_are_refused_before_any_lock() {
    let w = World::new(&[(10, R)], &[]);
    let (_c, r) = w.dump(Stage::PreDump);
    let e = err_text(&r[0]);
    assert!(e.contains("pre-dump is not supported"), "{e}");
    assert_eq!(w.gpu.state(10), R);
    assert!(w.gpu.m().calls.is_empty(), "nothing was locked");
}

#[test]
fn a_process_stopped_between_its_lock_and_the_seize_fails_the_dump() {
    let w = World::new(&[(10, R)], &[]);
    w.host.threads.seized_stopped.lock().unwrap().push((10, 19));
    let (mut c, r) = w.dump(Stage::Dump);
    let e = err_text(&r[1]);
    assert!(
        e.contains("stopped by signal 19") && e.contains("kill -CONT 10"),
        "{e}"
    );
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!(w.gpu.state(10), R);
}

#[test]
fn a_checkpoint_that_does_not_return_fails_in_time_and_is_undone_once_it_lands() {
    let w = World::new(&[(10, R), (11, R)], &[]).set("CRIU_GPU_ACTION_TIMEOUT_S", "1");
    w.gpu.m().hang.insert((11, Call::Checkpoint));
    let start = Instant::now();
    let (mut c, r) = w.dump(Stage::Dump);
    let e = r.iter().find_map(|x| x.as_ref().err()).unwrap().to_string();
    assert!(e.contains("did not finish within 1 s"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
    // The GPU answers again while `exit` rolls back: the rollback waits behind the checkpoint.
    let gpu = w.gpu.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        gpu.release();
    });
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (R, R));
}

#[test]
fn criu_dying_mid_dump_leaves_the_guardian_to_undo_everything() {
    let w = World::new(&[(10, R), (11, R)], &[]);
    let (c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()));
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (C, C));
    // SIGKILL: no `exit`.
    std::mem::forget(c);
    w.host.criu_dies();
    wait_for("the guardian restores both", || {
        w.gpu.state(10) == R && w.gpu.state(11) == R
    });
    let rec = w.gpu.m().record.join("\n");
    assert!(rec.contains("ended in the middle of a dump"), "{rec}");
    assert!(
        rec.contains("returned to its state before the dump (running)"),
        "{rec}"
    );
}

#[test]
fn tasks_left_alive_after_a_successful_dump_are_undone() {
    // A failed post-dump script: CRIU tells plugins the dump succeeded, then resumes the tasks.
    let w = World::new(&[(10, R)], &[]);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()));
    c.exit(&w.host, Stage::Dump, true);
    assert_eq!(w.gpu.state(10), C);
    w.host.criu_dies();
    wait_for("rolled back", || w.gpu.state(10) == R);
    let rec = w.gpu.m().record.join("\n");
    assert!(rec.contains("post-dump script"), "{rec}");
}

#[test]
fn no_driver_is_an_error_naming_the_library_setting() {
    let mut w = World::new(&[(10, R)], &[]);
    w.host.machine = Some(Arc::new(NoDriver));
    let (_c, r) = w.dump(Stage::Dump);
    let e = err_text(&r[0]);
    assert!(
        e.contains("CUDA_CKPT_LIBCUDA") && e.contains("process 10"),
        "{e}"
    );
}

struct NoDriver;

impl Machine for NoDriver {
    fn driver(&self) -> Result<&dyn GpuDriver, String> {
        Err("libcuda.so.1: cannot open shared object file".into())
    }
    fn alive(&self, _pid: i32, _st: u64) -> bool {
        true
    }
    fn kill(&self, _pid: i32) {}
    fn descendants(&self, _pid: i32) -> Vec<(i32, u64)> {
        Vec::new()
    }
    fn started_since_me(&self, _pid: i32) -> Option<u64> {
        None
    }
    fn record(&self, _level: Level, _line: &str) {}
}

/// An image directory holding a dump of `procs`.
fn dumped(procs: &[(i32, ProcessState)]) -> std::path::PathBuf {
    let w = World::new(procs, &[]);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    std::fs::write(
        w.host.image_dir.clone().unwrap().join("pages-1.img"),
        vec![7u8; 4096],
    )
    .unwrap();
    c.exit(&w.host, Stage::Dump, true);
    w.host.image_dir.clone().unwrap()
}

fn ours() -> Claims {
    Claims {
        ours: true,
        listed: true,
        others: vec![],
    }
}

fn restore_world(dir: std::path::PathBuf, procs: &[(i32, ProcessState)]) -> World {
    let mut w = World::new(procs, &[]);
    w.host.image_dir = Some(dir);
    w
}

#[test]
fn a_restore_brings_back_the_whole_tree_at_once() {
    let dir = dumped(&[(10, R), (11, L), (12, C)]);
    // Restored in a new pid namespace: other real pids, the same namespace pids.
    let w = restore_world(dir, &[(500, C), (501, C), (502, C)]);
    {
        let mut t = w.tree.0.lock().unwrap();
        t.ns = [(500, 10), (501, 11), (502, 12), (503, 13)]
            .into_iter()
            .collect();
        t.pids.push(503);
    }
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    for pid in [500, 501, 502] {
        assert_eq!(c.resume_devices_late(&w.host, pid), Ok(Verdict::Done(())));
    }
    assert_eq!(c.resume_devices_late(&w.host, 503), Ok(Verdict::NotMine));
    // Also the ones someone else had locked or checkpointed before the dump: nothing is left
    // paused by a restore that succeeds.
    for pid in [500, 501, 502] {
        assert_eq!(w.gpu.state(pid), R, "process {pid}");
    }
    assert!(w.tree.0.lock().unwrap().killed.is_empty());
}

#[test]
fn a_failed_restore_kills_the_tree_so_criu_fails() {
    let dir = dumped(&[(10, R), (11, R)]);
    let w = restore_world(dir, &[(10, C), (11, C)]);
    w.gpu
        .m()
        .fail
        .insert((11, Call::Restore), code::OUT_OF_MEMORY);
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    assert_eq!(c.resume_devices_late(&w.host, 10), Ok(Verdict::Done(())));
    let e = c.resume_devices_late(&w.host, 11).unwrap_err().to_string();
    assert!(e.contains("CRIU_GPU_DEVICE_MAP"), "{e}");
    assert_eq!(w.tree.0.lock().unwrap().killed, vec![11, 10]);
}

#[test]
fn restore_is_refused_before_anything_starts_when_gpus_lack_room() {
    let dir = dumped(&[(10, R), (11, R)]);
    let w = restore_world(dir, &[]);
    w.gpu.m().free = 1 << 30; // the two processes need 2 GiB
    let e = w
        .backend()
        .init(&w.host, Stage::Restore, &ours())
        .unwrap_err()
        .to_string();
    assert!(e.contains("2.00 GiB") && e.contains("1.00 GiB free"), "{e}");
}

#[test]
fn damaged_images_are_refused_with_the_file_name() {
    let dir = dumped(&[(10, R)]);
    let w = restore_world(dir.clone(), &[(10, C)]);
    let mut pages = std::fs::read(dir.join("pages-1.img")).unwrap();
    pages[100] ^= 0xff;
    std::fs::write(dir.join("pages-1.img"), &pages).unwrap();
    let e = w
        .backend()
        .init(&w.host, Stage::Restore, &ours())
        .unwrap_err()
        .to_string();
    assert!(e.contains("pages-1.img is damaged"), "{e}");
    std::fs::write(dir.join("pages-1.img"), &pages[..1000]).unwrap();
    let e = w
        .backend()
        .init(&w.host, Stage::Restore, &ours())
        .unwrap_err()
        .to_string();
    assert!(e.contains("pages-1.img is truncated"), "{e}");
}

#[test]
fn restore_without_a_driver_names_the_cause() {
    let dir = dumped(&[(10, R)]);
    let mut w = restore_world(dir, &[]);
    w.host.machine = Some(Arc::new(NoDriver));
    let e = w
        .backend()
        .init(&w.host, Stage::Restore, &ours())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("CUDA state of 1 process") && e.contains("cannot open"),
        "{e}"
    );
}

#[test]
fn what_the_inventory_says_decides_whether_the_record_counts() {
    // A record left over in a reused directory, the image listing plugins but not this one.
    let dir = dumped(&[(10, R)]);
    let w = restore_world(dir.clone(), &[]);
    let stale = Claims {
        ours: false,
        listed: true,
        others: vec![],
    };
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &stale).unwrap();
    assert_eq!(c.resume_devices_late(&w.host, 1), Ok(Verdict::NotMine));
    assert_eq!(*w.host.spawned.lock().unwrap(), 0, "no driver needed");
    // An image of CRIU < 4.1 (no list) without a record holds no CUDA state.
    let empty = restore_world(tempfile::tempdir().unwrap().keep(), &[]);
    let old = Claims {
        ours: true,
        listed: false,
        others: vec![],
    };
    let mut c = empty.backend();
    c.init(&empty.host, Stage::Restore, &old).unwrap();
    assert_eq!(c.resume_devices_late(&empty.host, 1), Ok(Verdict::NotMine));
    // The image lists this plugin but the record is gone.
    let e = empty
        .backend()
        .init(&empty.host, Stage::Restore, &ours())
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpu-cuda.json is missing"), "{e}");
}

#[test]
fn a_bad_restore_setting_does_not_fail_a_dump() {
    let w = World::new(&[(10, R)], &[]).set("CRIU_GPU_DEVICE_MAP", "GPU-1=GPU-2");
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
}

#[test]
fn criu_dying_mid_restore_kills_the_half_restored_tree() {
    let dir = dumped(&[(10, R)]);
    let w = restore_world(dir, &[(10, C)]);
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    // The guardian tracks what CRIU forks; here it is told directly, as RESUME_DEVICES_LATE does.
    c.restore_guardian()
        .unwrap()
        .order(&crate::guardian::proto::Order::Restoring {
            tree: vec![(10, 1)],
        })
        .unwrap();
    std::mem::forget(c);
    w.host.criu_dies();
    wait_for("the tree is killed", || w.gpu.m().dead.contains(&10));
    let rec = w.gpu.m().record.join("\n");
    assert!(rec.contains("in the middle of a restore"), "{rec}");
}

#[test]
fn a_restored_container_without_the_gpus_device_node_is_refused_and_killed() {
    let dir = dumped(&[(10, R)]);
    let w = restore_world(dir, &[(10, C)]);
    w.tree.0.lock().unwrap().no_nodes.insert(10);
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    let e = err_text(&c.resume_devices_late(&w.host, 10));
    assert!(
        e.contains("/dev/nvidia0") && e.contains("nvidia.com/gpu="),
        "{e}"
    );
    assert_eq!(w.tree.0.lock().unwrap().killed, vec![10]);
    assert!(
        !w.gpu.m().calls.iter().any(|c| c.starts_with("Restore")),
        "nothing asked of the driver"
    );
}
