//! The plugin's settings. CRIU passes no options to plugins, so they come from the environment
//! of the `criu` process or, for container runtimes that do not pass it on, from a file
//! (`/etc/criu/gpu-plugin.conf`, or `CRIU_GPU_CONFIG`) holding `KEY=VALUE` lines; `#` starts a
//! comment; the environment wins.
//!
//! Every CRIU run on a node reads the file, also dumps of containers without GPUs, so nothing is
//! validated when it is read: a backend asks for the setting it needs when it needs it, and only
//! then is a bad value an error (a typo in a restore-only setting does not fail a dump). Keys the
//! plugin does not know are reported once, as a warning.
//!
//! The file may also set the libraries' variables (`CUDA_CKPT_LIBCUDA`, `CUDA_CKPT_LIBNVML`,
//! `KFD_*_CHECK`): [`export_file_settings`] puts those into criu's environment when it lacks them.

use std::collections::BTreeMap;
use std::time::Duration;

use amd_kfd::topology::Checks;
use cuda_checkpoint_ctl::placement::Request;

pub const CONFIG_FILE: &str = "/etc/criu/gpu-plugin.conf";
pub const CONFIG_ENV: &str = "CRIU_GPU_CONFIG";

/// The plugin's own keys, with what they mean (for the unknown-key warning and the docs).
pub const KEYS: &[(&str, &str)] = &[
    (
        "CRIU_GPU_LOCK_TIMEOUT_MS",
        "how long locking the CUDA processes may take, in one lock or in rounds (capped by criu --timeout)",
    ),
    (
        "CRIU_GPU_LOCK_ROUNDS",
        "auto: lock NCCL ranks in rounds until all lock at once; 1: any group; 0: one lock",
    ),
    (
        "CRIU_GPU_ACTION_TIMEOUT_S",
        "the longest a GPU checkpoint or restore may take (default: from the GPU memory)",
    ),
    (
        "CRIU_GPU_DEVICE_MAP",
        "restore onto other GPUs: OLD=NEW[,...] or auto",
    ),
    (
        "CRIU_GPU_PARALLEL",
        "0: one process at a time instead of all at once",
    ),
    (
        "CRIU_GPU_DIGESTS",
        "0: do not record or check digests of the image files",
    ),
    (
        "CRIU_GPU_THP",
        "auto: raise transparent huge pages from madvise to always for a GPU checkpoint; always; off",
    ),
    (
        "CRIU_GPU_OVERLAP",
        "0: CRIU puts every page in place before the GPU restore instead of during it",
    ),
    (
        "CRIU_GPU_NCCL_CHECK",
        "0: dump NCCL ranks of one node even if their transports cannot be restored",
    ),
    (
        "CRIU_GPU_AMD_FD_BASE",
        "restore of ROCm processes: the lowest fd number of the KFD and render-node files the plugin opens in a restored process, above the process's own (default 512)",
    ),
    (
        "KFD_CAPABILITY_CHECK",
        "restore of ROCm processes (CRIU's amdgpu plugin's switch): 0 lets a GPU with other capability bits take a checkpoint's",
    ),
    (
        "KFD_VRAM_SIZE_CHECK",
        "restore of ROCm processes: 0 lets a GPU with less VRAM take a checkpoint's",
    ),
    (
        "KFD_NUM_GWS_CHECK",
        "restore of ROCm processes: 0 lets a GPU with fewer global wave syncs take a checkpoint's",
    ),
    (
        "KFD_CACHES_COUNT_CHECK",
        "restore of ROCm processes: 0 lets a GPU with fewer caches take a checkpoint's",
    ),
    (
        "KFD_FW_VER_CHECK",
        "restore of ROCm processes: 0 lets a GPU with older firmware take a checkpoint's",
    ),
    (
        "KFD_SDMA_FW_VER_CHECK",
        "restore of ROCm processes: 0 lets a GPU with older SDMA firmware take a checkpoint's",
    ),
    (
        "KFD_NUMA_CHECK",
        "restore of ROCm processes: 0 lets GPUs that shared a NUMA node at the dump be placed on different ones",
    ),
    (
        "CRIU_GPU_ADDRESS_MAP",
        "restore on other addresses: OLD=NEW[,...]; both ends of every TCP socket are moved (needs CRIU's UPDATE_INETSK hook: the project's CRIU, patch 0012; set by criu-gpu restore --address-map or across nodes)",
    ),
    (
        "CRIU_GPU_CLUSTER",
        "a job across machines (set by criu-gpu dump --nnodes): the unix socket of this node's criu-gpu, which decides every lock round with the other nodes",
    ),
    ("CRIU_GPU_CONFIG", "the settings file"),
];

