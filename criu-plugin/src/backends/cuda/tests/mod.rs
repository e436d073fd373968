//! The CUDA backend's decisions against a fake machine, through a real guardian (on a thread,
//! over the real protocol): what is locked, checkpointed, undone, restored, refused, and what the
//! guardian does alone when CRIU dies.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cuda_checkpoint_ctl::driver::{
    code, Call, CudaError, DeviceMap, DriverInfo, GpuUuid, ProcessState,
};
use cuda_checkpoint_ctl::inventory::{Gpu, GpuUsage, Inventory};
use process_facts::nccl;
use process_facts::process::memory::{Limit, Room};
use process_facts::process::Libraries;
use process_facts::refusal::{self, Refusal, RingSupport};

use criu_gpu_host::thp::Thp;
use criu_gpu_image::cuda::{CudaImage, FORMAT, RECORD, VERSION};
use criu_gpu_image::record;

use super::error::{ActionFailure, DumpError, Held, LockFailure, RestoreError};
use super::procs::Procs;
use super::*;
use crate::core::testing::{verdict, FakeHost};
use crate::core::{FinalState, Settings};
use crate::guardian::machine::{CudaDriver, Leftovers, Machine};
use crate::guardian::proto::{Level, Watch};
use crate::guardian::{GuardianError, Watched};

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
    /// How many more locks of a process give up (its kernel waits in a collective for a peer).
    gives_up: BTreeMap<i32, u32>,
    /// The processes the restore's CRIU created (pid = pid in its namespace here).
    created: BTreeSet<i32>,
    /// The node's huge page policy (a fake sysfs), and what it read during each checkpoint.
    thp: Option<Thp>,
    thp_seen: Vec<String>,
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

impl CudaDriver for Fake {
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
        let mut m = self.m();
        m.lock_timeouts.push(timeout);
        if let Some(n) = m.gives_up.get_mut(&pid).filter(|n| **n > 0) {
            *n -= 1;
            m.calls.push(format!("Lock {pid} gave up"));
            drop(m);
            std::thread::sleep(timeout.min(Duration::from_millis(5)));
            return Err(err(Call::Lock, pid, code::NOT_READY));
        }
        drop(m);
        self.act(pid, Call::Lock, R, L)
    }
    fn checkpoint(&self, pid: i32) -> Result<(), CudaError> {
        let seen = self.m().thp.as_ref().map(thp_shown);
        self.m().thp_seen.extend(seen);
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
    fn alive(&self, pid: i32, _starttime: u64) -> bool {
        !self.m().dead.contains(&pid)
    }
    fn kill(&self, pid: i32) {
        self.m().dead.insert(pid);
    }
    fn created(&self) -> Vec<(i32, i32)> {
        let m = self.m();
        m.created
            .iter()
            .filter(|p| !m.dead.contains(p))
            .map(|p| (*p, *p))
            .collect()
    }
    fn kill_created(&self, pid: i32) {
        let mut m = self.m();
        if m.created.contains(&pid) {
            m.dead.insert(pid);
        }
    }
    fn record(&self, level: Level, line: &str) {
        self.m().record.push(format!("{level:?}: {line}"));
    }
    fn leftovers(&self) -> &dyn Leftovers {
        self
    }
    fn cuda(&self) -> Result<&dyn CudaDriver, String> {
        Ok(self)
    }
}

impl Leftovers for Fake {
    fn thp(&self) -> Option<Thp> {
        self.m().thp.clone()
    }
}

/// A fake node's THP knob at `policy`, in a directory of its own.
fn fake_thp(policy: &str) -> Thp {
    let d = tempfile::tempdir().unwrap().keep();
    std::fs::create_dir(d.join("sys")).unwrap();
    std::fs::write(d.join("sys/enabled"), policy).unwrap();
    Thp {
        sysfs: d.join("sys"),
        run_dir: d.join("run"),
    }
}

/// The word the fake knob shows.
fn thp_shown(t: &Thp) -> String {
    std::fs::read_to_string(t.sysfs.join("enabled")).unwrap()
}

/// The processes as /proc shows them.
#[derive(Clone, Default)]
struct Tree(Arc<Mutex<TreeState>>);

