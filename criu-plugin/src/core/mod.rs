//! The plugin's rules, free of the C ABI: CRIU's stages, the backends behind one trait, the
//! dispatch rule CRIU itself applies (the first backend that does not answer "not mine" handles
//! the call), and what CRIU offers a backend ([`Host`]).

// Every function here reads as named steps (clippy.toml: at most 80 lines).

pub mod error;
pub mod inet;
pub mod kill;
pub mod stats;
pub mod threads;

use std::ops::Range;
use std::os::fd::{BorrowedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use criu_gpu_image::timings::{self, Command};

pub use self::error::HookError;
pub use self::threads::{Released, ThreadControl, ThreadError, ThreadWindow};
/// The settings, read once by the C edge and passed down (`criu-gpu` reads them too).
pub use criu_gpu_host::settings::{self, Settings};

/// The plugin's name: CRIU's descriptor name, the inventory entry prefix, the log prefix.
pub const NAME: &str = "criu_gpu";

/// The CRIU command the plugin was loaded for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// How CRIU leaves the dumped tasks (`opts.final_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalState {
    /// `--leave-running`.
    Alive,
    /// The default: CRIU kills the tasks after a successful dump.
    Dead,
    /// `--leave-stopped`.
    Stopped,
}

/// What a backend answers to a hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<T = ()> {
    /// Handled.
    Done(T),
    /// Not this backend's process or file: CRIU asks the next plugin.
    NotMine,
}

pub type HookResult<T = ()> = Result<Verdict<T>, HookError>;

/// Lazy pages (`--lazy-pages`): CRIU's way of moving a tree to another machine while its pages
/// follow over the network, and what it does to the tasks meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lazy {
    /// Every page goes through the images (a plain dump or restore).
    No,
    /// Stock CRIU's post-copy: a dump ends its tasks when the connection ends, however it ends
    /// (a receiver that died included); a restore lets its tasks run before their pages are
    /// there. GPU state would be lost either way.
    PostCopy,
    /// The project's CRIU (patch 0014): a dump ends its tasks only once the receiver said it has
    /// every page, and resumes them otherwise; a restore with `--pages-before-resume` puts every
    /// page in place before its tasks resume, and only then lets the dumping side end them.
    Complete,
}

/// What the hosting CRIU offers a backend.
pub trait Host {
    fn final_state(&self) -> Option<FinalState>;
    /// Records in the image's inventory that restoring it needs `name` (a backend's inventory
    /// name, once per dump): CRIU then refuses to restore the image without this plugin.
    fn require_on_restore(&self, name: &str) -> bool;
    /// Makes CRIU seize with ptrace only (no freezer), so GPU drivers act on running tasks.
    /// Only for trees that hold GPU state: it changes how CRIU dumps the whole tree.
    fn use_interrupt_only_seizing(&self) -> bool;
    /// The image directory, as a path.
    fn image_dir(&self) -> Option<PathBuf>;
    /// CRIU's work directory (`--work-dir`, the image directory unless given), where it writes
    /// its log and stats: what a restore writes goes there, never into the images.
    fn work_dir(&self) -> Option<PathBuf> {
        self.image_dir()
    }
    /// The root of the tree being dumped, known from `init` on.
    fn dump_root(&self) -> Option<i32>;
    /// What is left of CRIU's alarm around seizing the tree (PAUSE_DEVICES runs inside it).
    fn seize_time_left(&self) -> Option<Duration>;
    /// CRIU's own pid: the tracer of the seized tasks, the process a guardian watches.
    fn criu_pid(&self) -> i32 {
        std::process::id() as i32
    }
    fn threads(&self) -> &dyn ThreadControl;
    /// Whether CRIU was asked for lazy pages, and how its lazy pages treat the tasks.
    fn lazy(&self) -> Lazy {
        Lazy::No
    }
    /// Restore, from `init`: lets the pages of task `pid` (its pid in the image) in `range`
    /// arrive while the restore goes on, for a consumer in RESUME_DEVICES_LATE. `None`: this
    /// CRIU cannot (stock CRIU); `Some(false)`: it refused.
    fn defer_pages(&self, _pid: i32, _range: Range<u64>) -> Option<bool> {
        None
    }
    /// What this CRIU does with io_uring rings (the project's CRIU: patch 0008).
    fn ring_support(&self) -> process_facts::refusal::RingSupport {
        process_facts::refusal::RingSupport::None
    }
}

