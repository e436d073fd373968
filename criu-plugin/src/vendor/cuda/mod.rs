//! NVIDIA CUDA through the driver's checkpoint API.
//!
//! Dump: PAUSE_DEVICES locks each CUDA process while it still runs (CRIU seizes it right after);
//! the first CHECKPOINT_DEVICES checkpoints all of them at once, each on its own thread, with
//! their driver threads let run; the device memory is then ordinary process memory that CRIU
//! dumps. If the dump fails, or the tasks are to keep running, `exit` restores and unlocks them.
//!
//! Restore: `init` checks the GPUs and their free memory before CRIU creates anything; the first
//! RESUME_DEVICES_LATE restores every CUDA process of the tree at once. CRIU ignores that hook's
//! errors, so a failed GPU restore kills the restored tree: CRIU then reports the restore as
//! failed, and the images, which a restore never changes, serve for the next attempt.

mod placement;
mod system;

use std::collections::BTreeMap;
use std::time::Instant;

use cuda_checkpoint_ctl::driver::{code, CudaError, DeviceMap, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;
use cuda_checkpoint_ctl::ops::in_parallel;

use crate::abi::criu::TASK_DEAD;
use crate::core::config::Config;
use crate::core::{record, Claims, HookError, HookResult, Host, Released, Stage, Vendor, Verdict};

pub use self::placement::{plan, CudaImage, Plan, ProcessRecord, Usage, FORMAT, RECORD};
pub use self::system::{CudaSystem, Real};

/// The image name of NVIDIA's own CRIU plugin: its checkpoints are restored too.
const UPSTREAM_PLUGIN: &str = "cuda_plugin";
/// This backend's entry in the image's inventory.
pub const INVENTORY_NAME: &str = "criu_gpu_cuda";

/// A CUDA process of the dump.
#[derive(Debug, Clone)]
struct Tracked {
    pid: i32,
    restore_tid: i32,
    record: ProcessRecord,
    /// We locked it (it was running).
    locked: bool,
    /// We checkpointed it.
    checkpointed: bool,
}

#[derive(Default)]
struct DumpSession {
    tracked: Vec<Tracked>,
    /// The outcome of checkpointing all processes, once the first CHECKPOINT_DEVICES ran.
    checkpoint: Option<Result<(), HookError>>,
    inventory: Option<Option<Inventory>>,
    required: bool,
}

#[derive(Default)]
struct RestoreSession {
    image: Option<CudaImage>,
    /// Images of NVIDIA's plugin carry no record: every CUDA process found is restored.
    upstream: bool,
    plan: Plan,
    /// pid -> restored fine; filled by the first RESUME_DEVICES_LATE.
    results: Option<BTreeMap<i32, Result<(), String>>>,
}

pub struct Cuda {
    config: Config,
    stage: Stage,
    load: Loader,
    sys: Option<Box<dyn CudaSystem>>,
    dump: DumpSession,
    restore: RestoreSession,
}

/// How the backend reaches the driver (the machine's, or a test's fake).
pub type Loader = Box<dyn Fn() -> Result<Box<dyn CudaSystem>, String> + Send>;

fn load_real() -> Result<Box<dyn CudaSystem>, String> {
    Real::load()
        .map(|r| Box::new(r) as Box<dyn CudaSystem>)
        .map_err(|e| e.to_string())
}

/// Results that mean "this process has no CUDA state" rather than a failure.
fn not_cuda(e: &CudaError) -> bool {
    matches!(
        e.code,
        code::NOT_INITIALIZED | code::NOT_FOUND | code::OPERATING_SYSTEM
    )
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

impl Cuda {
    pub fn new() -> Cuda {
        Cuda::with_loader(Box::new(load_real))
    }

    /// With another way to reach the machine (tests).
    pub fn with_loader(load: Loader) -> Cuda {
        Cuda {
            config: Config::default(),
            stage: Stage::Dump,
            load,
            sys: None,
            dump: DumpSession::default(),
            restore: RestoreSession::default(),
        }
    }

    fn sys(&self) -> Option<&dyn CudaSystem> {
        self.sys.as_deref()
    }

    // ---- dump ----

    fn pause(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        let Some(sys) = self.sys() else {
            return Ok(Verdict::NotMine);
        };
        if !sys.maps_libcuda(pid) {
            return Ok(Verdict::NotMine);
        }
        let restore_tid = match sys.restore_thread_id(pid) {
            Ok(t) => t,
            Err(e) if not_cuda(&e) => return Ok(Verdict::NotMine),
            Err(e) => {
                return Err(HookError(format!(
                    "cannot tell whether process {pid} uses CUDA: {e}; run criu as root"
                )))
            }
        };
        let comm = sys.comm(pid).unwrap_or_default();
        if self.stage == Stage::PreDump {
            return Err(HookError(format!(
                "pre-dump is not supported for CUDA process {pid} ({comm}): device memory has no \
                 dirty tracking and a pre-dump has no point at which to undo a lock; run \
                 `criu dump` without pre-dump (nothing was locked, the process keeps running)"
            )));
        }
        if sys.is_stopped(pid) {
            return Err(HookError(format!(
                "CUDA process {pid} ({comm}) is stopped (SIGSTOP): the driver cannot lock it, its \
                 helper thread must run; continue it (kill -CONT {pid}) and dump again"
            )));
        }
        let state = sys.state(pid).map_err(|e| HookError(e.to_string()))?;
        let locked = match state {
            ProcessState::Running => {
                let start = Instant::now();
                sys.lock(pid, self.config.lock_timeout).map_err(|e| {
                    HookError(if e.is_timeout() {
                        format!(
                            "locking CUDA process {pid} ({comm}) timed out after {} ms: GPU work \
                             it submitted did not finish in time; the process keeps running. \
                             Retry, or raise CRIU_GPU_LOCK_TIMEOUT_MS together with criu --timeout",
                            self.config.lock_timeout.as_millis()
                        )
                    } else {
                        format!("locking CUDA process {pid} ({comm}): {e}")
                    })
                })?;
                tracing::info!(
                    pid,
                    restore_tid,
                    "locked CUDA process in {:.1} ms",
                    start.elapsed().as_secs_f64() * 1e3
                );
                true
            }
            // Paused by someone else before the dump: leave it as it is found.
            ProcessState::Locked | ProcessState::Checkpointed => {
                tracing::info!(pid, %state, "CUDA process was already paused; it is left so");
                false
            }
            other => {
                return Err(HookError(format!(
                "CUDA process {pid} ({comm}) is in state {other}: the driver cannot checkpoint it"
            )))
            }
        };
        let gpus = self.usage_of(pid);
        let ns_pid = self.sys().and_then(|s| s.ns_pid(pid)).unwrap_or(pid);
        self.dump.tracked.push(Tracked {
            pid,
            restore_tid,
            locked,
            checkpointed: false,
            record: ProcessRecord {
                ns_pid,
                pid,
                comm,
                initial_state: state,
                gpus,
            },
        });
        if !self.dump.required {
            self.dump.required = host.require_on_restore(INVENTORY_NAME);
        }
        Ok(Verdict::Done(()))
    }

    fn usage_of(&mut self, pid: i32) -> Vec<Usage> {
        let sys = self.sys.as_deref();
        let inv = self
            .dump
            .inventory
            .get_or_insert_with(|| sys.and_then(|s| s.inventory()));
        inv.as_ref()
            .map(|i| {
                i.usage_of(pid)
                    .into_iter()
                    .map(|u| Usage {
                        uuid: u.gpu,
                        memory: u.memory,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn checkpoint(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        if !self.dump.tracked.iter().any(|t| t.pid == pid) {
            return Ok(Verdict::NotMine);
        }
        if self.dump.checkpoint.is_none() {
            let result = self.checkpoint_all(host);
            self.dump.checkpoint = Some(result);
        }
        match self.dump.checkpoint.as_ref().expect("set above") {
            Ok(()) => Ok(Verdict::Done(())),
            Err(e) => Err(e.clone()),
        }
    }

    /// Checkpoints every tracked process concurrently.
    fn checkpoint_all(&mut self, host: &dyn Host) -> Result<(), HookError> {
        let sys = self
            .sys
            .as_deref()
            .expect("tracked processes imply a driver");
        let todo: Vec<(i32, i32)> = self
            .dump
            .tracked
            .iter()
            .filter(|t| t.record.initial_state != ProcessState::Checkpointed)
            .map(|t| (t.pid, t.restore_tid))
            .collect();
        let start = Instant::now();
        let results =
            with_threads_running(host, self.config.parallel, &todo, |pid| sys.checkpoint(pid))?;
        let mut failures = Vec::new();
        for (pid, r) in results {
            let t = self
                .dump
                .tracked
                .iter_mut()
                .find(|t| t.pid == pid)
                .expect("own pid");
            match r {
                Ok(()) => t.checkpointed = true,
                Err(e) => failures.push(format!("process {pid} ({}): {e}", t.record.comm)),
            }
        }
        if !failures.is_empty() {
            return Err(HookError(format!(
                "checkpoint of CUDA state failed for {}; the dump is abandoned and every CUDA \
                 process is being returned to its state before the dump",
                failures.join("; ")
            )));
        }
        let bytes: u64 = self
            .dump
            .tracked
            .iter()
            .flat_map(|t| t.record.gpus.iter().filter_map(|u| u.memory))
            .sum();
        tracing::info!(
            "checkpointed {} CUDA process(es), {:.2} GiB of device memory, in {:.2} s",
            todo.len(),
            gib(bytes),
            start.elapsed().as_secs_f64()
        );
        self.write_image(host)
    }

    fn write_image(&self, host: &dyn Host) -> Result<(), HookError> {
        let sys = self.sys().expect("driver");
        let inv = self.dump.inventory.clone().flatten();
        let image = CudaImage {
            driver: sys.driver_info(),
            driver_version: inv.as_ref().map(|i| i.driver_version.clone()),
            gpus: inv.map(|i| i.gpus).unwrap_or_default(),
            processes: self.dump.tracked.iter().map(|t| t.record.clone()).collect(),
        };
        let dir = host
            .image_dir()
            .ok_or_else(|| HookError::new("CRIU's image directory is not available"))?;
        record::write(&dir, placement::RECORD, placement::FORMAT, &image)
    }

    /// Returns every tracked process to its state before the dump.
    fn roll_back(&mut self, host: &dyn Host) {
        let Some(sys) = self.sys.as_deref() else {
            return;
        };
        let todo: Vec<(i32, i32)> = self
            .dump
            .tracked
            .iter()
            .filter(|t| t.locked || t.checkpointed)
            .map(|t| (t.pid, t.restore_tid))
            .collect();
        if todo.is_empty() {
            return;
        }
        let tracked = &self.dump.tracked;
        let undo = |pid: i32| -> Result<(), CudaError> {
            let t = tracked.iter().find(|t| t.pid == pid).expect("own pid");
            if t.checkpointed {
                sys.restore(pid, &DeviceMap::default())?;
            }
            if t.record.initial_state == ProcessState::Running {
                sys.unlock(pid)?;
            }
            Ok(())
        };
        let start = Instant::now();
        match with_threads_running(host, self.config.parallel, &todo, undo) {
            Ok(results) => {
                for (pid, r) in results {
                    match r {
                        Ok(()) => tracing::info!(pid, "CUDA state returned to its state before the dump"),
                        Err(e) => tracing::error!(
                            "CUDA process {pid} could not be returned to its state before the dump \
                             ({e}); it stays paused: run `cuda-checkpoint-ctl --recover --pid {pid}`"
                        ),
                    }
                }
            }
            Err(e) => tracing::error!(
                "{e}; the CUDA processes may stay paused: run `cuda-checkpoint-ctl --recover --all`"
            ),
        }
        tracing::info!("rollback took {:.2} s", start.elapsed().as_secs_f64());
    }

    // ---- restore ----

    fn init_restore(&mut self, host: &dyn Host, claims: &Claims) -> Result<(), HookError> {
        let dir = host.image_dir();
        let image: Option<CudaImage> = match &dir {
            Some(d) => record::read(d, placement::RECORD, placement::FORMAT)?,
            None => None,
        };
        let upstream = claims.others.iter().any(|o| o == UPSTREAM_PLUGIN);
        if image.is_none() && claims.ours == Some(true) {
            return Err(HookError(format!(
                "the image's inventory says it holds CUDA state ({INVENTORY_NAME}) but {} is \
                 missing from the image directory: it was not copied completely; copy it again \
                 from its source",
                placement::RECORD
            )));
        }
        if image.is_none() && !upstream {
            return Ok(());
        }
        let what = match &image {
            Some(i) => format!("CUDA state of {} process(es)", i.processes.len()),
            None => format!("CUDA state dumped by NVIDIA's {UPSTREAM_PLUGIN}"),
        };
        let sys = (self.load)()
            .map_err(|e| HookError(format!("the checkpoint holds {what}, but {e}")))?;
        if let Some(img) = &image {
            let inv = sys.inventory();
            if inv.is_none() {
                tracing::warn!(
                    "NVML is not available: GPUs and free memory are not checked before restoring"
                );
            }
            let plan = plan(img, inv.as_ref(), &self.config.placement)
                .map_err(|e| HookError(format!("cannot restore the {what} here: {e}")))?;
            for n in &plan.notes {
                tracing::info!("{n}");
            }
            if let (Some(then), Some(now)) =
                (&img.driver_version, inv.as_ref().map(|i| &i.driver_version))
            {
                if then != now {
                    tracing::warn!("dumped with NVIDIA driver {then}, restoring with {now}");
                }
            }
            self.restore.plan = plan;
        }
        self.restore.image = image;
        self.restore.upstream = upstream;
        self.sys = Some(sys);
        Ok(())
    }

    fn resume(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        let Some(sys) = self.sys.as_deref() else {
            return Ok(Verdict::NotMine);
        };
        if self.restore.results.is_none() {
            // The first call is for the root of the restored tree: do the whole tree now.
            let results = self.restore_tree(host, pid);
            if results.values().any(|r| r.is_err()) {
                let tree = sys.tree(pid);
                tracing::error!(
                    "killing the restored process tree ({} processes) so that criu reports the \
                     restore as failed; the images are unchanged and can be restored again",
                    tree.len()
                );
                for p in tree.iter().rev() {
                    sys.kill(*p);
                }
            }
            self.restore.results = Some(results);
        }
        match self.restore.results.as_ref().and_then(|r| r.get(&pid)) {
            None => Ok(Verdict::NotMine),
            Some(Ok(())) => Ok(Verdict::Done(())),
            Some(Err(e)) => Err(HookError(e.clone())),
        }
    }

    /// Finds the restored CUDA processes under `root` and restores them concurrently.
    fn restore_tree(&self, host: &dyn Host, root: i32) -> BTreeMap<i32, Result<(), String>> {
        let sys = self.sys().expect("driver");
        let mut results = BTreeMap::new();
        let mut todo: Vec<(i32, ProcessRecord)> = Vec::new();
        let tree = sys.tree(root);
        match &self.restore.image {
            Some(img) => {
                for p in &img.processes {
                    match tree.iter().find(|&&pid| sys.ns_pid(pid) == Some(p.ns_pid)) {
                        Some(&pid) => todo.push((pid, p.clone())),
                        None => {
                            results.insert(
                                root,
                                Err(format!(
                                    "CUDA process {} ({}) of the checkpoint is not in the restored tree",
                                    p.ns_pid, p.comm
                                )),
                            );
                        }
                    }
                }
            }
            None => {
                for &pid in &tree {
                    if sys.maps_libcuda(pid) && sys.restore_thread_id(pid).is_ok() {
                        todo.push((
                            pid,
                            ProcessRecord {
                                ns_pid: sys.ns_pid(pid).unwrap_or(pid),
                                pid,
                                comm: sys.comm(pid).unwrap_or_default(),
                                initial_state: ProcessState::Running,
                                gpus: Vec::new(),
                            },
                        ));
                    }
                }
            }
        }
        let mut threads = Vec::new();
        for (pid, p) in &todo {
            match sys.restore_thread_id(*pid) {
                Ok(tid) => threads.push((*pid, tid)),
                Err(e) => {
                    results.insert(
                        *pid,
                        Err(format!(
                            "restored process {pid} ({}) has no CUDA restore thread: {e}",
                            p.comm
                        )),
                    );
                }
            }
        }
        let records: BTreeMap<i32, &ProcessRecord> =
            todo.iter().map(|(pid, p)| (*pid, p)).collect();
        let plan = &self.restore.plan;
        let one = |pid: i32| -> Result<(), CudaError> {
            let p = records[&pid];
            if p.initial_state == ProcessState::Checkpointed {
                return Ok(()); // it was checkpointed before the dump: leave it so
            }
            let map = plan.maps.get(&p.ns_pid).cloned().unwrap_or_default();
            sys.restore(pid, &map)?;
            if p.initial_state == ProcessState::Running {
                sys.unlock(pid)?;
            }
            Ok(())
        };
        let start = Instant::now();
        match with_threads_running(host, self.config.parallel, &threads, one) {
            Ok(done) => {
                for (pid, r) in done {
                    let p = records[&pid];
                    results.insert(
                        pid,
                        r.map_err(|e| {
                            let hint = if e.code == code::OUT_OF_MEMORY {
                                "free GPU memory or restore onto another GPU with CRIU_GPU_DEVICE_MAP"
                            } else {
                                "see the driver's error"
                            };
                            format!("restoring CUDA state of process {pid} ({}) failed: {e}; {hint}", p.comm)
                        }),
                    );
                }
            }
            Err(e) => {
                for (pid, _) in &threads {
                    results.insert(*pid, Err(e.0.clone()));
                }
            }
        }
        let ok = results.values().filter(|r| r.is_ok()).count();
        tracing::info!(
            "restored CUDA state of {ok} of {} process(es) in {:.2} s",
            results.len(),
            start.elapsed().as_secs_f64()
        );
        for r in results.values() {
            if let Err(e) = r {
                tracing::error!("{e}");
            }
        }
        results
    }
}

impl Default for Cuda {
    fn default() -> Self {
        Cuda::new()
    }
}

/// Each process's result, in the order asked.
type PerProcess<E> = Vec<(i32, Result<(), E>)>;

/// Lets the driver threads of `procs` (pid, thread) run, runs `f` for every pid concurrently
/// (signals blocked in the workers, so they keep going to CRIU's main thread), and stops the
/// threads again. Ptrace stays on the calling thread.
fn with_threads_running<E: Send>(
    host: &dyn Host,
    parallel: bool,
    procs: &[(i32, i32)],
    f: impl Fn(i32) -> Result<(), E> + Sync,
) -> Result<PerProcess<E>, HookError> {
    let threads = host.threads();
    let mut released: Vec<Released> = Vec::new();
    for &(pid, tid) in procs {
        match threads.release(tid) {
            Ok(r) => released.push(r),
            Err(e) => {
                for r in released {
                    let _ = threads.recapture(r);
                }
                return Err(HookError(format!(
                    "cannot let the CUDA restore thread {tid} of process {pid} run: {e}"
                )));
            }
        }
    }
    let pids: Vec<i32> = procs.iter().map(|p| p.0).collect();
    let results = if parallel {
        in_parallel(&pids, |pid| {
            let _ = nix::sys::signal::pthread_sigmask(
                nix::sys::signal::SigmaskHow::SIG_BLOCK,
                Some(&nix::sys::signal::SigSet::all()),
                None,
            );
            f(pid)
        })
    } else {
        pids.iter().map(|&pid| f(pid)).collect()
    };
    let mut stop_errors = Vec::new();
    for r in released {
        if let Err(e) = threads.recapture(r) {
            stop_errors.push(e);
        }
    }
    if !stop_errors.is_empty() {
        return Err(HookError(stop_errors.join("; ")));
    }
    Ok(pids.into_iter().zip(results).collect())
}

impl Vendor for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn inventory_name(&self) -> &'static str {
        INVENTORY_NAME
    }

    fn compatible_plugins(&self) -> &'static [&'static str] {
        &[UPSTREAM_PLUGIN]
    }

    fn init(&mut self, host: &dyn Host, stage: Stage, claims: &Claims) -> Result<(), HookError> {
        self.stage = stage;
        self.config = Config::load()?;
        if stage == Stage::Restore {
            return self.init_restore(host, claims);
        }
        match (self.load)() {
            Ok(sys) => {
                tracing::info!("CUDA driver: {}", sys.driver_info());
                if stage == Stage::Dump && !host.use_interrupt_only_seizing() {
                    tracing::warn!("this CRIU cannot seize without the freezer; frozen CUDA processes cannot be locked");
                }
                self.sys = Some(sys);
            }
            // No driver, no CUDA processes: stay out of the way.
            Err(e) => tracing::debug!("CUDA support off: {e}"),
        }
        Ok(())
    }

    fn exit(&mut self, host: &dyn Host, stage: Stage, success: bool) {
        if stage != Stage::Dump || self.dump.tracked.is_empty() {
            return;
        }
        let final_state = host.final_state();
        if success && final_state == Some(TASK_DEAD) {
            tracing::info!(
                "dump done; the CUDA processes end with the tree, their state is in the images"
            );
            return;
        }
        tracing::info!(
            "{}: returning CUDA processes to their state before the dump",
            if success {
                "the tasks keep running"
            } else {
                "the dump failed"
            }
        );
        self.roll_back(host);
    }

    fn pause_devices(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        self.pause(host, pid)
    }

    fn checkpoint_devices(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        self.checkpoint(host, pid)
    }

    fn resume_devices_late(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        self.resume(host, pid)
    }
}

#[cfg(test)]
mod tests;
