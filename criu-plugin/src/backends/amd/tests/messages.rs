//! The operator's words: each message the backend's tests meet, pinned once in full as CRIU's
//! log shows it. Every other test matches the error's variant.

use criu_gpu_image::amd::AmdCheckError;

use super::*;
use crate::backends::amd::error::Who;

fn says(e: AmdError) -> String {
    HookError::from(e).to_string()
}

#[test]
fn a_pause_that_fails() {
    assert_eq!(
        says(AmdError::Pause {
            who: Who {
                pid: 10,
                comm: "app".into(),
            },
            source: amd_kfd::dump::DumpError::Version(1, 7),
        }),
        "pausing the GPU queues of ROCm process 10 (app) failed: KFD ioctl version 1.7 is too \
         old: checkpointing needs 1.8 (Linux 5.19 or a ROCm DKMS driver); upgrade the kernel \
         driver; nothing was paused, the dump is abandoned"
    );
}

/// The image crate's words, as the restore's `init` passes them on.
#[test]
fn restores_refused_before_anything_starts() {
    let check = |e| says(AmdError::Check(e));
    assert_eq!(
        check(AmdCheckError::ImagesMissing),
        "the image's inventory says it holds AMD GPU state (criu_gpu_amd) but no \
         amdgpu-kfd-*.img is in the image directory: copy the checkpoint again"
    );
    assert_eq!(
        check(AmdCheckError::NoKfd),
        "the checkpoint holds AMD GPU state but this machine has no /dev/kfd: load the amdgpu \
         driver (or restore on a machine with AMD GPUs)"
    );
    assert_eq!(
        check(AmdCheckError::Image {
            image: "/img/amdgpu-kfd-3.img".into(),
            why: "the checkpoint used 1 GPU(s) but 2 are here".into(),
        }),
        "/img/amdgpu-kfd-3.img: the checkpoint used 1 GPU(s) but 2 are here"
    );
}
