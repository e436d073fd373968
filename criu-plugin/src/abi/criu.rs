//! CRIU's side of the ABI: the few functions and the option this plugin uses from the `criu`
//! executable, found at run time with `dlsym(RTLD_DEFAULT)`.
//!
//! Only `criu_get_image_dir` is public API; the rest are CRIU internals that the `criu` binary
//! exports (it links with -rdynamic). Resolving them at run time instead of at link time keeps
//! the plugin loadable by CRIU versions that lack one of them (a missing import would make
//! `dlopen`, and with it every CRIU command, fail) and outside CRIU (tests, tools).

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::OnceLock;

pub(super) type PrintOnLevel = unsafe extern "C" fn(c_uint, *const c_char, ...);
pub(super) type AddInventoryPlugin = unsafe extern "C" fn(*const c_char) -> c_int;
pub(super) type CheckAndRemoveInventoryPlugin = unsafe extern "C" fn(*const c_char, usize) -> bool;
pub(super) type VoidFn = unsafe extern "C" fn();
pub(super) type GetImageDir = unsafe extern "C" fn() -> c_int;
pub(super) type DeferPages =
    unsafe extern "C" fn(c_int, std::ffi::c_ulong, std::ffi::c_ulong) -> c_int;
pub(super) type DumpsIoUring = unsafe extern "C" fn() -> c_int;
pub(super) type MaxHooks = unsafe extern "C" fn() -> c_uint;
pub(super) type IntOfNothing = unsafe extern "C" fn() -> c_int;

// What the plugin reads of CRIU's data, at fixed places (LP64). Each is checked against the
// pinned CRIU's headers by the test in layout.rs.

/// `opts.final_state` values (compel's task states, criu/include/pid.h).
pub(super) const TASK_ALIVE: i32 = 1;
pub(super) const TASK_DEAD: i32 = 2;
pub(super) const TASK_STOPPED: i32 = 3;
/// `offsetof(struct cr_options, final_state)`: its first field in every release with plugins.
pub(super) const OPTS_FINAL_STATE: usize = 0;
/// `offsetof(struct pstree_item, pid)`: after `parent` (8), `children` and `sibling` (16 each).
pub(super) const PSTREE_ITEM_PID: usize = 40;
/// `offsetof(struct pid, real)`: after `item` (8).
pub(super) const PID_REAL: usize = 8;
/// RUN_ID_HASH_LENGTH (criu/include/util.h): the size of `criu_run_id`, a UUID's 36
/// characters and a NUL.
pub(super) const RUN_ID_HASH_LENGTH: usize = 37;

struct Symbols {
    print_on_level: Option<PrintOnLevel>,
    add_inventory_plugin: Option<AddInventoryPlugin>,
    check_and_remove_inventory_plugin: Option<CheckAndRemoveInventoryPlugin>,
    set_compel_interrupt_only_mode: Option<VoidFn>,
    dont_use_freeze_cgroup: Option<VoidFn>,
    criu_get_image_dir: Option<GetImageDir>,
    /// The project's CRIU only (patch 0007).
    criu_defer_pages: Option<DeferPages>,
    /// The project's CRIU only (patch 0008).
    criu_dumps_io_uring: Option<DumpsIoUring>,
    /// The project's CRIU only (patch 0012).
    criu_plugin_max_hooks: Option<MaxHooks>,
    /// The project's CRIU only (patch 0014).
    criu_lazy_pages_complete: Option<IntOfNothing>,
    /// `struct cr_options opts`; `final_state` is its first field in every CRIU release.
    opts: Option<usize>,
    /// `struct pstree_item *root_item`, set before plugins are initialised on dump.
    root_item: Option<usize>,
    /// `char criu_run_id[RUN_ID_HASH_LENGTH]` (criu/util.c): names this run's network lock.
    criu_run_id: Option<usize>,
}

