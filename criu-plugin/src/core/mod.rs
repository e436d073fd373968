//! The plugin's logic, free of the C ABI: CRIU's stages, the vendor backends behind one trait,
//! and the dispatch rule CRIU itself applies (the first backend that does not answer "not mine"
//! handles the call).

pub mod config;
pub mod record;

use std::os::fd::{BorrowedFd, RawFd};
use std::path::PathBuf;

/// The plugin's name: CRIU's descriptor name, the inventory entry, the log prefix.
pub const NAME: &str = "criu_gpu";

/// The CRIU command the plugin was loaded for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Dump,
    PreDump,
    Restore,
}

impl Stage {
    pub fn from_raw(v: i32) -> Option<Stage> {
        match v {
            0 => Some(Stage::Dump),
            1 => Some(Stage::PreDump),
            2 => Some(Stage::Restore),
            _ => None,
        }
    }
}

/// What a backend answers to a hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<T = ()> {
    /// Handled.
    Done(T),
    /// Not this backend's process or file: CRIU asks the next plugin.
    NotMine,
}

/// A failed hook. The message is the operator's: what went wrong, what state things were left
/// in, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

impl HookError {
    pub fn new(msg: impl Into<String>) -> HookError {
        HookError(msg.into())
    }
}

pub type HookResult<T = ()> = Result<Verdict<T>, HookError>;

/// A thread let go by [`ThreadControl::release`], to be stopped again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    pub tid: i32,
    /// The thread's signal mask before, when it was ptrace-stopped by us; `None` when it was not
    /// stopped and so needs no recapture.
    pub saved_mask: Option<u64>,
}

/// Running one thread of a stopped task (the GPU driver's helper thread).
pub trait ThreadControl {
    fn release(&self, tid: i32) -> Result<Released, String>;
    fn recapture(&self, r: Released) -> Result<(), String>;
}

/// What the hosting CRIU offers a backend.
pub trait Host {
    /// `opts.final_state` (see `abi::criu`); `None` when it cannot be read.
    fn final_state(&self) -> Option<i32>;
    /// Records in the image's inventory that restoring it needs `name` (a backend's name,
    /// once per dump): CRIU then refuses to restore without this plugin.
    fn require_on_restore(&self, name: &str) -> bool;
    /// Makes CRIU seize with ptrace only (no freezer), so GPU drivers act on running tasks.
    fn use_interrupt_only_seizing(&self) -> bool;
    /// The image directory, as a path.
    fn image_dir(&self) -> Option<PathBuf>;
    fn threads(&self) -> &dyn ThreadControl;
}

/// What the image's inventory said about a backend at restore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// Whether the image lists the backend's inventory name; `None` for CRIU < 4.1, which
    /// keeps no list.
    pub ours: Option<bool>,
    /// Other plugin names the backend asked for and the image listed (e.g. "cuda_plugin").
    pub others: Vec<String>,
}

/// A GPU vendor's backend. Every hook defaults to "not mine".
pub trait Vendor: Send {
    fn name(&self) -> &'static str;

    /// The name the backend writes into the image's inventory when the image holds its state
    /// (prefixed with the plugin's; CRIU matches prefixes, so no name may start another).
    fn inventory_name(&self) -> &'static str;

    /// Names of other plugins whose images this backend can restore.
    fn compatible_plugins(&self) -> &'static [&'static str] {
        &[]
    }

    /// Called once per CRIU command. An error fails the command: only for restores that cannot
    /// succeed, so that nothing is started.
    fn init(&mut self, host: &dyn Host, stage: Stage, claims: &Claims) -> Result<(), HookError>;

    /// Called at the end with CRIU's overall result; dumps undo what they did on failure.
    fn exit(&mut self, _host: &dyn Host, _stage: Stage, _success: bool) {}

    fn pause_devices(&mut self, _host: &dyn Host, _pid: i32) -> HookResult {
        Ok(Verdict::NotMine)
    }
    fn checkpoint_devices(&mut self, _host: &dyn Host, _pid: i32) -> HookResult {
        Ok(Verdict::NotMine)
    }
    fn resume_devices_late(&mut self, _host: &dyn Host, _pid: i32) -> HookResult {
        Ok(Verdict::NotMine)
    }
    /// A mapping of a device file: `Done` tells CRIU the plugin owns its contents.
    fn handle_device_vma(&mut self, _host: &dyn Host, _fd: BorrowedFd<'_>) -> HookResult {
        Ok(Verdict::NotMine)
    }
    /// A file CRIU cannot dump (`fd` is CRIU's copy of it).
    fn dump_ext_file(&mut self, _host: &dyn Host, _fd: BorrowedFd<'_>, _id: u32) -> HookResult {
        Ok(Verdict::NotMine)
    }
    /// Returns an fd that CRIU takes over.
    fn restore_ext_file(&mut self, _host: &dyn Host, _id: u32) -> HookResult<RawFd> {
        Ok(Verdict::NotMine)
    }
    /// Returns the new mapping offset and an fd to map instead of the path (or -1).
    fn update_vma_map(
        &mut self,
        _host: &dyn Host,
        _path: &str,
        _addr: u64,
        _old_pgoff: u64,
    ) -> HookResult<(u64, RawFd)> {
        Ok(Verdict::NotMine)
    }
}

/// The plugin for one CRIU command: the host and the backends.
pub struct Plugin {
    pub stage: Stage,
    host: Box<dyn Host + Send>,
    vendors: Vec<Box<dyn Vendor>>,
}

