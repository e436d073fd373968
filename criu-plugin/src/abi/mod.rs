//! The C ABI edge: the `CR_PLUGIN_DESC` descriptor CRIU looks up, and one trampoline per hook
//! that converts arguments, runs the hook on the plugin, and converts the answer. No panic
//! crosses into CRIU: every entry point (`init`, `exit`, each hook) runs all of its body under
//! [`entry`], which writes a panic into CRIU's log and answers with the entry point's failure
//! value (`exit` has none). The descriptor, hook ids and types, and what [`criu`] reads of
//! CRIU's structs are checked against the pinned CRIU's headers (layout.rs, a test).

// Every function here reads as named steps (clippy.toml: at most 80 lines).

pub mod criu;
#[cfg(test)]
mod layout;
pub mod ptrace;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::io::Write as _;
use std::os::fd::BorrowedFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use crate::core::{
    stats, FinalState, HookResult, Host, Inventory, Plugin, Settings, Stage, ThreadControl,
    Verdict, NAME,
};
use crate::guardian::proto::Watch;
use crate::guardian::{Dirs, Guardian, GuardianError, SpawnGuardian};
use criu_gpu_image::addrmap;

/// CRIU's plugin ABI version (CRIU_PLUGIN_VERSION, unchanged since 2014).
const PLUGIN_VERSION: c_uint = 0x200;
/// Hooks 0..=11: every CRIU from 4.0 on accepts a plugin with this many (4.2 has 13).
const BASE_HOOKS: usize = 12;
/// The descriptor's slots: up to UPDATE_INETSK, offered where CRIU reads that many
/// ([`offer_newer_hooks`]).
const HOOK_SLOTS: usize = 16;
const ENOTSUP: c_int = libc::EOPNOTSUPP;

mod hook {
    pub const DUMP_EXT_FILE: usize = 2;
    pub const RESTORE_EXT_FILE: usize = 3;
    pub const HANDLE_DEVICE_VMA: usize = 7;
    pub const UPDATE_VMA_MAP: usize = 8;
    pub const RESUME_DEVICES_LATE: usize = 9;
    pub const PAUSE_DEVICES: usize = 10;
    pub const CHECKPOINT_DEVICES: usize = 11;
    /// criu#2841; the project's CRIU, patch 0012.
    pub const UPDATE_INETSK: usize = 15;
}

// UPDATE_INETSK is one of the slots, past those every CRIU reads.
const _: () = assert!(BASE_HOOKS <= hook::UPDATE_INETSK && hook::UPDATE_INETSK < HOOK_SLOTS);

/// `cr_plugin_desc_t`. `max_hooks` is set once, as CRIU loads the plugin and before it reads
/// the descriptor (an atomic has the layout of the `unsigned int` CRIU reads).
#[repr(C)]
pub struct PluginDesc {
    name: *const c_char,
    init: Option<extern "C" fn(c_int) -> c_int>,
    exit: Option<extern "C" fn(c_int, c_int)>,
    version: c_uint,
    max_hooks: AtomicU32,
    hooks: [*const c_void; HOOK_SLOTS],
}

// SAFETY: the descriptor's pointers point to 'static code and data and never change; its one
// changing field is atomic.
unsafe impl Sync for PluginDesc {}

const fn hooks() -> [*const c_void; HOOK_SLOTS] {
    let mut h = [std::ptr::null::<c_void>(); HOOK_SLOTS];
    h[hook::DUMP_EXT_FILE] = dump_ext_file as *const c_void;
    h[hook::RESTORE_EXT_FILE] = restore_ext_file as *const c_void;
    h[hook::HANDLE_DEVICE_VMA] = handle_device_vma as *const c_void;
    h[hook::UPDATE_VMA_MAP] = update_vma_map as *const c_void;
    h[hook::RESUME_DEVICES_LATE] = resume_devices_late as *const c_void;
    h[hook::PAUSE_DEVICES] = pause_devices as *const c_void;
    h[hook::CHECKPOINT_DEVICES] = checkpoint_devices as *const c_void;
    h[hook::UPDATE_INETSK] = update_inetsk as *const c_void;
    h
}

/// The symbol CRIU's loader looks for.
#[no_mangle]
pub static CR_PLUGIN_DESC: PluginDesc = PluginDesc {
    name: c"criu_gpu".as_ptr(),
    init: Some(init),
    exit: Some(exit),
    version: PLUGIN_VERSION,
    max_hooks: AtomicU32::new(BASE_HOOKS as u32),
    hooks: hooks(),
};