/// Prefixes of the library variables the file may put into criu's environment. The simulated
/// CUDA driver is a library of its own, selected by CUDA_CKPT_LIBCUDA; its variables pass like
/// the real driver's. The simulated KFD is code of the plugin's, in test builds only.
#[cfg(not(feature = "simulation"))]
const EXPORTED: &[&str] = &["CRIU_GPU_", "CUDA_CKPT_", "KFD_", "CUDA_SIM_"];
#[cfg(feature = "simulation")]
const EXPORTED: &[&str] = &["CRIU_GPU_", "CUDA_CKPT_", "KFD_", "CUDA_SIM_", "AMD_KFD_"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Environment,
    File(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Environment => f.write_str("the environment of criu"),
            Source::File(p) => f.write_str(p),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}={value:?} (from {from}): {expected}")]
pub struct SettingsError {
    pub key: &'static str,
    pub value: String,
    pub from: Source,
    pub expected: String,
}

/// The settings of one CRIU run, unparsed.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    values: BTreeMap<String, (String, Source)>,
}

fn file_lines(file: &str) -> impl Iterator<Item = (String, String)> + '_ {
    file.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
}

impl Settings {
    /// Reads the environment and the settings file. Never fails: an unreadable file is only
    /// mentioned.
    pub fn load() -> Settings {
        let path = std::env::var(CONFIG_ENV).unwrap_or_else(|_| CONFIG_FILE.into());
        let file = match std::fs::read_to_string(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                tracing::warn!("the settings file {path} cannot be read ({e}); it is ignored");
                String::new()
            }
        };
        // The plugin's keys, and CRIU's amdgpu plugin's switches, which it honours too.
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with("CRIU_GPU_") || k.starts_with("KFD_"))
            .collect();
        let s = Settings::from_sources(&env, &file, &path);
        s.warn_unknown();
        s
    }

    /// From the `CRIU_GPU_*` variables of the environment and the text of the settings file.
    pub fn from_sources(env: &[(String, String)], file: &str, path: &str) -> Settings {
        let mut values = BTreeMap::new();
        for (k, v) in file_lines(file) {
            if !v.is_empty() {
                values.insert(k, (v, Source::File(path.to_owned())));
            }
        }
        for (k, v) in env.iter().filter(|(_, v)| !v.is_empty()) {
            values.insert(k.clone(), (v.clone(), Source::Environment));
        }
        Settings { values }
    }

    /// Keys with the plugin's prefix that it does not know: a typo, reported once per run.
    pub fn unknown(&self) -> Vec<(&str, &Source)> {
        self.values
            .iter()
            .filter(|(k, _)| k.starts_with("CRIU_GPU_") && !KEYS.iter().any(|(n, _)| n == k))
            .map(|(k, (_, src))| (k.as_str(), src))
            .collect()
    }

    fn warn_unknown(&self) {
        for (k, src) in self.unknown() {
            let known: Vec<&str> = KEYS.iter().map(|(n, _)| *n).collect();
            tracing::warn!(
                "unknown setting {k} in {src} is ignored (known: {})",
                known.join(", ")
            );
        }
    }

    fn raw(&self, key: &'static str) -> Option<&(String, Source)> {
        self.values.get(key)
    }

    fn parse<T>(
        &self,
        key: &'static str,
        expected: &str,
        f: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<T>, SettingsError> {
        let Some((v, src)) = self.raw(key) else {
            return Ok(None);
        };
        f(v).map(Some).ok_or_else(|| SettingsError {
            key,
            value: v.clone(),
            from: src.clone(),
            expected: expected.to_owned(),
        })
    }

    pub fn millis(&self, key: &'static str) -> Result<Option<Duration>, SettingsError> {
        self.parse(key, "expected a number of milliseconds", |v| {
            v.parse::<u64>()
                .ok()
                .map(|ms| Duration::from_millis(ms.max(1)))
        })
    }

    pub fn seconds(&self, key: &'static str) -> Result<Option<Duration>, SettingsError> {
        self.parse(key, "expected a number of seconds", |v| {
            v.parse::<u64>().ok().map(|s| Duration::from_secs(s.max(1)))
        })
    }

    pub fn flag(&self, key: &'static str) -> Result<Option<bool>, SettingsError> {
        self.parse(key, "use 1 or 0", |v| match v {
            "1" | "yes" | "true" => Some(true),
            "0" | "no" | "false" => Some(false),
            _ => None,
        })
    }

    /// A value parsed by `f`, whose error becomes the expectation in the message.
    pub fn parsed<T, E: std::fmt::Display>(
        &self,
        key: &'static str,
        f: impl Fn(&str) -> Result<T, E>,
    ) -> Result<Option<T>, SettingsError> {
        let Some((v, src)) = self.raw(key) else {
            return Ok(None);
        };
        f(v).map(Some).map_err(|e| SettingsError {
            key,
            value: v.clone(),
            from: src.clone(),
            expected: e.to_string(),
        })
    }
}

