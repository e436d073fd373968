//! The CUDA driver functions the test application calls, loaded from `libcuda.so.1` the way a
//! CUDA application gets them (here: whatever library the loader finds, normally the
//! simulation's directory on LD_LIBRARY_PATH). The only `unsafe` of the application.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use anyhow::{anyhow, Context, Result};
use libloading::Library;

type Res = c_uint;

pub struct Cuda {
    init: unsafe extern "C" fn(c_uint) -> Res,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> Res,
    primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> Res,
    ctx_set_current: unsafe extern "C" fn(*mut c_void) -> Res,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> Res,
    htod: unsafe extern "C" fn(u64, *const c_void, usize) -> Res,
    dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> Res,
    memset_d32_async: unsafe extern "C" fn(u64, c_uint, usize, *mut c_void) -> Res,
    synchronize: unsafe extern "C" fn() -> Res,
    error_name: unsafe extern "C" fn(Res, *mut *const c_char) -> Res,
    busy_kernel: Option<unsafe extern "C" fn(c_uint, *mut c_void) -> Res>,
    collective: Option<unsafe extern "C" fn(u64, u64, c_uint, c_uint, *mut c_void) -> Res>,
    _lib: Library,
}

fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T> {
    let c = format!("{name}\0");
    // SAFETY: the names below are CUDA driver functions whose prototypes match the field types
    // (from cuda.h); the library outlives the copied pointers (it is kept in `Cuda`).
    unsafe { lib.get::<T>(c.as_bytes()).map(|s| *s) }.with_context(|| format!("missing {name}"))
}

impl Cuda {
    pub fn load(path: &str) -> Result<Cuda> {
        // SAFETY: loading the driver runs its initialisers, which are safe in any process.
        let lib = unsafe { Library::new(path) }.with_context(|| format!("loading {path}"))?;
        Ok(Cuda {
            init: sym(&lib, "cuInit")?,
            device_get_count: sym(&lib, "cuDeviceGetCount")?,
            primary_ctx_retain: sym(&lib, "cuDevicePrimaryCtxRetain")?,
            ctx_set_current: sym(&lib, "cuCtxSetCurrent")?,
            mem_alloc: sym(&lib, "cuMemAlloc_v2")?,
            htod: sym(&lib, "cuMemcpyHtoD_v2")?,
            dtoh: sym(&lib, "cuMemcpyDtoH_v2")?,
            memset_d32_async: sym(&lib, "cuMemsetD32Async")?,
            synchronize: sym(&lib, "cuCtxSynchronize")?,
            error_name: sym(&lib, "cuGetErrorName")?,
            busy_kernel: sym(&lib, "cuSimLaunchBusyKernel").ok(),
            collective: sym(&lib, "cuSimLaunchCollective").ok(),
            _lib: lib,
        })
    }

    fn check(&self, call: &str, r: Res) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName stores a pointer to a static string or fails.
        let name = if unsafe { (self.error_name)(r, &mut p) } == 0 && !p.is_null() {
            // SAFETY: static NUL-terminated string from the driver.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            format!("CUDA error {r}")
        };
        Err(anyhow!("{call} failed: {name} ({r})"))
    }

    pub fn init(&self) -> Result<()> {
        // SAFETY: plain call.
        self.check("cuInit", unsafe { (self.init)(0) })
    }

    pub fn device_count(&self) -> Result<i32> {
        let mut n = 0;
        // SAFETY: out-parameter.
        self.check("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut n)
        })?;
        Ok(n)
    }

    pub fn use_device(&self, ordinal: i32) -> Result<()> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: out-parameter, then the handle the driver gave us.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.primary_ctx_retain)(&mut ctx, ordinal)
        })?;
        // SAFETY: a context handle from the driver.
        self.check("cuCtxSetCurrent", unsafe { (self.ctx_set_current)(ctx) })
    }

    pub fn alloc(&self, bytes: usize) -> Result<u64> {
        let mut d = 0;
        // SAFETY: out-parameter.
        self.check("cuMemAlloc", unsafe { (self.mem_alloc)(&mut d, bytes) })?;
        Ok(d)
    }

    pub fn htod(&self, dst: u64, src: &[u32]) -> Result<()> {
        // SAFETY: `src` is readable for its whole byte length during the call.
        self.check("cuMemcpyHtoD", unsafe {
            (self.htod)(dst, src.as_ptr().cast(), std::mem::size_of_val(src))
        })
    }

    pub fn dtoh(&self, dst: &mut [u32], src: u64) -> Result<()> {
        // SAFETY: `dst` is writable for its whole byte length during the call.
        self.check("cuMemcpyDtoH", unsafe {
            (self.dtoh)(dst.as_mut_ptr().cast(), src, std::mem::size_of_val(dst))
        })
    }

    pub fn memset_async(&self, dst: u64, value: u32, words: usize) -> Result<()> {
        // SAFETY: device pointer and count checked by the driver; default stream.
        self.check("cuMemsetD32Async", unsafe {
            (self.memset_d32_async)(dst, value, words, std::ptr::null_mut())
        })
    }

    pub fn busy(&self, ms: u32) -> Result<()> {
        match self.busy_kernel {
            // SAFETY: plain call on the default stream.
            Some(f) => self.check("cuSimLaunchBusyKernel", unsafe {
                f(ms, std::ptr::null_mut())
            }),
            None => Err(anyhow!(
                "this driver has no busy kernel (not the simulation)"
            )),
        }
    }

    /// Step `seq` of a collective among `ranks` processes of `group`, after `ms` of compute.
    pub fn collective(&self, group: u64, seq: u64, ranks: u32, ms: u32) -> Result<()> {
        match self.collective {
            // SAFETY: plain call on the default stream.
            Some(f) => self.check("cuSimLaunchCollective", unsafe {
                f(group, seq, ranks, ms, std::ptr::null_mut())
            }),
            None => Err(anyhow!(
                "this driver has no collectives (not the simulation)"
            )),
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: plain call.
        self.check("cuCtxSynchronize", unsafe { (self.synchronize)() })
    }
}