/// Run by the dynamic loader when CRIU opens the plugin (the library's ELF constructor), before
/// CRIU reads [`CR_PLUGIN_DESC`]: CRIU refuses a plugin with more hooks than it has, so the
/// newer ones are offered only to a CRIU that says it reads them (`criu_plugin_max_hooks`,
/// patch 0012); any other CRIU sees the first [`BASE_HOOKS`].
extern "C" fn offer_newer_hooks() {
    let n = match criu::plugin_max_hooks() {
        Some(n) if n as usize >= HOOK_SLOTS => HOOK_SLOTS,
        _ => BASE_HOOKS,
    };
    CR_PLUGIN_DESC.max_hooks.store(n as u32, Ordering::Relaxed);
}

#[used]
#[link_section = ".init_array"]
static OFFER_NEWER_HOOKS: extern "C" fn() = offer_newer_hooks;

/// Whether CRIU calls UPDATE_INETSK of this plugin.
fn offers_update_inetsk() -> bool {
    CR_PLUGIN_DESC.max_hooks.load(Ordering::Relaxed) as usize > hook::UPDATE_INETSK
}

static PLUGIN: Mutex<Option<Plugin>> = Mutex::new(None);

/// CRIU as the backends see it.
struct CriuHost {
    required: Mutex<Vec<String>>,
}

impl Host for CriuHost {
    fn final_state(&self) -> Option<FinalState> {
        criu::final_state()
    }
    fn require_on_restore(&self, name: &str) -> bool {
        let mut done = self.required.lock().unwrap_or_else(|e| e.into_inner());
        if !done.iter().any(|n| n == name) && criu::add_inventory_plugin(name) {
            done.push(name.to_owned());
        }
        done.iter().any(|n| n == name)
    }
    fn use_interrupt_only_seizing(&self) -> bool {
        criu::use_interrupt_only_seizing()
    }
    fn image_dir(&self) -> Option<PathBuf> {
        criu::image_dir_fd().map(|fd| PathBuf::from(format!("/proc/self/fd/{fd}")))
    }
    fn work_dir(&self) -> Option<PathBuf> {
        // CRIU changes into its work directory before it loads plugins.
        std::env::current_dir().ok()
    }
    fn dump_root(&self) -> Option<i32> {
        criu::dump_root_pid()
    }
    fn seize_time_left(&self) -> Option<Duration> {
        criu::seize_time_left()
    }
    fn threads(&self) -> &dyn ThreadControl {
        &ptrace::Ptrace
    }
    fn lazy(&self) -> crate::core::Lazy {
        criu::lazy()
    }
    fn defer_pages(&self, pid: i32, range: std::ops::Range<u64>) -> Option<bool> {
        criu::defer_pages(pid, range)
    }
    fn ring_support(&self) -> process_facts::refusal::RingSupport {
        if criu::dumps_io_uring() {
            process_facts::refusal::RingSupport::Idle
        } else {
            process_facts::refusal::RingSupport::None
        }
    }
}

/// Forks the guardian from CRIU's process (see [`crate::guardian`]). It keeps its own handles on
/// the image directory, and on where its log goes: the images on dump, CRIU's work directory on
/// restore (a restore leaves the images as they were).
fn fork_guardian(watch: Watch, settings: &Arc<Settings>) -> Result<Guardian, GuardianError> {
    let open = |p: PathBuf| std::fs::File::open(p).ok().map(std::os::fd::OwnedFd::from);
    let images = criu::image_dir_fd().and_then(|fd| open(format!("/proc/self/fd/{fd}").into()));
    let log = match watch.restore() {
        true => std::env::current_dir().ok().and_then(open),
        false => criu::image_dir_fd().and_then(|fd| open(format!("/proc/self/fd/{fd}").into())),
    };
    let dump_root = (!watch.restore()).then(criu::dump_root_pid).flatten();
    let dirs = Dirs { images, log };
    Guardian::fork(watch, dirs, criu::run_id(), dump_root, settings.clone())
}

/// The inventory of the image CRIU restores, through CRIU's own functions.
struct CriuInventory;

impl Inventory for CriuInventory {
    fn claim(&self, name: &str) -> bool {
        criu::claim_inventory_plugin(name).unwrap_or(false)
    }
    fn has_list(&self) -> bool {
        criu::inventory_has_plugin_list().unwrap_or(false)
    }
}