#[derive(Default)]
struct TreeState {
    pids: Vec<i32>,
    cuda: BTreeSet<i32>,
    nccl: BTreeSet<i32>,
    /// NCCL's settings per process (none: NCCL's defaults).
    nccl_config: BTreeMap<i32, nccl::Config>,
    /// Processes holding io_uring instances, and those whose rings are not idle.
    uring: BTreeSet<i32>,
    busy_uring: BTreeSet<i32>,
    held: BTreeMap<i32, Held>,
    /// pid -> ns pid (restored processes in a new pid namespace).
    ns: BTreeMap<i32, i32>,
    /// Tracer of every process (CRIU's pid once seized).
    tracer: i32,
    /// Processes that died (killed after their lock).
    dying: BTreeSet<i32>,
    /// Processes whose root has no /dev/nvidiaN (a container restored with other devices).
    no_nodes: BTreeSet<i32>,
    killed: Vec<i32>,
    /// Plain memory per process, as successive reads see it (the last one stays).
    anon: BTreeMap<i32, Vec<Vec<Range<u64>>>>,
    /// The host memory left (default: unknown, nothing refused).
    room: Room,
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
    fn dying(&self, pid: i32) -> bool {
        self.0.lock().unwrap().dying.contains(&pid)
    }
    fn has_gpu_node(&self, pid: i32, _minor: u32) -> bool {
        !self.0.lock().unwrap().no_nodes.contains(&pid)
    }
    fn kill(&self, pid: i32) {
        self.0.lock().unwrap().killed.push(pid);
    }
    fn nccl(&self, ranks: &[(i32, String)]) -> Option<Refusal> {
        let t = self.0.lock().unwrap();
        refusal::nccl(ranks, |p| {
            t.nccl_config.get(&p).cloned().unwrap_or_default()
        })
    }
    fn anon_writable(&self, pid: i32) -> std::io::Result<Vec<Range<u64>>> {
        let mut t = self.0.lock().unwrap();
        Ok(match t.anon.get_mut(&pid) {
            Some(reads) if reads.len() > 1 => reads.remove(0),
            Some(reads) => reads.first().cloned().unwrap_or_default(),
            None => Vec::new(),
        })
    }
    fn room(&self, _pids: &[i32]) -> Room {
        self.0.lock().unwrap().room.clone()
    }
    fn io_uring(&self, pid: i32, support: RingSupport) -> Option<Refusal> {
        let t = self.0.lock().unwrap();
        let busy = t.busy_uring.contains(&pid);
        if !t.uring.contains(&pid) || (support == RingSupport::Idle && !busy) {
            return None;
        }
        Some(Refusal::IoUring {
            pid,
            comm: "app".into(),
            support,
            fds: 1,
            mappings: 2,
            rings: busy
                .then(|| "fd 7: io_uring with 1 request(s) in flight (opcodes 22)".into())
                .into_iter()
                .collect(),
            libraries: vec!["libtorch_cpu.so".into()],
        })
    }
}

/// Guardians on threads of the test process, acting on a fake machine.
#[derive(Clone, Default)]
struct Guardians(Arc<Mutex<GuardiansState>>);

#[derive(Default)]
struct GuardiansState {
    /// The machine guardians act on (none: starting one fails).
    machine: Option<Arc<dyn Machine>>,
    /// "CRIU" as the guardians see it: [`Guardians::criu_dies`] ends it.
    watched: Vec<Watched>,
    /// The threads of the guardians whose CRIU died.
    alone: Vec<std::thread::JoinHandle<()>>,
    spawned: u32,
}

impl Guardians {
    fn spawner(&self) -> SpawnGuardian {
        let me = self.clone();
        Arc::new(move |watch: Watch| {
            let mut s = me.0.lock().unwrap();
            s.spawned += 1;
            let Some(m) = s.machine.clone() else {
                return Err(GuardianError::Spawn("no guardian in this test".into()));
            };
            let (g, watched) = crate::guardian::in_thread(watch, m)?;
            s.watched.push(watched);
            Ok(g)
        })
    }

    fn set_machine(&self, m: Arc<dyn Machine>) {
        self.0.lock().unwrap().machine = Some(m);
    }

    fn spawned(&self) -> u32 {
        self.0.lock().unwrap().spawned
    }

    /// CRIU ends without calling `exit` (SIGKILL): every guardian sees it go.
    fn criu_dies(&self) {
        let mut s = self.0.lock().unwrap();
        let ended: Vec<_> = s.watched.drain(..).map(Watched::end).collect();
        s.alone.extend(ended);
    }

    /// Waits until every guardian whose CRIU died has done what it does alone and ended: only
    /// then does the absence of an action prove anything.
    fn wait_ended(&self) {
        wait_for("the guardians end", || {
            self.0.lock().unwrap().alone.iter().all(|t| t.is_finished())
        });
    }
}

struct World {
    gpu: Fake,
    tree: Tree,
    host: FakeHost,
    guardians: Guardians,
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
        let guardians = Guardians::default();
        guardians.set_machine(Arc::new(gpu.clone()));
        World {
            gpu,
            tree,
            host,
            guardians,
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
            Arc::new(Settings::from_sources(&env, "", "test")),
            self.guardians.spawner(),
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

/// The backend's typed error a hook failed with (`DumpError`, `RestoreError`).
fn failure<E: std::error::Error + 'static, T: std::fmt::Debug>(r: &Result<T, HookError>) -> &E {
    match r {
        Err(e) => e
            .gpu_error()
            .unwrap_or_else(|| panic!("not a {}: {e}", std::any::type_name::<E>())),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

/// The first failure among a dump's hook results.
fn first_failure(r: &[HookResult]) -> &DumpError {
    let e = r.iter().find(|x| x.is_err()).expect("a hook failed");
    failure(e)
}

/// The pids of a failure's processes.
fn pids<T>(list: &[(error::Who, T)]) -> Vec<i32> {
    list.iter().map(|(w, _)| w.pid).collect()
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

struct NoDriver;

impl Machine for NoDriver {
    fn alive(&self, _pid: i32, _st: u64) -> bool {
        true
    }
    fn kill(&self, _pid: i32) {}
    fn created(&self) -> Vec<(i32, i32)> {
        Vec::new()
    }
    fn kill_created(&self, _pid: i32) {}
    fn record(&self, _level: Level, _line: &str) {}
    fn cuda(&self) -> Result<&dyn CudaDriver, String> {
        Err("libcuda.so.1: cannot open shared object file".into())
    }
}

mod dump;
mod messages;
mod restore;
