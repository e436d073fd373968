//! The plugin's settings, and the tools'. CRIU passes no options to plugins, so they come from
//! the environment of the `criu` process or, for container runtimes that do not pass it on, from
//! a file (`/etc/criu/gpu-plugin.conf`, or `CRIU_GPU_CONFIG`) holding `KEY=VALUE` lines; `#`
//! starts a comment; the environment wins.
//!
//! The edge reads them once ([`Settings::load`]: the plugin's `init`, a tool's command) and passes
//! `&Settings` down; nothing below it reads the environment. Every setting is declared once
//! ([`declared`]: key, meaning, default, how it is read) and read through its typed accessor,
//! [`Settings::get`]. Nothing is checked when the file is read, because every CRIU run on a node
//! reads it, dumps of trees without GPUs too: a command reads the settings it uses before it
//! changes anything, and a bad value is refused then, with its key, where it came from, what it
//! takes and its default. Keys the plugin does not know are reported once, as a warning.
//!
//! The file may also hold the simulated driver's own variables (`CUDA_SIM_*`): the simulated
//! driver reads them there itself. Nothing is put into any process's environment.

pub mod declared;
mod parse;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use amd_kfd::device::Kfd;
use amd_kfd::topology::Checks;

pub use self::declared::{Row, Setting, ALL};
pub use self::parse::switch;

pub const CONFIG_FILE: &str = "/etc/criu/gpu-plugin.conf";
pub const CONFIG_ENV: &str = "CRIU_GPU_CONFIG";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Environment,
    File(String),
    /// A tool's command line (`--device-map`).
    Option(&'static str),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Environment => f.write_str("the environment of criu"),
            Source::File(p) => f.write_str(p),
            Source::Option(o) => write!(f, "the option {o}"),
        }
    }
}

/// A value a setting does not take: what it takes, and how to put it right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{key}={value:?} (from {from}) is not a value it takes: {expected}; correct it there, or \
     remove it for the default ({default})"
)]
pub struct SettingsError {
    pub key: &'static str,
    pub value: String,
    pub from: Source,
    pub expected: String,
    pub default: &'static str,
}

/// The settings of one command, as read; each is parsed when asked for.
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

/// Whether `key` is one the settings read from the environment: a declared one, or one of the
/// plugin's prefix (an unknown one is warned of).
fn ours(key: &str) -> bool {
    key.starts_with("CRIU_GPU_") || ALL.iter().any(|r| r.key == key)
}

impl Settings {
    /// Reads the environment and the settings file: the edge's one read. Never fails: an
    /// unreadable file is only mentioned.
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
        let env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| ours(k)).collect();
        let s = Settings::from_sources(&env, &file, &path);
        s.warn_unknown();
        s
    }

    /// From the environment's variables and the text of the settings file at `path`.
    pub fn from_sources(env: &[(String, String)], file: &str, path: &str) -> Settings {
        let mut values = BTreeMap::new();
        for (k, v) in file_lines(file).filter(|(k, v)| !v.is_empty() && ours(k)) {
            values.insert(k, (v, Source::File(path.to_owned())));
        }
        for (k, v) in env.iter().filter(|(k, v)| !v.is_empty() && ours(k)) {
            values.insert(k.clone(), (v.clone(), Source::Environment));
        }
        Settings { values }
    }

    /// The same settings with `key` set to `value` by a tool's option (which wins).
    pub fn with<T>(mut self, s: &Setting<T>, value: &str, option: &'static str) -> Settings {
        self.values
            .insert(s.key.to_owned(), (value.to_owned(), Source::Option(option)));
        self
    }

    /// The value of setting `s`: as set, or its default.
    pub fn get<T>(&self, s: &Setting<T>) -> Result<T, SettingsError> {
        let Some((v, src)) = self.values.get(s.key) else {
            return Ok((s.value)());
        };
        (s.parse)(v).map_err(|expected| SettingsError {
            key: s.key,
            value: v.clone(),
            from: src.clone(),
            expected,
            default: s.default,
        })
    }

    /// The `KFD_*_CHECK` switches, as amd-kfd's checks.
    pub fn kfd_checks(&self) -> Result<Checks, SettingsError> {
        let mut c = Checks::default();
        for (setting, check) in declared::KFD_CHECKS {
            *check(&mut c) = self.get(setting)?;
        }
        Ok(c)
    }

    /// This machine's KFD: the simulated one a test build's `AMD_KFD_SIM_ROOT` names, else the
    /// kernel's, if there is one.
    pub fn kfd(&self) -> Option<Box<dyn Kfd>> {
        #[cfg(feature = "simulation")]
        if let Ok(Some(root)) = self.get(&declared::AMD_KFD_SIM_ROOT) {
            return Some(Box::new(amd_kfd::device::sim::SimKfd::new(root)));
        }
        amd_kfd::device::detect()
    }

    /// Keys with the plugin's prefix that it does not know: a typo, reported once per run.
    pub fn unknown(&self) -> Vec<(&str, &Source)> {
        self.values
            .iter()
            .filter(|(k, _)| !ALL.iter().any(|r| r.key == k.as_str()))
            .map(|(k, (_, src))| (k.as_str(), src))
            .collect()
    }

    fn warn_unknown(&self) {
        for (k, src) in self.unknown() {
            let known: Vec<&str> = ALL.iter().map(|r| r.key).collect();
            tracing::warn!(
                "unknown setting {k} in {src} is ignored (known: {})",
                known.join(", ")
            );
        }
    }
}
