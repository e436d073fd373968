//! NVIDIA CUDA through the driver's checkpoint API (`cuCheckpointProcess*`), driven from CRIU's
//! device hooks. A dump and a restore are separate types ([`dump::Dump`], [`restore::Restore`]);
//! both make their driver calls through the guardian process ([`crate::guardian`]), which the
//! C edge starts for them ([`crate::guardian::SpawnGuardian`]). What the image holds and the checks before a
//! restore are the image crate's ([`criu_gpu_image`]).

// Every function here reads as named steps (clippy.toml: at most 80 lines).

pub mod dump;
pub mod error;
pub mod procs;
pub mod restore;

use std::time::Duration;

pub use criu_gpu_image::cuda::INVENTORY_NAME;
pub use criu_gpu_image::restorable::UPSTREAM_PLUGIN;

use crate::core::{Backend, Claims, HookError, HookResult, Host, Settings, Stage, Verdict};
use crate::guardian::SpawnGuardian;

use process_facts::units::gib;

/// How long a GPU checkpoint or restore of `bytes` (all processes together) may take before the
/// plugin gives up on it: CRIU_GPU_ACTION_TIMEOUT_S, else a generous bound from the size (the
/// driver moved 0.5 to 1.7 GB/s per process on an H100, several processes at once about as fast
/// as one; docs/driver-facts.md), else 10 minutes when the size is unknown.
pub fn action_limit(settings: &Settings, bytes: Option<u64>) -> Result<Duration, HookError> {
    if let Some(limit) = settings.seconds("CRIU_GPU_ACTION_TIMEOUT_S")? {
        return Ok(limit);
    }
    Ok(match bytes {
        // 60 s, plus 2 s per GiB: 0.5 GiB/s, a quarter of the slowest rate measured.
        Some(b) => Duration::from_secs(60 + 2 * b.div_ceil(1 << 30)),
        None => Duration::from_secs(600),
    })
}

enum Session {
    Idle,
    Dump(Box<dump::Dump>),
    Restore(Box<restore::Restore>),
}

/// How the backend sees processes (the machine's /proc, or a test's).
pub type ProcsFactory = Box<dyn Fn() -> Box<dyn procs::Procs> + Send>;
/// Where settings come from (the environment and the settings file, or a test's).
pub type SettingsSource = Box<dyn Fn() -> Settings + Send>;

pub struct Cuda {
    procs: ProcsFactory,
    settings: SettingsSource,
    spawn: SpawnGuardian,
    session: Session,
}

impl Cuda {
    pub fn new(spawn: SpawnGuardian) -> Cuda {
        Cuda::with(
            Box::new(|| Box::new(procs::Real)),
            Box::new(Settings::load),
            spawn,
        )
    }

    pub fn with(procs: ProcsFactory, settings: SettingsSource, spawn: SpawnGuardian) -> Cuda {
        Cuda {
            procs,
            settings,
            spawn,
            session: Session::Idle,
        }
    }
}

#[cfg(test)]
impl Cuda {
    fn restore_guardian(&mut self) -> Option<&mut crate::guardian::Guardian> {
        match &mut self.session {
            Session::Restore(r) => r.guardian(),
            _ => None,
        }
    }
}

impl Backend for Cuda {
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
        let settings = (self.settings)();
        self.session = match stage {
            Stage::Restore => {
                let spawn = self.spawn.clone();
                let r = restore::Restore::init(host, claims, settings, (self.procs)(), spawn)?;
                Session::Restore(Box::new(r))
            }
            Stage::Dump | Stage::PreDump => {
                let spawn = self.spawn.clone();
                let d = dump::Dump::start(host, stage, settings, (self.procs)(), spawn);
                Session::Dump(Box::new(d))
            }
        };
        Ok(())
    }

    fn exit(&mut self, host: &dyn Host, _stage: Stage, success: bool) {
        match &mut self.session {
            Session::Dump(d) => d.exit(host, success),
            Session::Restore(r) => r.exit(),
            Session::Idle => {}
        }
        self.session = Session::Idle;
    }

    fn pause_devices(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        match &mut self.session {
            Session::Dump(d) => d.pause(host, pid),
            _ => Ok(Verdict::NotMine),
        }
    }

    fn checkpoint_devices(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        match &mut self.session {
            Session::Dump(d) => d.checkpoint(host, pid),
            _ => Ok(Verdict::NotMine),
        }
    }

    fn resume_devices_late(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        match &mut self.session {
            Session::Restore(r) => r.resume(host, pid),
            _ => Ok(Verdict::NotMine),
        }
    }
}

#[cfg(test)]
mod tests;
