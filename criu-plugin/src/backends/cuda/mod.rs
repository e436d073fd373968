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
pub mod settings;

use std::sync::Arc;

pub use criu_gpu_image::cuda::INVENTORY_NAME;
pub use criu_gpu_image::restorable::UPSTREAM_PLUGIN;

use crate::core::{Backend, Claims, HookError, HookResult, Host, Settings, Stage, Verdict};
use crate::guardian::SpawnGuardian;

use process_facts::units::gib;

enum Session {
    Idle,
    Dump(Box<dump::Dump>),
    Restore(Box<restore::Restore>),
}

/// How the backend sees processes (the machine's /proc, or a test's).
pub type ProcsFactory = Box<dyn Fn() -> Box<dyn procs::Procs> + Send>;

pub struct Cuda {
    procs: ProcsFactory,
    /// The command's settings, read once by the C edge.
    settings: Arc<Settings>,
    spawn: SpawnGuardian,
    session: Session,
}

impl Cuda {
    pub fn new(settings: Arc<Settings>, spawn: SpawnGuardian) -> Cuda {
        Cuda::with(Box::new(|| Box::new(procs::Real)), settings, spawn)
    }

    pub fn with(procs: ProcsFactory, settings: Arc<Settings>, spawn: SpawnGuardian) -> Cuda {
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
        let settings = &self.settings;
        self.session = match stage {
            Stage::Restore => {
                let spawn = self.spawn.clone();
                let r = restore::Restore::init(host, claims, settings, (self.procs)(), spawn)?;
                Session::Restore(Box::new(r))
            }
            Stage::Dump | Stage::PreDump => {
                let spawn = self.spawn.clone();
                let d = dump::Dump::start(host, stage, settings, (self.procs)(), spawn)?;
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