fn lookup(name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_DEFAULT only searches the loaded objects; the name is valid.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn symbols() -> &'static Symbols {
    static S: OnceLock<Symbols> = OnceLock::new();
    S.get_or_init(|| {
        // SAFETY: (all transmutes below) each symbol, when present, is the CRIU function of
        // that name, whose C prototype (criu/include/log.h, image.h, seize.h, criu-plugin.h)
        // is the function type it is converted to.
        unsafe {
            Symbols {
                print_on_level: lookup("print_on_level")
                    .map(|p| std::mem::transmute::<*mut c_void, PrintOnLevel>(p)),
                add_inventory_plugin: lookup("add_inventory_plugin")
                    .map(|p| std::mem::transmute::<*mut c_void, AddInventoryPlugin>(p)),
                check_and_remove_inventory_plugin: lookup("check_and_remove_inventory_plugin")
                    .map(|p| std::mem::transmute::<*mut c_void, CheckAndRemoveInventoryPlugin>(p)),
                set_compel_interrupt_only_mode: lookup("set_compel_interrupt_only_mode")
                    .map(|p| std::mem::transmute::<*mut c_void, VoidFn>(p)),
                dont_use_freeze_cgroup: lookup("dont_use_freeze_cgroup")
                    .map(|p| std::mem::transmute::<*mut c_void, VoidFn>(p)),
                criu_get_image_dir: lookup("criu_get_image_dir")
                    .map(|p| std::mem::transmute::<*mut c_void, GetImageDir>(p)),
                criu_defer_pages: lookup("criu_defer_pages")
                    .map(|p| std::mem::transmute::<*mut c_void, DeferPages>(p)),
                criu_dumps_io_uring: lookup("criu_dumps_io_uring")
                    .map(|p| std::mem::transmute::<*mut c_void, DumpsIoUring>(p)),
                criu_plugin_max_hooks: lookup("criu_plugin_max_hooks")
                    .map(|p| std::mem::transmute::<*mut c_void, MaxHooks>(p)),
                criu_lazy_pages_complete: lookup("criu_lazy_pages_complete")
                    .map(|p| std::mem::transmute::<*mut c_void, IntOfNothing>(p)),
                opts: lookup("opts").map(|p| p as usize),
                root_item: lookup("root_item").map(|p| p as usize),
                criu_run_id: lookup("criu_run_id").map(|p| p as usize),
            }
        }
    })
}

/// Whether the plugin runs inside CRIU (as opposed to a test or a tool).
pub fn inside_criu() -> bool {
    symbols().print_on_level.is_some()
}

/// Writes one line to CRIU's log; `false` if there is no CRIU to write to.
pub fn log(level: crate::log::CriuLevel, line: &str) -> bool {
    let Some(f) = symbols().print_on_level else {
        return false;
    };
    let Ok(text) = CString::new(format!("{line}\n").replace('\0', " ")) else {
        return false;
    };
    // SAFETY: a constant "%s" format with one NUL-terminated string argument.
    unsafe { f(level as c_uint, c"%s".as_ptr(), text.as_ptr()) };
    true
}

/// Records in the image's inventory that restoring it needs this plugin (CRIU >= 4.1).
pub fn add_inventory_plugin(name: &str) -> bool {
    let (Some(f), Ok(c)) = (symbols().add_inventory_plugin, CString::new(name)) else {
        return false;
    };
    // SAFETY: a NUL-terminated name; CRIU copies it.
    unsafe { f(c.as_ptr()) == 0 }
}

/// Claims `name` from the inventory of the image being restored. `None` when this CRIU has no
/// inventory plugin list (< 4.1): then the image cannot say whether the plugin is needed.
pub fn claim_inventory_plugin(name: &str) -> Option<bool> {
    let f = symbols().check_and_remove_inventory_plugin?;
    let c = CString::new(name).ok()?;
    // SAFETY: NUL-terminated name and its length, as the function expects.
    Some(unsafe { f(c.as_ptr(), name.len()) })
}

/// Makes CRIU seize tasks with ptrace only, thawing a frozen cgroup first, so GPU drivers can
/// act on running tasks before they are stopped (CRIU >= 4.1; 4.0 calls it differently).
pub fn use_interrupt_only_seizing() -> bool {
    let s = symbols();
    match s
        .set_compel_interrupt_only_mode
        .or(s.dont_use_freeze_cgroup)
    {
        Some(f) => {
            // SAFETY: a void function without arguments.
            unsafe { f() };
            true
        }
        None => false,
    }
}

/// Whether this CRIU dumps io_uring rings that are idle (the project's CRIU, patch 0008:
/// `criu_dumps_io_uring()` in criu-plugin.h).
pub fn dumps_io_uring() -> bool {
    match symbols().criu_dumps_io_uring {
        // SAFETY: the patch's function takes nothing and returns an int.
        Some(f) => (unsafe { f() }) == 1,
        None => false,
    }
}

/// How many hook slots this CRIU reads (its CR_PLUGIN_HOOK__MAX: the project's CRIU, patch
/// 0012, says so); `None` when it does not say (stock CRIU, which has fewer than 16).
pub fn plugin_max_hooks() -> Option<c_uint> {
    let f = symbols().criu_plugin_max_hooks?;
    // SAFETY: the patch's function takes nothing and returns an unsigned int.
    Some(unsafe { f() })
}

/// This CRIU run's id (a UUID), which names its nftables network lock.
pub fn run_id() -> Option<String> {
    let addr = symbols().criu_run_id?;
    // SAFETY: `criu_run_id` is CRIU's global char array of RUN_ID_HASH_LENGTH bytes, set by
    // util_init() before plugins are loaded; only that many bytes are read.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, RUN_ID_HASH_LENGTH) };
    let end = bytes.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&bytes[..end])
        .ok()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// CRIU's image directory fd (valid in CRIU's main process and in restored tasks).
pub fn image_dir_fd() -> Option<c_int> {
    let f = symbols().criu_get_image_dir?;
    // SAFETY: returns CRIU's service fd for the image directory.
    let fd = unsafe { f() };
    (fd >= 0).then_some(fd)
}