impl Settings {
    /// Where the GPU state goes: CRIU_GPU_DEVICE_MAP, or the same GPUs.
    pub fn device_map(&self) -> Result<Request, SettingsError> {
        Ok(self
            .parsed("CRIU_GPU_DEVICE_MAP", |v| {
                v.parse::<Request>()
                    .map_err(|e| format!("{e}; use OLD_UUID=NEW_UUID[,...], auto or same"))
            })?
            .unwrap_or_default())
    }

    /// The `KFD_*_CHECK` settings (CRIU's amdgpu plugin's names and spellings).
    pub fn kfd_checks(&self) -> Result<Checks, SettingsError> {
        let mut c = Checks::default();
        for (key, check) in c.switches() {
            if let Some(on) = self.parsed(key, Checks::parse_switch)? {
                *check = on;
            }
        }
        Ok(c)
    }
}

/// The file's library settings that the environment lacks, for [`export_file_settings`].
pub fn file_settings(file: &str, env: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    file_lines(file)
        .filter(|(k, v)| !v.is_empty() && EXPORTED.iter().any(|p| k.starts_with(p)) && !env(k))
        .collect()
}

/// Exports the settings file's library settings into this (criu's) process environment. Called
/// once, from `init`, while criu runs a single thread.
pub fn export_file_settings() {
    let path = std::env::var(CONFIG_ENV).unwrap_or_else(|_| CONFIG_FILE.into());
    let Ok(file) = std::fs::read_to_string(&path) else {
        return;
    };
    for (k, v) in file_settings(&file, |k| std::env::var_os(k).is_some()) {
        tracing::debug!("{k}={v} (from {path})");
        std::env::set_var(k, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(env: &[(&str, &str)], file: &str) -> Settings {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_sources(&env, file, "/etc/criu/gpu-plugin.conf")
    }

    #[test]
    fn environment_wins_over_the_file() {
        let file = "# comment\nCRIU_GPU_LOCK_TIMEOUT_MS = 7000\nCRIU_GPU_DEVICE_MAP=auto\n";
        let s = settings(&[], file);
        assert_eq!(
            s.millis("CRIU_GPU_LOCK_TIMEOUT_MS").unwrap(),
            Some(Duration::from_secs(7))
        );
        let s = settings(&[("CRIU_GPU_LOCK_TIMEOUT_MS", "250")], file);
        assert_eq!(
            s.millis("CRIU_GPU_LOCK_TIMEOUT_MS").unwrap(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            settings(&[], "").millis("CRIU_GPU_LOCK_TIMEOUT_MS"),
            Ok(None)
        );
    }

    #[test]
    fn a_bad_value_fails_only_where_it_is_used_and_names_key_and_file() {
        let s = settings(&[], "CRIU_GPU_LOCK_TIMEOUT_MS=soon\nCRIU_GPU_PARALLEL=1\n");
        // Reading another setting is fine: the typo only matters to whoever needs the value.
        assert_eq!(s.flag("CRIU_GPU_PARALLEL"), Ok(Some(true)));
        let e = s
            .millis("CRIU_GPU_LOCK_TIMEOUT_MS")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("CRIU_GPU_LOCK_TIMEOUT_MS") && e.contains("/etc/criu/gpu-plugin.conf"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_with_our_prefix_are_reported() {
        let s = settings(&[], "CRIU_GPU_LOCK_TIMOUT_MS=9000\nCUDA_CKPT_LIBCUDA=/x\n");
        let unknown: Vec<&str> = s.unknown().into_iter().map(|(k, _)| k).collect();
        assert_eq!(unknown, ["CRIU_GPU_LOCK_TIMOUT_MS"]);
    }

    #[test]
    fn the_file_fills_in_library_settings_the_environment_lacks() {
        let file = "CUDA_CKPT_LIBCUDA=/opt/lib/libcuda.so.1\nCRIU_GPU_PARALLEL=0\nPATH=/evil\nKFD_FW_VER_CHECK=\n";
        let got = file_settings(file, |k| k == "CRIU_GPU_PARALLEL");
        assert_eq!(
            got,
            vec![(
                "CUDA_CKPT_LIBCUDA".to_owned(),
                "/opt/lib/libcuda.so.1".to_owned()
            )]
        );
    }
}
