//! The settings a CUDA dump and a CUDA restore use, each read and checked once, before either
//! changes anything: a bad value (`CRIU_GPU_DIGESTS=maybe`) fails a dump and a restore alike,
//! naming the key, where it came from and the fix, and nothing is locked or started.

use std::path::PathBuf;
use std::time::Duration;

use criu_gpu_host::settings::declared::{
    ACTION_TIMEOUT, CLUSTER, DEVICE_MAP, DIGESTS, LOCK_ROUNDS, LOCK_TIMEOUT, NCCL_CHECK, OVERLAP,
    PARALLEL, THP,
};
use criu_gpu_host::settings::{Settings, SettingsError};
use criu_gpu_host::thp::Want;
use cuda_checkpoint_ctl::ops::rounds::Rounds;
use cuda_checkpoint_ctl::placement::Request;

/// What a dump of CUDA processes reads.
#[derive(Debug, Clone, PartialEq)]
pub struct DumpSettings {
    /// How long locking may take (else all of CRIU's seize time left).
    pub lock_timeout: Option<Duration>,
    pub rounds: Rounds,
    pub parallel: bool,
    pub nccl_check: bool,
    pub digests: bool,
    pub thp: Want,
    pub action_timeout: Option<Duration>,
    /// A job across machines: the socket of this node's criu-gpu, which decides each lock round.
    pub cluster: Option<PathBuf>,
}

impl DumpSettings {
    pub fn read(s: &Settings) -> Result<DumpSettings, SettingsError> {
        Ok(DumpSettings {
            lock_timeout: s.get(&LOCK_TIMEOUT)?,
            rounds: s.get(&LOCK_ROUNDS)?,
            parallel: s.get(&PARALLEL)?,
            nccl_check: s.get(&NCCL_CHECK)?,
            digests: s.get(&DIGESTS)?,
            thp: s.get(&THP)?,
            action_timeout: s.get(&ACTION_TIMEOUT)?,
            cluster: s.get(&CLUSTER)?,
        })
    }
}

/// What a restore of CUDA processes reads.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreSettings {
    pub device_map: Request,
    pub digests: bool,
    pub overlap: bool,
    pub parallel: bool,
    pub action_timeout: Option<Duration>,
}

impl RestoreSettings {
    pub fn read(s: &Settings) -> Result<RestoreSettings, SettingsError> {
        Ok(RestoreSettings {
            device_map: s.get(&DEVICE_MAP)?,
            digests: s.get(&DIGESTS)?,
            overlap: s.get(&OVERLAP)?,
            parallel: s.get(&PARALLEL)?,
            action_timeout: s.get(&ACTION_TIMEOUT)?,
        })
    }
}

/// How long a GPU checkpoint or restore of `bytes` (all processes together) may take before the
/// plugin gives up on it: `CRIU_GPU_ACTION_TIMEOUT_S` (`set`), else a generous bound from the
/// size (the driver moved 0.5 to 1.7 GB/s per process on an H100, several processes at once
/// about as fast as one; docs/driver-facts.md), else 10 minutes when the size is unknown.
pub fn action_limit(set: Option<Duration>, bytes: Option<u64>) -> Duration {
    if let Some(limit) = set {
        return limit;
    }
    match bytes {
        // 60 s, plus 2 s per GiB: 0.5 GiB/s, a quarter of the slowest rate measured.
        Some(b) => Duration::from_secs(60 + 2 * b.div_ceil(1 << 30)),
        None => Duration::from_secs(600),
    }
}
