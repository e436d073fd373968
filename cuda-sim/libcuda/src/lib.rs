//! The simulated driver's C ABI: the CUDA driver API subset the project and its test
//! application use, the six checkpoint entry points, and the NVML subset of the inventory.
//! Installed as `libcuda.so.1` and `libnvidia-ml.so.1` in a directory of its own; the logic lives
//! in the `cuda-sim` crate. Every function here only converts between C and Rust.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use cuda_sim::control::Op;
use cuda_sim::errors::{self, code};
use cuda_sim::{controller, nvml, target, visible};

type CUresult = c_uint;

/// Converts a Rust result (or a panic) into a `CUresult`.
fn ret(f: impl FnOnce() -> Result<(), u32>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => code::UNKNOWN,
    }
}

/// Writes `v` through `p`, refusing NULL.
///
/// SAFETY (for callers): `p` is NULL or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), u32> {
    if p.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: non-null, and valid per the caller's contract (the C API's out-parameter).
    unsafe { p.write(v) };
    Ok(())
}

/// Copies `s` NUL-terminated into a C buffer of `len` bytes (truncating).
unsafe fn put_str(dst: *mut c_char, len: usize, s: &str) -> Result<(), u32> {
    if dst.is_null() || len == 0 {
        return Err(code::INVALID_VALUE);
    }
    let n = s.len().min(len - 1);
    // SAFETY: dst holds `len` bytes per the API contract; we write n + 1 <= len of them.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast(), dst, n);
        *dst.add(n) = 0;
    }
    Ok(())
}

fn ordinal(dev: c_int) -> Result<u32, u32> {
    u32::try_from(dev).map_err(|_| code::INVALID_DEVICE)
}

// ---- identification ----

