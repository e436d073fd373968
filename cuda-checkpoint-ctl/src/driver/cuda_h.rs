//! The argument structs of the driver's checkpoint API, declared as `cuda.h` of CUDA 13.0 lays
//! them out (driver r580; `CUcheckpointRestoreArgs` carries the GPU pairs since 13.0). Six plain
//! structs are all this crate needs of the CUDA headers, so they are written here rather than
//! linking a binding crate into every process that loads this library (CRIU among them).
//!
//! Later headers (13.4) give some reserved bytes a meaning (`customStorageInfo_out`): written
//! as zero, as here, they keep the 13.0 behaviour.

use std::ffi::{c_char, c_uint};

/// `CUuuid`: a GPU's UUID.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

/// `CUcheckpointGpuPair`: where the state of a GPU of the checkpoint goes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUcheckpointGpuPair {
    pub old_uuid: CUuuid,
    pub new_uuid: CUuuid,
}

/// `CUcheckpointLockArgs`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUcheckpointLockArgs {
    pub timeout_ms: c_uint,
    pub reserved0: c_uint,
    pub reserved1: [u64; 7],
}

/// `CUcheckpointCheckpointArgs`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUcheckpointCheckpointArgs {
    pub reserved: [u64; 8],
}

/// `CUcheckpointRestoreArgs` (CUDA 13.0).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUcheckpointRestoreArgs {
    pub gpu_pairs: *mut CUcheckpointGpuPair,
    pub gpu_pairs_count: c_uint,
    pub reserved: [c_char; 44],
    pub reserved1: u64,
}

/// `CUcheckpointUnlockArgs`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUcheckpointUnlockArgs {
    pub reserved: [u64; 8],
}

#[cfg(test)]
mod tests {
    use std::mem::{align_of, size_of};

    use super::*;

    /// (offset, size) of a field.
    macro_rules! field {
        ($t:ty, $f:ident) => {{
            fn size<F>(_: fn(&$t) -> &F) -> usize {
                size_of::<F>()
            }
            (std::mem::offset_of!($t, $f), size(|s: &$t| &s.$f))
        }};
    }

    fn whole<T>() -> (usize, usize) {
        (size_of::<T>(), align_of::<T>())
    }

    /// Sizes, alignments, and each field's offset and size as `cuda.h` 13.0 has them (the values
    /// of cudarc 0.19's bindgen output for `cuda-13000`, and of CRIU's C cuda_plugin).
    #[test]
    fn layouts_match_cuda_h_13_0() {
        assert_eq!(whole::<CUuuid>(), (16, 1));
        assert_eq!(whole::<CUcheckpointGpuPair>(), (32, 1));
        assert_eq!(field!(CUcheckpointGpuPair, old_uuid), (0, 16));
        assert_eq!(field!(CUcheckpointGpuPair, new_uuid), (16, 16));

        assert_eq!(whole::<CUcheckpointLockArgs>(), (64, 8));
        assert_eq!(field!(CUcheckpointLockArgs, timeout_ms), (0, 4));
        assert_eq!(field!(CUcheckpointLockArgs, reserved0), (4, 4));
        assert_eq!(field!(CUcheckpointLockArgs, reserved1), (8, 56));

        assert_eq!(whole::<CUcheckpointCheckpointArgs>(), (64, 8));
        assert_eq!(field!(CUcheckpointCheckpointArgs, reserved), (0, 64));
        assert_eq!(whole::<CUcheckpointUnlockArgs>(), (64, 8));
        assert_eq!(field!(CUcheckpointUnlockArgs, reserved), (0, 64));

        assert_eq!(whole::<CUcheckpointRestoreArgs>(), (64, 8));
        assert_eq!(field!(CUcheckpointRestoreArgs, gpu_pairs), (0, 8));
        assert_eq!(field!(CUcheckpointRestoreArgs, gpu_pairs_count), (8, 4));
        assert_eq!(field!(CUcheckpointRestoreArgs, reserved), (12, 44));
        assert_eq!(field!(CUcheckpointRestoreArgs, reserved1), (56, 8));
    }
}