/// Runs `body` as the entry point `what` that CRIU called: nothing in it unwinds into C (an
/// `extern "C"` function that unwinds aborts CRIU). A panic is written into CRIU's log and
/// answered with `failed`, CRIU's failure value for that entry point.
fn entry<T>(what: &str, failed: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(panic) => {
            let _ = catch_unwind(AssertUnwindSafe(|| report_panic(what, &*panic)));
            // A payload whose drop panics too stays here.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(panic)));
            failed
        }
    }
}

/// Writes a panic of entry point `what` into CRIU's log, straight through CRIU's writer: the
/// panic may have come from setting up `tracing` itself.
fn report_panic(what: &str, panic: &(dyn std::any::Any + Send)) {
    let why = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message");
    let line =
        format!("Error: {NAME}: {what}: internal error (panic: {why}); treated as a failure");
    // Lines other threads queued come first.
    let _ = catch_unwind(crate::log::flush);
    if !criu::log(crate::log::CriuLevel::Error, &line) {
        let _ = writeln!(std::io::stderr(), "{line}");
    }
    #[cfg(test)]
    tests::REPORTED.with(|r| r.borrow_mut().push(line));
}

/// A panic injected into a step of an entry point by a test (never outside tests).
fn fault(_step: &str) {
    #[cfg(test)]
    if tests::FAULT.with(|f| f.get()) == Some(_step) {
        panic!("injected fault: {_step}");
    }
}

/// Runs hook `hook` on the plugin, turning panics and errors into CRIU's conventions.
fn with_plugin(hook: &str, f: impl FnOnce(&mut Plugin) -> HookResult<c_int>) -> c_int {
    entry(hook, -1, || {
        let start = Instant::now();
        let code = answer(hook, on_plugin(f));
        crate::log::flush();
        stats::hook(start.elapsed(), code == -ENOTSUP);
        code
    })
}

/// Runs `f` on the plugin; "not mine" before `init` made one.
fn on_plugin(f: impl FnOnce(&mut Plugin) -> HookResult<c_int>) -> HookResult<c_int> {
    let mut guard = PLUGIN.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_mut() {
        Some(p) => f(p),
        None => Ok(Verdict::NotMine),
    }
}

/// A hook's result as CRIU's return value; an error is written into CRIU's log.
fn answer(hook: &str, result: HookResult<c_int>) -> c_int {
    match result {
        Ok(Verdict::Done(v)) => v,
        Ok(Verdict::NotMine) => -ENOTSUP,
        Err(e) => {
            tracing::error!("{hook}: {e}");
            -1
        }
    }
}

extern "C" fn init(stage: c_int) -> c_int {
    entry("init", -1, || {
        let start = Instant::now();
        let code = match start_plugin(stage) {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!("{e}");
                -1
            }
        };
        crate::log::flush();
        stats::hook(start.elapsed(), false);
        code
    })
}

/// `init`: CRIU's log, the settings (read here, once, and passed down: nothing below reads the
/// environment, and nothing is put into criu's), and the plugin for CRIU's command.
fn start_plugin(stage: c_int) -> Result<(), crate::core::HookError> {
    fault("log");
    crate::log::init(NAME, criu::log);
    let Some(stage) = Stage::from_raw(stage) else {
        return Ok(());
    };
    let settings = Arc::new(Settings::load());
    let host = CriuHost {
        required: Mutex::new(Vec::new()),
    };
    let for_guardians = settings.clone();
    let spawn: SpawnGuardian = Arc::new(move |watch| fork_guardian(watch, &for_guardians));
    let backends = crate::backends::all(settings.clone(), spawn);
    let mut plugin = Plugin::new(stage, Box::new(host), backends);
    plugin.load_address_map(&settings, offers_update_inetsk())?;
    plugin.init(&CriuInventory)?;
    *PLUGIN.lock().unwrap_or_else(|e| e.into_inner()) = Some(plugin);
    tracing::debug!(?stage, "initialised");
    Ok(())
}

extern "C" fn exit(_stage: c_int, ret: c_int) {
    entry("exit", (), || {
        let start = Instant::now();
        // Taken out of the lock first: a backend's exit that panics leaves no plugin behind.
        let plugin = PLUGIN.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut p) = plugin {
            p.exit(ret == 0);
        }
        stats::hook(start.elapsed(), false);
        tracing::info!("{}", stats::summary());
        crate::log::flush();
    })
}

