//! The driver's checkpoint entry points, resolved from `libcuda.so.1` at run time.
//!
//! This is the only module of the crate with `unsafe`. The argument structs are `cuda.h`'s
//! (CUDA 13.0 layout, declared in [`super::cuda_h`]); the six `cuCheckpointProcess*` functions
//! are looked up here with libloading.
//! Results and states cross the boundary as plain integers: a driver newer than these bindings
//! may return codes no Rust enum knows, and an unknown enum discriminant would be undefined
//! behaviour.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;

use libloading::Library;

use super::cuda_h::{
    CUcheckpointCheckpointArgs, CUcheckpointGpuPair, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUuuid,
};

/// `CUresult` as the driver returns it.
pub type RawResult = c_uint;

type GetRestoreThreadIdFn = unsafe extern "C" fn(c_int, *mut c_int) -> RawResult;
type GetStateFn = unsafe extern "C" fn(c_int, *mut c_uint) -> RawResult;
type LockFn = unsafe extern "C" fn(c_int, *mut CUcheckpointLockArgs) -> RawResult;
type CheckpointFn = unsafe extern "C" fn(c_int, *mut CUcheckpointCheckpointArgs) -> RawResult;
type RestoreFn = unsafe extern "C" fn(c_int, *mut CUcheckpointRestoreArgs) -> RawResult;
type UnlockFn = unsafe extern "C" fn(c_int, *mut CUcheckpointUnlockArgs) -> RawResult;
type DriverGetVersionFn = unsafe extern "C" fn(*mut c_int) -> RawResult;
type GetErrorTextFn = unsafe extern "C" fn(RawResult, *mut *const c_char) -> RawResult;
type SimIdentifyFn = unsafe extern "C" fn() -> *const c_char;

/// The symbols every checkpoint-capable driver (r570 and later) exports.
pub const CHECKPOINT_SYMBOLS: [&str; 6] = [
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];

/// Why the library could not be used.
#[derive(Debug)]
pub enum LoadError {
    /// `dlopen` failed.
    Open(String),
    /// The library loaded but lacks a checkpoint entry point.
    MissingSymbol {
        symbol: &'static str,
        version: Option<i32>,
    },
}

pub struct RawDriver {
    get_restore_tid: GetRestoreThreadIdFn,
    get_state: GetStateFn,
    lock: LockFn,
    checkpoint: CheckpointFn,
    restore: RestoreFn,
    unlock: UnlockFn,
    driver_get_version: Option<DriverGetVersionFn>,
    get_error_name: Option<GetErrorTextFn>,
    get_error_string: Option<GetErrorTextFn>,
    sim_identify: Option<SimIdentifyFn>,
    /// Keeps the function pointers above valid; never unloaded before them.
    _lib: Library,
}

/// Looks a symbol up; `None` if absent.
fn symbol<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    // SAFETY: every caller names a symbol whose C prototype matches `T` (the aliases above,
    // written from cuda.h); the library outlives the copied pointer because `RawDriver` owns it.
    unsafe { lib.get::<T>(&cname).ok().map(|s| *s) }
}

impl RawDriver {
    /// Opens `library` (a file path, or a soname searched the usual way) and resolves the API.
    pub fn open(library: &str) -> Result<RawDriver, LoadError> {
        // SAFETY: loading a shared library runs its initialisers; libcuda's (and the simulated
        // driver's) are safe to run in any process, and no CUDA call is made by loading it.
        let lib = unsafe { Library::new(library) }.map_err(|e| LoadError::Open(e.to_string()))?;
        let driver_get_version: Option<DriverGetVersionFn> = symbol(&lib, "cuDriverGetVersion");
        let version = driver_get_version.and_then(|f| {
            let mut v: c_int = 0;
            // SAFETY: cuDriverGetVersion writes one int and needs no cuInit.
            (unsafe { f(&mut v) } == 0).then_some(v)
        });
        macro_rules! required {
            ($idx:expr) => {
                symbol(&lib, CHECKPOINT_SYMBOLS[$idx]).ok_or(LoadError::MissingSymbol {
                    symbol: CHECKPOINT_SYMBOLS[$idx],
                    version,
                })?
            };
        }
        Ok(RawDriver {
            get_restore_tid: required!(0),
            get_state: required!(1),
            lock: required!(2),
            checkpoint: required!(3),
            restore: required!(4),
            unlock: required!(5),
            driver_get_version,
            get_error_name: symbol(&lib, "cuGetErrorName"),
            get_error_string: symbol(&lib, "cuGetErrorString"),
            sim_identify: symbol(&lib, "cuSimIdentify"),
            _lib: lib,
        })
    }

    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0 (driver r580).
    pub fn version(&self) -> Option<i32> {
        let f = self.driver_get_version?;
        let mut v: c_int = 0;
        // SAFETY: writes one int into `v`.
        (unsafe { f(&mut v) } == 0).then_some(v)
    }

