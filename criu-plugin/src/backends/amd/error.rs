//! Why an AMD dump or restore fails, and what the operator reads: the cause, the state things
//! were left in, and the fix.

use std::path::PathBuf;

use amd_kfd::device::KfdError;
use criu_gpu_host::settings::SettingsError;
use criu_gpu_image::amd::AmdCheckError;

use crate::guardian::GuardianError;

/// A process, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    pub pid: i32,
    pub comm: String,
}

impl Who {
    pub fn of(pid: i32) -> Who {
        Who {
            pid,
            comm: process_facts::process::name(pid),
        }
    }
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ROCm process {} ({})", self.pid, self.comm)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AmdError {
    #[error(
        "CRIU did not tell the plugin its image directory, so the GPU state of ROCm processes \
         has nowhere to go; use CRIU 4.0 or later (criu_get_image_dir); nothing was paused"
    )]
    NoImageDir,
    #[error(
        "a KFD file of the dump (CRIU file {id}) is not open in any process of the dumped tree \
         (a KFD file passed to another process?), so nothing could restart its GPU queues if \
         CRIU died; nothing was paused: dump the process that opened /dev/kfd"
    )]
    Unowned { id: u32 },
    #[error(
        "cannot start the guardian process that restarts the GPU queues of {who} if CRIU dies \
         ({source}); nothing was paused, the dump is abandoned: dump again"
    )]
    Guardian { who: Who, source: GuardianError },
    #[error("CRIU's copy of the KFD file of {who} cannot be kept ({source}); nothing was paused")]
    Keep { who: Who, source: std::io::Error },
    #[error(
        "this machine's AMD GPU topology cannot be read ({0}); check that the amdgpu driver is \
         loaded (/sys/class/kfd/kfd/topology); nothing was paused"
    )]
    Topology(AmdCheckError),
    #[error(
        "pausing the GPU queues of {who} failed: {source}; nothing was paused, the dump is \
         abandoned"
    )]
    Pause {
        who: Who,
        source: amd_kfd::dump::DumpError,
    },
    #[error(
        "saving the KFD state of {who} failed: {source}; its GPU queues run again (the guardian \
         restarts them if the plugin could not), the dump is abandoned"
    )]
    Save {
        who: Who,
        source: amd_kfd::dump::DumpError,
    },
    #[error("writing {path} failed ({source}); the dump is abandoned: check the image directory")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// What the image crate refuses before anything is restored (it names the file and the fix).
    #[error("{0}")]
    Check(#[from] AmdCheckError),
    #[error("{0}")]
    Settings(#[from] SettingsError),
    #[error(
        "{path} does not name a render node ({text:?}): the image directory is damaged, copy \
             the checkpoint again; the restore fails"
    )]
    RenderImage { path: PathBuf, text: String },
    #[error(
        "opening the render node renderD{minor} in the restored process failed ({source}); the \
         restore fails, the images are unchanged: check /dev/dri and restore again"
    )]
    RenderNode { minor: u32, source: KfdError },
    #[error(
        "restoring {image} in the restored process failed: {source}; the restore fails, the \
         images are unchanged: fix the cause and restore again"
    )]
    Restore {
        image: String,
        source: amd_kfd::restore::RestoreError,
    },
    #[error(
        "the render node the restore opened for the mapping at {addr:#x} cannot be handed to \
         CRIU ({source}); the restore fails, the images are unchanged: restore again"
    )]
    Dup { addr: u64, source: std::io::Error },
    #[error(
        "resuming process {pid} on its AMD GPUs failed ({source}); it was killed so that criu \
         reports the failure: the images are unchanged, restore again"
    )]
    Resume { pid: i32, source: KfdError },
}

/// An AMD failure is a GPU failure of the hook (its message says what is left to do).
impl From<AmdError> for crate::core::HookError {
    fn from(e: AmdError) -> Self {
        crate::core::HookError::gpu(e)
    }
}