// Each hook runs entirely inside `with_plugin` (under `entry`): its arguments are checked
// there too. A bad pid or fd is "not mine".

extern "C" fn pause_devices(pid: c_int) -> c_int {
    with_plugin("PAUSE_DEVICES", |p| {
        if pid <= 0 {
            return Ok(Verdict::NotMine);
        }
        p.dispatch(|v, h| v.pause_devices(h, pid)).map(done0)
    })
}

extern "C" fn checkpoint_devices(pid: c_int) -> c_int {
    with_plugin("CHECKPOINT_DEVICES", |p| {
        if pid <= 0 {
            return Ok(Verdict::NotMine);
        }
        p.dispatch(|v, h| v.checkpoint_devices(h, pid)).map(done0)
    })
}

extern "C" fn resume_devices_late(pid: c_int) -> c_int {
    with_plugin("RESUME_DEVICES_LATE", |p| {
        if pid <= 0 {
            return Ok(Verdict::NotMine);
        }
        p.dispatch(|v, h| v.resume_devices_late(h, pid)).map(done0)
    })
}

extern "C" fn handle_device_vma(fd: c_int, _st: *const libc::stat) -> c_int {
    with_plugin("HANDLE_DEVICE_VMA", |p| {
        if fd < 0 {
            return Ok(Verdict::NotMine);
        }
        // SAFETY: CRIU passes an fd it holds open (on /proc/PID/map_files/...) for the whole
        // call.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        p.dispatch(|v, h| v.handle_device_vma(h, fd)).map(done0)
    })
}

extern "C" fn dump_ext_file(fd: c_int, id: c_int) -> c_int {
    with_plugin("DUMP_EXT_FILE", |p| {
        if fd < 0 {
            return Ok(Verdict::NotMine);
        }
        // SAFETY: CRIU passes its own copy of the task's fd, open for the whole call.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        p.dispatch(|v, h| v.dump_ext_file(h, fd, id as u32))
            .map(done0)
    })
}

extern "C" fn restore_ext_file(id: c_int) -> c_int {
    with_plugin("RESTORE_EXT_FILE", |p| {
        p.dispatch(|v, h| v.restore_ext_file(h, id as u32))
    })
}

extern "C" fn update_vma_map(
    path: *const c_char,
    addr: u64,
    old_pgoff: u64,
    new_pgoff: *mut u64,
    plugin_fd: *mut c_int,
) -> c_int {
    with_plugin("UPDATE_VMA_MAP", |p| {
        if path.is_null() || new_pgoff.is_null() || plugin_fd.is_null() {
            return Ok(Verdict::NotMine);
        }
        // SAFETY: CRIU passes the VMA's NUL-terminated path.
        let path = unsafe { CStr::from_ptr(path) }.to_string_lossy();
        match p.dispatch(|v, h| v.update_vma_map(h, &path, addr, old_pgoff))? {
            Verdict::Done((pgoff, fd)) => {
                // SAFETY: both out-parameters were checked non-null above and point into CRIU.
                unsafe {
                    *new_pgoff = pgoff;
                    *plugin_fd = fd;
                }
                Ok(Verdict::Done(1))
            }
            Verdict::NotMine => Ok(Verdict::NotMine),
        }
    })
}

extern "C" fn update_inetsk(family: u32, state: u32, src: *mut u32, dst: *mut u32) -> c_int {
    with_plugin("UPDATE_INETSK", |p| {
        let words = match family {
            addrmap::AF_INET => 1,
            addrmap::AF_INET6 => 4,
            _ => return Ok(Verdict::NotMine),
        };
        if src.is_null() || dst.is_null() {
            return Ok(Verdict::NotMine);
        }
        // SAFETY: CRIU passes the socket image's two address arrays, each of at least the
        // family's words (patch 0012 passes no shorter ones), alive and not otherwise used for
        // the whole call.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts_mut(src, words),
                std::slice::from_raw_parts_mut(dst, words),
            )
        };
        Ok(done0(p.update_inetsk(family, state, src, dst)))
    })
}