/// What the image's inventory said about a backend at restore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// The image lists the backend's inventory name.
    pub ours: bool,
    /// The image has a plugin list at all (dumped by CRIU >= 4.1); without one CRIU cannot say
    /// which plugins an image needs, and the backend decides from its own files.
    pub listed: bool,
    /// Other plugin names the backend asked for and the image listed (e.g. "cuda_plugin").
    pub others: Vec<String>,
}

/// A GPU vendor's backend. Every hook defaults to "not mine".
pub trait Backend: Send {
    fn name(&self) -> &'static str;

    /// The name the backend writes into the image's inventory when the image holds its state
    /// (prefixed with the plugin's; CRIU matches prefixes, so no name may start another).
    fn inventory_name(&self) -> &'static str;

    /// Names of other plugins whose images this backend can restore.
    fn compatible_plugins(&self) -> &'static [&'static str] {
        &[]
    }

    /// Called once per CRIU command. An error fails the command: only for commands that cannot
    /// succeed (a restore that would fail), so that nothing is started.
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

/// How the inventory of the image being restored answers for a plugin name.
pub trait Inventory {
    /// Takes `name` off the image's list (CRIU fails a restore whose list names a plugin nobody
    /// claimed): whether the image listed it.
    fn claim(&self, name: &str) -> bool;
    /// Whether the image has a plugin list at all.
    fn has_list(&self) -> bool;
}

/// The plugin for one CRIU command: the host and the backends.
pub struct Plugin {
    pub stage: Stage,
    host: Box<dyn Host + Send>,
    backends: Vec<Box<dyn Backend>>,
    /// Where this command's timings go, taken at `init`: the image directory on dump, CRIU's
    /// work directory on restore (which leaves the images as they were).
    out_dir: Option<PathBuf>,
    /// A restore on other addresses: the moves of its sockets.
    remap: Option<inet::Remap>,
}

impl Plugin {
    pub fn new(
        stage: Stage,
        host: Box<dyn Host + Send>,
        backends: Vec<Box<dyn Backend>>,
    ) -> Plugin {
        // As a path: CRIU may have closed its descriptor of the images by `exit` (a restore does).
        let out_dir = match stage {
            Stage::Restore => host.work_dir(),
            _ => host.image_dir(),
        }
        .map(|p| std::fs::read_link(&p).unwrap_or(p));
        Plugin {
            stage,
            host,
            backends,
            out_dir,
            remap: None,
        }
    }

    /// A restore: takes the address map of the settings, if any (`offered`: whether CRIU calls
    /// UPDATE_INETSK); one it cannot apply fails the restore before anything starts.
    pub fn load_address_map(
        &mut self,
        settings: &Settings,
        offered: bool,
    ) -> Result<(), HookError> {
        if self.stage == Stage::Restore {
            self.remap = inet::Remap::load(settings, offered)?;
        }
        Ok(())
    }

    /// UPDATE_INETSK: one socket's addresses, moved by the address map ("not mine" when none
    /// of them moves, so that another plugin may).
    pub fn update_inetsk(
        &mut self,
        family: u32,
        state: u32,
        src: &mut [u32],
        dst: &mut [u32],
    ) -> Verdict {
        let moved = self
            .remap
            .as_mut()
            .is_some_and(|r| r.update(family, state, src, dst));
        if moved {
            Verdict::Done(())
        } else {
            Verdict::NotMine
        }
    }

    /// Initialises every backend, telling each on restore what the inventory says of it.
    pub fn init(&mut self, inventory: &dyn Inventory) -> Result<(), HookError> {
        let listed = self.stage == Stage::Restore && inventory.has_list();
        for b in &mut self.backends {
            let mut claims = Claims {
                listed,
                ..Claims::default()
            };
            if self.stage == Stage::Restore {
                claims.ours = inventory.claim(b.inventory_name());
                for other in b.compatible_plugins() {
                    if inventory.claim(other) && listed {
                        claims.others.push(other.to_string());
                    }
                }
            }
            b.init(self.host.as_ref(), self.stage, &claims)
                .map_err(|e| e.in_backend(b.name()))?;
        }
        Ok(())
    }