/// How CRIU leaves the tasks after a dump.
pub fn final_state() -> Option<crate::core::FinalState> {
    use crate::core::FinalState;
    let addr = symbols().opts?;
    // SAFETY: `opts` is CRIU's global struct cr_options, whose first field is `int final_state`
    // in every release that has plugins (checked in criu/include/cr_options.h, 3.x to 4.2).
    match unsafe { std::ptr::read_volatile((addr + OPTS_FINAL_STATE) as *const c_int) } {
        TASK_ALIVE => Some(FinalState::Alive),
        TASK_DEAD => Some(FinalState::Dead),
        TASK_STOPPED => Some(FinalState::Stopped),
        _ => None,
    }
}

/// Whether CRIU was asked for lazy pages (`--lazy-pages` on its command line: CRIU keeps the
/// option where its layout differs between releases, so its command line is what is read; a
/// request over RPC (swrk) is not seen), and what its lazy pages do to the tasks: the project's
/// CRIU (patch 0014, `criu_lazy_pages_complete()` in criu-plugin.h) ends a lazy dump's tasks
/// only once the receiver has every page, and with `--pages-before-resume` puts every page in
/// place before a restore's tasks resume.
pub fn lazy() -> crate::core::Lazy {
    use crate::core::Lazy;
    let asked = std::fs::read("/proc/self/cmdline").is_ok_and(|c| {
        c.split(|b| *b == 0)
            .any(|a| a == b"--lazy-pages" || a == b"--lazy_pages")
    });
    match (asked, symbols().criu_lazy_pages_complete) {
        (false, _) => Lazy::No,
        // SAFETY: the patch's function takes nothing and returns an int.
        (true, Some(f)) if unsafe { f() } == 1 => Lazy::Complete,
        (true, _) => Lazy::PostCopy,
    }
}

/// Lets the pages of task `pid` (its pid in the image) in `range` arrive while the restore goes
/// on (the project's CRIU, patch 0007: `criu_defer_pages` in criu-plugin.h). `None` when this
/// CRIU cannot, `Some(false)` when it refused.
pub fn defer_pages(pid: i32, range: std::ops::Range<u64>) -> Option<bool> {
    let f = symbols().criu_defer_pages?;
    // SAFETY: plain integer arguments; CRIU copies them.
    Some(unsafe { f(pid, range.start as _, range.end as _) } == 0)
}

/// Whether the restored image's inventory has a plugin list at all. CRIU's
/// `check_and_remove_inventory_plugin` answers true for every name when the image has none (it
/// was dumped by CRIU < 4.1), so a name no plugin uses tells the two cases apart. `None` when
/// this CRIU keeps no list.
pub fn inventory_has_plugin_list() -> Option<bool> {
    const NOBODY: &str = "criu_gpu_no_such_plugin_probe";
    claim_inventory_plugin(NOBODY).map(|claimed| !claimed)
}

/// The pid of the tree CRIU is about to dump (`root_item->pid->real`), known from before
/// plugins are initialised. The layout read here, `struct pstree_item { parent; children;
/// sibling; struct pid *pid; ... }` and `struct pid { item; pid_t real; ... }`, has not changed
/// since CRIU 2.x (criu/include/pstree.h, pid.h); the value is checked against /proc.
pub fn dump_root_pid() -> Option<i32> {
    let addr = symbols().root_item?;
    // SAFETY: `root_item` is CRIU's global `struct pstree_item *`; when non-null it points to an
    // item CRIU allocated, whose `struct pid *pid` is at PSTREE_ITEM_PID, whose `pid_t real` is
    // at PID_REAL. Reads only.
    let real = unsafe {
        let item = std::ptr::read_volatile(addr as *const *const u8);
        if item.is_null() {
            return None;
        }
        let pid = std::ptr::read_volatile(item.add(PSTREE_ITEM_PID) as *const *const u8);
        if pid.is_null() {
            return None;
        }
        std::ptr::read_volatile(pid.add(PID_REAL) as *const c_int)
    };
    (real > 0 && std::path::Path::new(&format!("/proc/{real}")).exists()).then_some(real)
}

/// What is left of the alarm CRIU arms around seizing the tree (`--timeout`, default 10 s):
/// PAUSE_DEVICES runs inside it, and CRIU aborts (BUG) soon after it fires. `None` when no
/// alarm is armed.
pub fn seize_time_left() -> Option<std::time::Duration> {
    let mut v = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
    };
    // SAFETY: getitimer fills the struct it is given; ITIMER_REAL is the timer alarm() arms.
    if unsafe { libc::getitimer(libc::ITIMER_REAL, &mut v) } != 0 {
        return None;
    }
    let left = std::time::Duration::new(v.it_value.tv_sec as u64, v.it_value.tv_usec as u32 * 1000);
    (!left.is_zero()).then_some(left)
}