fn done0(v: Verdict) -> Verdict<c_int> {
    match v {
        Verdict::Done(()) => Verdict::Done(0),
        Verdict::NotMine => Verdict::NotMine,
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;
    use crate::core::NAME;

    thread_local! {
        /// The step of an entry point where [`fault`] panics.
        pub(super) static FAULT: Cell<Option<&'static str>> = const { Cell::new(None) };
        /// What [`report_panic`] wrote.
        pub(super) static REPORTED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    fn reported() -> Vec<String> {
        REPORTED.with(|r| r.borrow_mut().drain(..).collect())
    }

    #[test]
    fn descriptor_has_criu_layout() {
        // cr_plugin_desc_t on LP64: name, init, exit (8 bytes each), version, max_hooks (4 each),
        // then the hook array.
        assert_eq!(std::mem::offset_of!(PluginDesc, version), 24);
        assert_eq!(std::mem::offset_of!(PluginDesc, max_hooks), 28);
        assert_eq!(std::mem::offset_of!(PluginDesc, hooks), 32);
        assert_eq!(std::mem::size_of::<PluginDesc>(), 32 + 8 * HOOK_SLOTS);
        assert_eq!(
            std::mem::size_of::<AtomicU32>(),
            std::mem::size_of::<c_uint>()
        );
        // SAFETY: the name is a static C string.
        let name = unsafe { CStr::from_ptr(CR_PLUGIN_DESC.name) };
        assert_eq!(name.to_str().unwrap(), NAME);
        assert!(!CR_PLUGIN_DESC.hooks[hook::PAUSE_DEVICES].is_null());
        assert!(!CR_PLUGIN_DESC.hooks[hook::UPDATE_INETSK].is_null());
    }

    /// Outside a CRIU that says it reads 16 hooks (here: no CRIU at all), the constructor left
    /// the descriptor at the hooks every CRIU from 4.0 on accepts, without UPDATE_INETSK: stock
    /// CRIU 4.0 to 4.2.1 load it as before.
    #[test]
    fn the_constructor_offers_the_newer_hooks_only_where_criu_reads_them() {
        assert_eq!(criu::plugin_max_hooks(), None);
        assert_eq!(
            CR_PLUGIN_DESC.max_hooks.load(Ordering::Relaxed) as usize,
            BASE_HOOKS
        );
        assert!(!offers_update_inetsk());
    }

    #[test]
    fn update_inetsk_moves_nothing_without_a_map_and_checks_its_arguments() {
        let (mut s, mut d) = ([1u32], [2u32]);
        assert_eq!(
            update_inetsk(2, 1, s.as_mut_ptr(), d.as_mut_ptr()),
            -ENOTSUP
        );
        assert_eq!(
            update_inetsk(17, 1, s.as_mut_ptr(), d.as_mut_ptr()),
            -ENOTSUP
        );
        let null = std::ptr::null_mut();
        assert_eq!(update_inetsk(2, 1, null, d.as_mut_ptr()), -ENOTSUP);
        assert_eq!((s, d), ([1], [2]));
    }

    #[test]
    fn hooks_answer_not_mine_before_init_and_for_bad_pids() {
        assert_eq!(pause_devices(0), -ENOTSUP);
        assert_eq!(checkpoint_devices(-1), -ENOTSUP);
        assert_eq!(resume_devices_late(12345), -ENOTSUP);
        assert_eq!(handle_device_vma(-1, std::ptr::null()), -ENOTSUP);
        let (mut pgoff, mut fd) = (0u64, 0);
        let null = std::ptr::null();
        assert_eq!(update_vma_map(null, 0, 0, &mut pgoff, &mut fd), -ENOTSUP);
    }

    /// A panic in init, before CRIU's log is even set up, is caught: CRIU gets init's failure
    /// value and the panic is in its log. (Were it not caught, it would unwind out of an
    /// `extern "C"` function and abort this test process, as it would abort CRIU.)
    #[test]
    fn a_panic_in_init_fails_init_and_is_logged() {
        FAULT.with(|f| f.set(Some("log")));
        let code = init(0);
        FAULT.with(|f| f.set(None));
        assert_eq!(code, -1);
        assert_eq!(
            reported(),
            [
                "Error: criu_gpu: init: internal error (panic: injected fault: log); treated as a \
              failure"
            ]
        );
    }

    #[test]
    fn a_panic_in_any_entry_point_becomes_its_failure_value() {
        assert_eq!(entry("PAUSE_DEVICES", -1, || panic!("at {}", 1)), -1);
        entry("exit", (), || panic!("boom"));
        assert_eq!(entry("RESTORE_EXT_FILE", -1, || 7), 7);
        let lines = reported();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("PAUSE_DEVICES: internal error (panic: at 1)"));
        assert!(lines[1].contains("exit: internal error (panic: boom)"));
    }
}