#[no_mangle]
pub extern "C" fn cuSimIdentify() -> *const c_char {
    static ID: OnceLock<CString> = OnceLock::new();
    ID.get_or_init(|| CString::new(cuda_sim::identity()).unwrap_or_default())
        .as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: out-parameter per cuda.h.
    ret(|| unsafe { put(version, cuda_sim::CUDA_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, out: *mut *const c_char) -> CUresult {
    match errors::name(error) {
        // SAFETY: out-parameter per cuda.h; the string is static and NUL-terminated.
        Some(n) => ret(|| unsafe { put(out, n.as_ptr().cast()) }),
        None => code::INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, out: *mut *const c_char) -> CUresult {
    match errors::description(error) {
        // SAFETY: out-parameter per cuda.h; the string is static and NUL-terminated.
        Some(d) => ret(|| unsafe { put(out, d.as_ptr().cast()) }),
        None => code::INVALID_VALUE,
    }
}

// ---- initialisation and devices ----

#[no_mangle]
pub extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    ret(target::init)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    ret(|| {
        let n = target::runtime()?.devices().len() as c_int;
        // SAFETY: out-parameter per cuda.h.
        unsafe { put(count, n) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal_: c_int) -> CUresult {
    ret(|| {
        target::runtime()?.device(ordinal(ordinal_)?)?;
        // SAFETY: out-parameter per cuda.h.
        unsafe { put(device, ordinal_) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CUresult {
    ret(|| {
        let d = target::runtime()?.device(ordinal(dev)?)?;
        // SAFETY: `name` holds `len` bytes per cuda.h.
        unsafe { put_str(name, len.max(0) as usize, &d.name) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: c_int) -> CUresult {
    ret(|| {
        let d = target::runtime()?.device(ordinal(dev)?)?;
        // SAFETY: CUuuid is 16 bytes; out-parameter per cuda.h.
        unsafe { put(uuid, d.uuid) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: c_int) -> CUresult {
    // SAFETY: same contract as cuDeviceGetUuid.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    ret(|| {
        let d = target::runtime()?.device(ordinal(dev)?)?;
        // SAFETY: out-parameter per cuda.h.
        unsafe { put(bytes, d.total_memory as usize) }
    })
}

// ---- contexts (the primary context of each device) ----

fn ctx_handle(ordinal: u32) -> *mut c_void {
    (ordinal as usize + 1) as *mut c_void
}

fn ctx_ordinal(ctx: *mut c_void) -> Option<u32> {
    (!ctx.is_null()).then(|| ctx as usize as u32 - 1)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> CUresult {
    ret(|| {
        target::runtime()?.device(ordinal(dev)?)?;
        // SAFETY: out-parameter per cuda.h.
        unsafe { put(ctx, ctx_handle(ordinal(dev)?)) }
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CUresult {
    ret(|| target::runtime()?.device(ordinal(dev)?).map(|_| ()))
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CUresult {
    ret(|| target::runtime()?.set_current(ctx_ordinal(ctx)))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CUresult {
    ret(|| {
        let cur = target::runtime()?.current().ok();
        // SAFETY: out-parameter per cuda.h.
        unsafe { put(ctx, cur.map_or(std::ptr::null_mut(), ctx_handle)) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    ret(|| target::api(|rt| rt.synchronize()))
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(_stream: *mut c_void) -> CUresult {
    cuCtxSynchronize()
}

// ---- memory ----

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> CUresult {
    ret(|| {
        let p = target::api(|rt| rt.mem_alloc(size as u64))?;
        // SAFETY: out-parameter per cuda.h.
        unsafe { put(dptr, p) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    ret(|| target::api(|rt| rt.mem_free(dptr)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> CUresult {
    if src.is_null() && n > 0 {
        return code::INVALID_VALUE;
    }
    let src = if n == 0 {
        &[][..]
    } else {
        // SAFETY: the caller passes `n` readable bytes at `src` (cuda.h contract).
        unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) }
    };
    ret(|| target::api(|rt| rt.htod(dst, src)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> CUresult {
    if dst.is_null() && n > 0 {
        return code::INVALID_VALUE;
    }
    let dst = if n == 0 {
        &mut [][..]
    } else {
        // SAFETY: the caller passes `n` writable bytes at `dst` (cuda.h contract).
        unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), n) }
    };
    ret(|| target::api(|rt| rt.dtoh(dst, src)))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(dptr: u64, value: c_uint, n: usize) -> CUresult {
    ret(|| target::api(|rt| rt.memset32(dptr, value, n as u64, false)))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async(
    dptr: u64,
    value: c_uint,
    n: usize,
    _stream: *mut c_void,
) -> CUresult {
    ret(|| target::api(|rt| rt.memset32(dptr, value, n as u64, true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    ret(|| {
        let (f, t) = target::api(|rt| rt.mem_info())?;
        // SAFETY: out-parameters per cuda.h.
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    })
}

/// Simulation only: a kernel that keeps the GPU busy for `ms` milliseconds.
#[no_mangle]
pub extern "C" fn cuSimLaunchBusyKernel(ms: c_uint, _stream: *mut c_void) -> CUresult {
    ret(|| target::api(|rt| rt.busy_kernel(ms)))
}

// ---- the checkpoint API (controller side) ----

/// Simulation only: step `seq` of a collective among the `ranks` processes of `group`, after `ms`
/// of compute (an NCCL all_reduce in small).
#[no_mangle]
pub extern "C" fn cuSimLaunchCollective(
    group: u64,
    seq: u64,
    ranks: c_uint,
    ms: c_uint,
    _stream: *mut c_void,
) -> CUresult {
    ret(|| target::api(|rt| rt.collective(group, seq, ranks, ms)))
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetRestoreThreadId(
    pid: c_int,
    tid: *mut c_int,
) -> CUresult {
    ret(|| {
        let t = controller::restore_thread_id(pid)?;
        // SAFETY: out-parameter per cuda.h.
        unsafe { put(tid, t) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetState(pid: c_int, state: *mut c_uint) -> CUresult {
    ret(|| {
        let s = controller::state(pid)?;
        // SAFETY: out-parameter per cuda.h.
        unsafe { put(state, s) }
    })
}

/// `CUcheckpointLockArgs`: timeoutMs first.
#[repr(C)]
pub struct LockArgs {
    timeout_ms: c_uint,
    reserved0: c_uint,
    reserved1: [u64; 7],
}

/// `CUcheckpointRestoreArgs` (CUDA 13.0 layout).
#[repr(C)]
pub struct RestoreArgs {
    gpu_pairs: *const [u8; 32],
    gpu_pairs_count: c_uint,
    reserved: [u8; 44],
    reserved1: u64,
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessLock(pid: c_int, args: *mut LockArgs) -> CUresult {
    // SAFETY: NULL or a valid CUcheckpointLockArgs, per cuda.h.
    let timeout = unsafe { args.as_ref() }.map_or(0, |a| a.timeout_ms);
    ret(|| controller::act(pid, Op::Lock, timeout, Vec::new()))
}

#[no_mangle]
pub extern "C" fn cuCheckpointProcessCheckpoint(pid: c_int, _args: *mut c_void) -> CUresult {
    ret(|| controller::act(pid, Op::Checkpoint, 0, Vec::new()))
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessRestore(
    pid: c_int,
    args: *mut RestoreArgs,
) -> CUresult {
    let mut pairs = Vec::new();
    // SAFETY: NULL or a valid CUcheckpointRestoreArgs whose gpuPairs holds gpuPairsCount
    // entries of 32 bytes, per cuda.h.
    if let Some(a) = unsafe { args.as_ref() } {
        if a.gpu_pairs_count > 0 {
            if a.gpu_pairs.is_null() || a.gpu_pairs_count as usize > cuda_sim::control::MAX_PAIRS {
                return code::INVALID_VALUE;
            }
            // SAFETY: see above.
            let raw =
                unsafe { std::slice::from_raw_parts(a.gpu_pairs, a.gpu_pairs_count as usize) };
            pairs = raw
                .iter()
                .map(|p| (p[..16].try_into().unwrap(), p[16..].try_into().unwrap()))
                .collect();
        }
    }
    ret(|| controller::act(pid, Op::Restore, 0, pairs))
}

#[no_mangle]
pub extern "C" fn cuCheckpointProcessUnlock(pid: c_int, _args: *mut c_void) -> CUresult {
    ret(|| controller::act(pid, Op::Unlock, 0, Vec::new()))
}

// ---- NVML: every GPU of the machine (NVML does not read CUDA_VISIBLE_DEVICES) ----

type NvmlReturn = c_uint;

fn nvml_ret(f: impl FnOnce() -> Result<(), u32>) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => nvml::ret::SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => nvml::ret::UNKNOWN,
    }
}

unsafe fn nvml_str(dst: *mut c_char, len: c_uint, s: &str) -> Result<(), u32> {
    if (len as usize) <= s.len() {
        return Err(nvml::ret::INSUFFICIENT_SIZE);
    }
    // SAFETY: forwarded contract: `dst` holds `len` bytes.
    unsafe { put_str(dst, len as usize, s) }.map_err(|_| nvml::ret::INVALID_ARGUMENT)
}

fn nvml_index(dev: *mut c_void) -> Result<u32, u32> {
    if dev.is_null() {
        return Err(nvml::ret::INVALID_ARGUMENT);
    }
    Ok(dev as usize as u32 - 1)
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    nvml_ret(nvml::init)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    nvml_ret(nvml::init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    nvml_ret(|| {
        nvml::shutdown();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(r: NvmlReturn) -> *const c_char {
    nvml::error_string(r).as_ptr().cast()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    // SAFETY: `version` holds `len` bytes, per nvml.h.
    nvml_ret(|| unsafe { nvml_str(version, len, &nvml::driver_version()?) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    nvml_ret(|| {
        // SAFETY: out-parameter per nvml.h.
        unsafe { put(version, cuda_sim::CUDA_VERSION) }.map_err(|_| nvml::ret::INVALID_ARGUMENT)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> NvmlReturn {
    // SAFETY: same contract as the _v2 function.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(version) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    nvml_ret(|| {
        let n = nvml::device_count()?;
        // SAFETY: out-parameter per nvml.h.
        unsafe { put(count, n) }.map_err(|_| nvml::ret::INVALID_ARGUMENT)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    dev: *mut *mut c_void,
) -> NvmlReturn {
    nvml_ret(|| {
        nvml::device(index)?;
        // SAFETY: out-parameter per nvml.h.
        unsafe { put(dev, (index as usize + 1) as *mut c_void) }
            .map_err(|_| nvml::ret::INVALID_ARGUMENT)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: *mut c_void, index: *mut c_uint) -> NvmlReturn {
    nvml_ret(|| {
        let i = nvml_index(dev)?;
        nvml::device(i)?;
        // SAFETY: out-parameter per nvml.h.
        unsafe { put(index, i) }.map_err(|_| nvml::ret::INVALID_ARGUMENT)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: *mut c_void,
    uuid: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    nvml_ret(|| {
        let d = nvml::device(nvml_index(dev)?)?;
        // SAFETY: `uuid` holds `len` bytes, per nvml.h.
        unsafe { nvml_str(uuid, len, &visible::uuid_text(&d.uuid)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    dev: *mut c_void,
    name: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    nvml_ret(|| {
        let d = nvml::device(nvml_index(dev)?)?;
        // SAFETY: `name` holds `len` bytes, per nvml.h.
        unsafe { nvml_str(name, len, &d.name) }
    })
}

/// The N of /dev/nvidiaN: only where the simulated machine has device nodes
/// (`cuda-sim-gpud --device-nodes`), as a driver without them would answer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    dev: *mut c_void,
    minor: *mut c_uint,
) -> NvmlReturn {
    nvml_ret(|| {
        let d = nvml::device(nvml_index(dev)?)?;
        let m = d.minor.ok_or(nvml::ret::NOT_SUPPORTED)?;
        // SAFETY: out-parameter per nvml.h.
        unsafe { put(minor, m) }.map_err(|_| nvml::ret::INVALID_ARGUMENT)
    })
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: *mut c_void,
    mem: *mut NvmlMemory,
) -> NvmlReturn {
    nvml_ret(|| {
        let (free, total, used) = nvml::memory(nvml_index(dev)?)?;
        // SAFETY: out-parameter per nvml.h.
        unsafe { put(mem, NvmlMemory { total, free, used }) }
            .map_err(|_| nvml::ret::INVALID_ARGUMENT)
    })
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: *mut c_void,
    mem: *mut NvmlMemoryV2,
) -> NvmlReturn {
    nvml_ret(|| {
        let (free, total, used) = nvml::memory(nvml_index(dev)?)?;
        // SAFETY: in/out parameter per nvml.h; the caller set `version`.
        let version = unsafe { mem.as_ref() }
            .ok_or(nvml::ret::INVALID_ARGUMENT)?
            .version;
        let info = NvmlMemoryV2 {
            version,
            total,
            reserved: 0,
            free,
            used,
        };
        // SAFETY: as above.
        unsafe { put(mem, info) }.map_err(|_| nvml::ret::INVALID_ARGUMENT)
    })
}

/// `nvmlProcessInfo_t` (v2 layout, used by the _v3 query).
#[repr(C)]
pub struct NvmlProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    nvml_ret(|| {
        let list = nvml::processes(nvml_index(dev)?)?;
        if count.is_null() {
            return Err(nvml::ret::INVALID_ARGUMENT);
        }
        // SAFETY: `count` is a valid in/out parameter per nvml.h.
        let room = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = list.len() as c_uint };
        if infos.is_null() || room < list.len() {
            return if list.is_empty() {
                Ok(())
            } else {
                Err(nvml::ret::INSUFFICIENT_SIZE)
            };
        }
        for (i, (pid, used)) in list.into_iter().enumerate() {
            // SAFETY: `infos` holds `room` >= list.len() entries, per nvml.h.
            unsafe {
                infos.add(i).write(NvmlProcessInfo {
                    pid,
                    used_gpu_memory: used,
                    gpu_instance_id: u32::MAX,
                    compute_instance_id: u32::MAX,
                })
            };
        }
        Ok(())
    })
}
