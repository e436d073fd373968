//! The plugin's settings. CRIU passes no options to plugins, so they come from the environment
//! of the `criu` process or, for container runtimes that do not pass it on, from a file.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `CRIU_GPU_LOCK_TIMEOUT_MS` | how long a lock waits for submitted GPU work | 5000 |
//! | `CRIU_GPU_DEVICE_MAP` | restore onto other GPUs: `OLD=NEW,...` or `auto` | none |
//! | `CRIU_GPU_PARALLEL` | `0`: checkpoint and restore one process at a time | 1 |
//! | `CRIU_GPU_CONFIG` | the file read for unset variables | /etc/criu/gpu-plugin.conf |
//!
//! The file holds `KEY=VALUE` lines with the same keys; `#` starts a comment. It may also set
//! the libraries' variables (`CUDA_CKPT_LIBCUDA`, `CUDA_CKPT_LIBNVML`, `KFD_*_CHECK`, and the
//! simulations' `CUDA_SIM_*`, `AMD_KFD_SIM_ROOT`): [`export_file_settings`] puts those into the
//! environment of the criu process when it does not have them, since container runtimes start
//! criu with an environment of their own.

use std::time::Duration;

use cuda_checkpoint_ctl::driver::DeviceMap;

use super::HookError;

pub const CONFIG_FILE: &str = "/etc/criu/gpu-plugin.conf";

/// How restore chooses GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GpuPlacement {
    /// The GPUs of the checkpoint, by UUID.
    #[default]
    Same,
    /// Same UUID where present, else a free GPU of the same model with room.
    Auto,
    /// The operator's map.
    Map(DeviceMap),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub lock_timeout: Duration,
    pub placement: GpuPlacement,
    /// Drive all processes of a tree at once (the default), or one after another: a fallback
    /// for drivers that misbehave with concurrent calls, and the baseline of the benchmark.
    pub parallel: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            // Below CRIU's default --timeout (10 s), which bounds the whole seizing phase.
            lock_timeout: Duration::from_secs(5),
            placement: GpuPlacement::Same,
            parallel: true,
        }
    }
}

/// Prefixes of the settings the file may put into criu's environment.
const EXPORTED: [&str; 5] = ["CRIU_GPU_", "CUDA_CKPT_", "CUDA_SIM_", "AMD_KFD_", "KFD_"];

/// The file's settings that the environment lacks, for [`export_file_settings`].
pub fn file_settings(file: &str, env: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    file.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, v)| !v.is_empty() && EXPORTED.iter().any(|p| k.starts_with(p)) && !env(k))
        .collect()
}

/// Exports the settings file into this (criu's) process environment. Called once, from
/// `init`, while criu runs a single thread.
pub fn export_file_settings() {
    let path = std::env::var("CRIU_GPU_CONFIG").unwrap_or_else(|_| CONFIG_FILE.into());
    let Ok(file) = std::fs::read_to_string(&path) else {
        return;
    };
    for (k, v) in file_settings(&file, |k| std::env::var_os(k).is_some()) {
        tracing::debug!("{k}={v} (from {path})");
        std::env::set_var(k, v);
    }
}

impl Config {
    /// Reads the environment, then the file for what the environment leaves unset.
    pub fn load() -> Result<Config, HookError> {
        let path = std::env::var("CRIU_GPU_CONFIG").unwrap_or_else(|_| CONFIG_FILE.into());
        let file = std::fs::read_to_string(&path).unwrap_or_default();
        Config::from_sources(|k| std::env::var(k).ok(), &file)
            .map_err(|e| HookError(format!("{e} (from the environment or {path})")))
    }

    pub fn from_sources(
        env: impl Fn(&str) -> Option<String>,
        file: &str,
    ) -> Result<Config, String> {
        let from_file = |key: &str| {
            file.lines()
                .map(|l| l.split('#').next().unwrap_or("").trim())
                .filter_map(|l| l.split_once('='))
                .find(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().to_owned())
        };
        let get = |key: &str| {
            env(key)
                .filter(|v| !v.is_empty())
                .or_else(|| from_file(key))
        };
        let mut c = Config::default();
        if let Some(v) = get("CRIU_GPU_LOCK_TIMEOUT_MS") {
            let ms: u64 = v.parse().map_err(|_| {
                format!("CRIU_GPU_LOCK_TIMEOUT_MS={v:?} is not a number of milliseconds")
            })?;
            c.lock_timeout = Duration::from_millis(ms.max(1));
        }
        if let Some(v) = get("CRIU_GPU_PARALLEL") {
            c.parallel = match v.as_str() {
                "1" | "yes" | "true" => true,
                "0" | "no" | "false" => false,
                other => return Err(format!("CRIU_GPU_PARALLEL={other:?}: use 1 or 0")),
            };
        }
        if let Some(v) = get("CRIU_GPU_DEVICE_MAP") {
            c.placement = match v.as_str() {
                "auto" => GpuPlacement::Auto,
                "same" | "" => GpuPlacement::Same,
                map => GpuPlacement::Map(
                    map.parse()
                        .map_err(|e| format!("CRIU_GPU_DEVICE_MAP: {e}"))?,
                ),
            };
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_wins_over_the_file() {
        let file = "# comment\nCRIU_GPU_LOCK_TIMEOUT_MS = 7000\nCRIU_GPU_DEVICE_MAP=auto\n";
        let c = Config::from_sources(|_| None, file).unwrap();
        assert_eq!(c.lock_timeout, Duration::from_secs(7));
        assert_eq!(c.placement, GpuPlacement::Auto);
        let c = Config::from_sources(
            |k| (k == "CRIU_GPU_LOCK_TIMEOUT_MS").then(|| "250".to_owned()),
            file,
        )
        .unwrap();
        assert_eq!(c.lock_timeout, Duration::from_millis(250));
        assert_eq!(
            Config::from_sources(|_| None, "").unwrap(),
            Config::default()
        );
    }

    #[test]
    fn the_file_fills_in_what_the_environment_lacks() {
        let file = "CUDA_CKPT_LIBCUDA=/opt/lib/libcuda.so.1\nCRIU_GPU_PARALLEL=0\nPATH=/evil\nAMD_KFD_SIM_ROOT=\n";
        let got = file_settings(file, |k| k == "CRIU_GPU_PARALLEL");
        assert_eq!(
            got,
            vec![(
                "CUDA_CKPT_LIBCUDA".to_owned(),
                "/opt/lib/libcuda.so.1".to_owned()
            )]
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_key() {
        let e = Config::from_sources(|_| None, "CRIU_GPU_LOCK_TIMEOUT_MS=soon").unwrap_err();
        assert!(e.contains("CRIU_GPU_LOCK_TIMEOUT_MS"), "{e}");
        let e = Config::from_sources(|_| None, "CRIU_GPU_DEVICE_MAP=GPU-1=GPU-2").unwrap_err();
        assert!(e.contains("CRIU_GPU_DEVICE_MAP"), "{e}");
    }
}