impl Plugin {
    pub fn new(stage: Stage, host: Box<dyn Host + Send>, vendors: Vec<Box<dyn Vendor>>) -> Plugin {
        Plugin {
            stage,
            host,
            vendors,
        }
    }

    /// Initialises every backend; `claim` takes a plugin name off the restored image's
    /// inventory (CRIU fails a restore whose inventory names a plugin nobody claimed).
    pub fn init(&mut self, claim: &dyn Fn(&str) -> Option<bool>) -> Result<(), HookError> {
        for v in &mut self.vendors {
            let mut claims = Claims::default();
            if self.stage == Stage::Restore {
                claims.ours = claim(v.inventory_name());
                for other in v.compatible_plugins() {
                    if claim(other) == Some(true) {
                        claims.others.push(other.to_string());
                    }
                }
            }
            v.init(self.host.as_ref(), self.stage, &claims)
                .map_err(|e| HookError(format!("{}: {e}", v.name())))?;
        }
        Ok(())
    }

    /// Runs a hook through the backends in order, as CRIU's own plugin chain does.
    pub fn dispatch<T>(
        &mut self,
        mut f: impl FnMut(&mut dyn Vendor, &dyn Host) -> HookResult<T>,
    ) -> HookResult<T> {
        for v in &mut self.vendors {
            match f(v.as_mut(), self.host.as_ref()) {
                Ok(Verdict::NotMine) => continue,
                Err(e) => return Err(HookError(format!("{}: {e}", v.name()))),
                done => return done,
            }
        }
        Ok(Verdict::NotMine)
    }

    pub fn exit(&mut self, success: bool) {
        for v in &mut self.vendors {
            v.exit(self.host.as_ref(), self.stage, success);
        }
    }
}

#[cfg(test)]
pub mod testing {
    //! A host for tests of the logic without CRIU.
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct FakeThreads {
        pub log: Mutex<Vec<String>>,
    }

    impl ThreadControl for FakeThreads {
        fn release(&self, tid: i32) -> Result<Released, String> {
            self.log.lock().unwrap().push(format!("release {tid}"));
            Ok(Released {
                tid,
                saved_mask: Some(0),
            })
        }
        fn recapture(&self, r: Released) -> Result<(), String> {
            self.log
                .lock()
                .unwrap()
                .push(format!("recapture {}", r.tid));
            Ok(())
        }
    }

    pub struct FakeHost {
        pub final_state: Option<i32>,
        pub image_dir: Option<PathBuf>,
        pub required: Mutex<Vec<String>>,
        pub threads: FakeThreads,
    }

    impl FakeHost {
        pub fn new(image_dir: Option<PathBuf>) -> FakeHost {
            FakeHost {
                final_state: Some(crate::abi::criu::TASK_DEAD),
                image_dir,
                required: Mutex::new(Vec::new()),
                threads: FakeThreads::default(),
            }
        }
    }

    impl Host for FakeHost {
        fn final_state(&self) -> Option<i32> {
            self.final_state
        }
        fn require_on_restore(&self, name: &str) -> bool {
            self.required.lock().unwrap().push(name.to_owned());
            true
        }
        fn use_interrupt_only_seizing(&self) -> bool {
            true
        }
        fn image_dir(&self) -> Option<PathBuf> {
            self.image_dir.clone()
        }
        fn threads(&self) -> &dyn ThreadControl {
            &self.threads
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::FakeHost;
    use super::*;

    struct V(&'static str, i32);

    impl Vendor for V {
        fn name(&self) -> &'static str {
            self.0
        }
        fn inventory_name(&self) -> &'static str {
            "criu_gpu_test"
        }
        fn compatible_plugins(&self) -> &'static [&'static str] {
            &["old_plugin"]
        }
        fn init(&mut self, _h: &dyn Host, _s: Stage, c: &Claims) -> Result<(), HookError> {
            if c.others.iter().any(|o| o == "old_plugin") {
                self.1 = 100;
            }
            Ok(())
        }
        fn pause_devices(&mut self, _h: &dyn Host, pid: i32) -> HookResult {
            match pid {
                p if p == self.1 => Ok(Verdict::Done(())),
                -1 => Err(HookError::new("broken")),
                _ => Ok(Verdict::NotMine),
            }
        }
    }

    fn plugin(stage: Stage) -> Plugin {
        Plugin::new(
            stage,
            Box::new(FakeHost::new(None)),
            vec![Box::new(V("a", 1)), Box::new(V("b", 2))],
        )
    }

    #[test]
    fn first_backend_that_handles_a_call_wins() {
        let mut p = plugin(Stage::Dump);
        p.init(&|_| None).unwrap();
        assert_eq!(
            p.dispatch(|v, h| v.pause_devices(h, 2)),
            Ok(Verdict::Done(()))
        );
        assert_eq!(
            p.dispatch(|v, h| v.pause_devices(h, 3)),
            Ok(Verdict::NotMine)
        );
        let err = p.dispatch(|v, h| v.pause_devices(h, -1)).unwrap_err();
        assert_eq!(err.0, "a: broken", "errors name the backend");
    }

    #[test]
    fn restore_claims_compatible_plugin_names() {
        let mut p = plugin(Stage::Restore);
        p.init(&|name| Some(name == "old_plugin")).unwrap();
        assert_eq!(
            p.dispatch(|v, h| v.pause_devices(h, 100)),
            Ok(Verdict::Done(()))
        );
    }
}
