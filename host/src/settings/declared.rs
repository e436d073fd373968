//! Every setting, declared once: its key, what it means, its default as people read it (and as
//! docs/settings.md shows it, which a test checks), the value that default is, and how a value
//! is read. The plugin, `criu-gpu` and the docs take them from here.

use std::path::PathBuf;
use std::time::Duration;

use amd_kfd::topology::Checks;
use criu_gpu_image::addrmap::{self, AddressMap};
use cuda_checkpoint_ctl::ops::rounds::Rounds;
use cuda_checkpoint_ctl::placement::Request;

use super::parse;
use crate::thp::Want;

/// One setting: the key it is read under, and how.
pub struct Setting<T: 'static> {
    pub key: &'static str,
    pub meaning: &'static str,
    /// The default as people read it.
    pub default: &'static str,
    /// The value when the setting is absent (`None` for a default worked out when it is used).
    pub(super) value: fn() -> T,
    pub(super) parse: fn(&str) -> Result<T, String>,
}

/// A setting's row in the table of every setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub key: &'static str,
    pub meaning: &'static str,
    pub default: &'static str,
}

macro_rules! declare {
    ($($(#[$cfg:meta])* $name:ident: $t:ty = $key:expr, $parse:expr,
        default $value:expr, $default:literal, $meaning:literal;)*) => {
        $(
            $(#[$cfg])*
            pub const $name: Setting<$t> = Setting {
                key: $key,
                meaning: $meaning,
                default: $default,
                value: || $value,
                parse: $parse,
            };
        )*
        /// Every setting this build knows, in the order docs/settings.md lists them.
        pub const ALL: &[Row] = &[$(
            $(#[$cfg])*
            Row { key: $key, meaning: $meaning, default: $default },
        )*];
    };
}

declare! {
    LOCK_TIMEOUT: Option<Duration> = "CRIU_GPU_LOCK_TIMEOUT_MS", parse::some_millis,
        default None, "all of the seize time left",
        "how long locking the CUDA processes may take, in one lock or in rounds (capped by what is \
         left of criu --timeout)";
    ACTION_TIMEOUT: Option<Duration> = "CRIU_GPU_ACTION_TIMEOUT_S", parse::some_seconds,
        default None, "60 s + 2 s per GiB of GPU memory (10 min when unknown)",
        "the longest a GPU checkpoint or restore of the tree may take";
    DEVICE_MAP: Request = "CRIU_GPU_DEVICE_MAP", parse::device_map,
        default Request::Same, "same GPUs",
        "restore onto other GPUs: OLD=NEW[,...] or auto";
    ADDRESS_MAP: Option<AddressMap> = addrmap::SETTING, parse::address_map,
        default None, "nothing moves",
        "restore onto other IP addresses: OLD=NEW[,...]; every TCP socket's ends at an old address \
         move to the new one";
    PARALLEL: bool = "CRIU_GPU_PARALLEL", parse::flag,
        default true, "1",
        "0: one process at a time instead of all at once";
    DIGESTS: bool = "CRIU_GPU_DIGESTS", parse::flag,
        default true, "1",
        "0: do not record or check digests of the image files";
    THP: Want = "CRIU_GPU_THP", parse::thp,
        default Want::Auto, "auto",
        "auto: transparent huge pages raised from madvise to always for the seconds of the GPU \
         checkpoint and put back after; always: also from never; off (or 0, no, false)";
    OVERLAP: bool = "CRIU_GPU_OVERLAP", parse::flag,
        default true, "1",
        "0: CRIU puts every page in place before the GPU restore, instead of letting each \
         process's checkpoint data arrive while the driver restores";
    NCCL_CHECK: bool = "CRIU_GPU_NCCL_CHECK", parse::flag,
        default true, "1",
        "0: dump NCCL ranks of one node even if their transports (P2P, SHM, cuMem) cannot be \
         restored";
    LOCK_ROUNDS: Rounds = "CRIU_GPU_LOCK_ROUNDS", parse::rounds,
        default Rounds::Auto, "auto",
        "how a tree's processes are locked: auto locks NCCL ranks in rounds until all lock at \
         once, 0 locks once (the old way), 1 locks any group in rounds (0 and 1 as any switch)";
    CLUSTER: Option<PathBuf> = criu_gpu_image::cluster::SETTING, parse::some_path,
        default None, "none: this node alone",
        "a job across machines (set by criu-gpu dump --nnodes): the unix socket of this node's \
         criu-gpu, which decides every lock round with the other nodes";
    MIGRATE: Option<PathBuf> = "CRIU_GPU_MIGRATE", parse::some_path,
        default None, "none: not a move",
        "a job moved without a disk (set by criu-gpu dump --to for criu-gpu as CRIU's action \
         script; the plugin does not read it): the unix socket of the sending criu-gpu";
    STORE_HOLD: Option<PathBuf> = "CRIU_GPU_STORE_HOLD", parse::some_path,
        default None, "none",
        "tests only: criu-gpu's writes into a snapshot store wait between their chunks and their \
         manifest while this file exists (FILE.held says one waits; at most 120 s)";
    KUBECONFIG: Option<String> = "KUBECONFIG", parse::some_text,
        default None, "the pod's service account, else ~/.kube/config",
        "criu-gpu node: the API server's kubeconfig files when --kubeconfig is not given (a list \
         like PATH: the first that exists)";
    KUBELET_TOKEN: Option<String> = "KUBELET_TOKEN", parse::some_text,
        default None, "the kubeconfig's credentials",
        "criu-gpu node: the kubelet's bearer token when --token-file is not given";
    CONFIG: Option<String> = super::CONFIG_ENV, parse::some_text,
        default None, "/etc/criu/gpu-plugin.conf",
        "the settings file (read from the environment only)";
    LIBCUDA: Option<String> = cuda_checkpoint_ctl::driver::LIBCUDA_ENV, parse::some_text,
        default None, "libcuda.so.1",
        "the CUDA driver library the guardian loads";
    LIBNVML: Option<String> = cuda_checkpoint_ctl::inventory::LIBNVML_ENV, parse::some_text,
        default None, "libnvidia-ml.so.1",
        "the NVML library the guardian loads";
    // A restore of ROCm processes: where its files go, and CRIU's amdgpu plugin's switches
    // (docs/settings.md, AMD GPU matching).
    AMD_FD_BASE: i32 = "CRIU_GPU_AMD_FD_BASE", parse::fd_base,
        default 512, "512",
        "not a check: the lowest fd number of the KFD and render-node files the \
         plugin opens in a restored process, above the process's own";
    KFD_CAPABILITY_CHECK: bool = "KFD_CAPABILITY_CHECK", parse::flag,
        default true, "1",
        "the GPUs' capability flags; 0 lets a GPU with other capability bits take a checkpoint's";
    KFD_VRAM_SIZE_CHECK: bool = "KFD_VRAM_SIZE_CHECK", parse::flag,
        default true, "1",
        "device memory size; 0 lets a GPU with less VRAM take a checkpoint's";
    KFD_NUM_GWS_CHECK: bool = "KFD_NUM_GWS_CHECK", parse::flag,
        default true, "1",
        "the number of global wave syncs; 0 lets a GPU with fewer take a checkpoint's";
    KFD_CACHES_COUNT_CHECK: bool = "KFD_CACHES_COUNT_CHECK", parse::flag,
        default true, "1",
        "the number of caches; 0 lets a GPU with fewer take a checkpoint's";
    KFD_FW_VER_CHECK: bool = "KFD_FW_VER_CHECK", parse::flag,
        default true, "1",
        "firmware version; 0 lets a GPU with older firmware take a checkpoint's";
    KFD_SDMA_FW_VER_CHECK: bool = "KFD_SDMA_FW_VER_CHECK", parse::flag,
        default true, "1",
        "SDMA firmware version; 0 lets a GPU with older SDMA firmware take a checkpoint's";
    KFD_NUMA_CHECK: bool = "KFD_NUMA_CHECK", parse::flag,
        default true, "1",
        "NUMA placement: GPUs of one CPU node stay together; 0 lets GPUs that shared a NUMA node \
         at the dump be placed on different ones";
    // The simulated KFD: test builds only, never the installed plugin's.
    #[cfg(feature = "simulation")]
    AMD_KFD_SIM_ROOT: Option<std::path::PathBuf> = amd_kfd::device::sim::ROOT_ENV, parse::some_path,
        default None, "none: the kernel's KFD",
        "the simulated KFD's directory (test builds only)";
}

/// A `KFD_*_CHECK` switch, with the check of amd-kfd's it turns off.
pub type KfdSwitch = (&'static Setting<bool>, fn(&mut Checks) -> &mut bool);

/// The `KFD_*_CHECK` switches.
pub const KFD_CHECKS: [KfdSwitch; 7] = [
    (&KFD_CAPABILITY_CHECK, |c| &mut c.capability),
    (&KFD_VRAM_SIZE_CHECK, |c| &mut c.vram_size),
    (&KFD_NUM_GWS_CHECK, |c| &mut c.num_gws),
    (&KFD_CACHES_COUNT_CHECK, |c| &mut c.caches_count),
    (&KFD_FW_VER_CHECK, |c| &mut c.fw_version),
    (&KFD_SDMA_FW_VER_CHECK, |c| &mut c.sdma_fw_version),
    (&KFD_NUMA_CHECK, |c| &mut c.numa),
];