    /// The file the library was loaded from, as the dynamic loader resolved it.
    pub fn path(&self) -> Option<PathBuf> {
        let mut info: libc::Dl_info = empty_dl_info();
        let addr = self.get_state as *const c_void;
        // SAFETY: `addr` points into the loaded library; dladdr only fills `info`.
        if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dli_fname is a NUL-terminated string owned by the loader, valid while loaded.
        let name = unsafe { CStr::from_ptr(info.dli_fname) };
        Some(PathBuf::from(name.to_string_lossy().into_owned()))
    }

    /// The simulated driver's self-description; `None` for NVIDIA's driver.
    pub fn simulation(&self) -> Option<String> {
        let f = self.sim_identify?;
        // SAFETY: cuSimIdentify returns a static NUL-terminated string.
        let p = unsafe { f() };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null, static, NUL-terminated (see above).
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    pub fn error_name(&self, code: RawResult) -> Option<String> {
        self.error_text(self.get_error_name, code)
    }

    pub fn error_string(&self, code: RawResult) -> Option<String> {
        self.error_text(self.get_error_string, code)
    }

    fn error_text(&self, f: Option<GetErrorTextFn>, code: RawResult) -> Option<String> {
        let f = f?;
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName/String store a pointer to a static string (or fail).
        if unsafe { f(code, &mut p) } != 0 || p.is_null() {
            return None;
        }
        // SAFETY: the driver returned a static NUL-terminated string.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    pub fn get_restore_thread_id(&self, pid: i32) -> Result<i32, RawResult> {
        let mut tid: c_int = 0;
        // SAFETY: the driver writes one int; pid is a plain value.
        check(unsafe { (self.get_restore_tid)(pid, &mut tid) }).map(|()| tid)
    }

    pub fn get_state(&self, pid: i32) -> Result<u32, RawResult> {
        let mut state: c_uint = 0;
        // SAFETY: the driver writes one CUprocessState (an unsigned int).
        check(unsafe { (self.get_state)(pid, &mut state) }).map(|()| state)
    }

    pub fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), RawResult> {
        let mut args = CUcheckpointLockArgs {
            timeout_ms,
            reserved0: 0,
            reserved1: [0; 7],
        };
        // SAFETY: args is a fully initialised CUcheckpointLockArgs that lives across the call.
        check(unsafe { (self.lock)(pid, &mut args) })
    }

    pub fn checkpoint(&self, pid: i32) -> Result<(), RawResult> {
        let mut args = CUcheckpointCheckpointArgs { reserved: [0; 8] };
        // SAFETY: zeroed reserved args, valid for the call.
        check(unsafe { (self.checkpoint)(pid, &mut args) })
    }

    /// Restores, remapping GPUs by `(old, new)` UUID pairs when `pairs` is not empty.
    pub fn restore(&self, pid: i32, pairs: &[([u8; 16], [u8; 16])]) -> Result<(), RawResult> {
        let mut raw: Vec<CUcheckpointGpuPair> = pairs
            .iter()
            .map(|(old, new)| CUcheckpointGpuPair {
                old_uuid: uuid(old),
                new_uuid: uuid(new),
            })
            .collect();
        let mut args = CUcheckpointRestoreArgs {
            gpu_pairs: if raw.is_empty() {
                std::ptr::null_mut()
            } else {
                raw.as_mut_ptr()
            },
            gpu_pairs_count: raw.len() as c_uint,
            reserved: [0; 44],
            reserved1: 0,
        };
        // SAFETY: args and the pair array it points to outlive the call; the driver only reads them.
        check(unsafe { (self.restore)(pid, &mut args) })
    }

    pub fn unlock(&self, pid: i32) -> Result<(), RawResult> {
        let mut args = CUcheckpointUnlockArgs { reserved: [0; 8] };
        // SAFETY: zeroed reserved args, valid for the call.
        check(unsafe { (self.unlock)(pid, &mut args) })
    }
}

fn empty_dl_info() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    }
}

fn uuid(bytes: &[u8; 16]) -> CUuuid {
    CUuuid {
        bytes: bytes.map(|b| b as c_char),
    }
}

fn check(code: RawResult) -> Result<(), RawResult> {
    if code == 0 {
        Ok(())
    } else {
        Err(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_reported() {
        match RawDriver::open("/nonexistent/libcuda.so.1") {
            Err(LoadError::Open(msg)) => assert!(msg.contains("nonexistent"), "{msg}"),
            other => panic!("unexpected: {:?}", other.err()),
        }
    }
}