    /// Runs a hook through the backends in order, as CRIU's own plugin chain does.
    pub fn dispatch<T>(
        &mut self,
        mut f: impl FnMut(&mut dyn Backend, &dyn Host) -> HookResult<T>,
    ) -> HookResult<T> {
        for b in &mut self.backends {
            match f(b.as_mut(), self.host.as_ref()) {
                Ok(Verdict::NotMine) => continue,
                Err(e) => return Err(e.in_backend(b.name())),
                done => return done,
            }
        }
        Ok(Verdict::NotMine)
    }

    pub fn exit(&mut self, success: bool) {
        if let Some(r) = &self.remap {
            tracing::info!("{}", r.summary());
        }
        for b in &mut self.backends {
            b.exit(self.host.as_ref(), self.stage, success);
        }
        self.write_timings(success);
    }

    /// The GPU phases' times as data (criu_gpu_image::timings): a dump's beside its record, a
    /// restore's in CRIU's work directory.
    fn write_timings(&self, success: bool) {
        let command = match self.stage {
            Stage::Dump => Command::Dump,
            Stage::Restore => Command::Restore,
            Stage::PreDump => return,
        };
        let (Some(t), Some(dir)) = (stats::timings(command, success), &self.out_dir) else {
            return;
        };
        match timings::write(dir, &t) {
            Ok(path) => tracing::info!("GPU phase timings in {}", path.display()),
            Err(e) => tracing::warn!("the GPU phase timings were not written: {e}"),
        }
    }
}

#[cfg(test)]
pub mod testing;

#[cfg(test)]
mod tests {
    use super::testing::{verdict, FakeHost};
    use super::*;

    struct B(&'static str, i32);

    impl Backend for B {
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
                -1 => Err(HookError::Backend("broken".into())),
                _ => Ok(Verdict::NotMine),
            }
        }
    }

    struct Inv(Vec<&'static str>, bool);

    impl Inventory for Inv {
        fn claim(&self, name: &str) -> bool {
            !self.1 || self.0.contains(&name)
        }
        fn has_list(&self) -> bool {
            self.1
        }
    }

    fn plugin(stage: Stage) -> Plugin {
        Plugin::new(
            stage,
            Box::new(FakeHost::new(None)),
            vec![Box::new(B("a", 1)), Box::new(B("b", 2))],
        )
    }

    #[test]
    fn first_backend_that_handles_a_call_wins() {
        let mut p = plugin(Stage::Dump);
        p.init(&Inv(vec![], true)).unwrap();
        assert_eq!(
            verdict(&p.dispatch(|b, h| b.pause_devices(h, 2))),
            &Verdict::Done(())
        );
        assert_eq!(
            verdict(&p.dispatch(|b, h| b.pause_devices(h, 3))),
            &Verdict::NotMine
        );
        let err = p.dispatch(|b, h| b.pause_devices(h, -1)).unwrap_err();
        assert_eq!(err.to_string(), "a: broken", "errors name the backend");
    }

    #[test]
    fn a_restore_writes_into_the_work_directory_and_a_dump_into_the_images() {
        let host = |stage| {
            let mut h = FakeHost::new(Some("/images".into()));
            h.work_dir = Some("/work".into());
            Plugin::new(stage, Box::new(h), Vec::new()).out_dir
        };
        assert_eq!(host(Stage::Restore), Some("/work".into()));
        assert_eq!(host(Stage::Dump), Some("/images".into()));
    }

    #[test]
    fn restore_claims_compatible_plugin_names_only_from_a_real_list() {
        let mut p = plugin(Stage::Restore);
        p.init(&Inv(vec!["old_plugin"], true)).unwrap();
        assert_eq!(
            verdict(&p.dispatch(|b, h| b.pause_devices(h, 100))),
            &Verdict::Done(())
        );
        // CRIU < 4.1 images have no list: every claim "succeeds", none may be believed.
        let mut p = plugin(Stage::Restore);
        p.init(&Inv(vec![], false)).unwrap();
        assert_eq!(
            verdict(&p.dispatch(|b, h| b.pause_devices(h, 100))),
            &Verdict::NotMine
        );
    }
}
