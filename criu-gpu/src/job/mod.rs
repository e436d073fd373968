//! `criu-gpu dump PID DIR` and `criu-gpu restore DIR`: a GPU job outside containers (one
//! process, a process tree, the ranks of a distributed job) checkpointed and restored with the
//! installed CRIU and the plugin, with the CRIU options the job needs chosen from what it holds
//! ([`plan`]), every problem named with its fix before anything is frozen, and progress shown as
//! CRIU goes ([`progress`]). The options the restore needs are kept in the image directory
//! ([`record`]). Plain `criu dump` and `criu restore` are unchanged.

mod adopt;
pub mod cluster;
mod dump;
pub mod facts;
pub mod files;
pub mod migrate;
pub mod plan;
pub mod prefetch;
pub mod progress;
pub mod record;
mod restore;
pub mod run;
mod signals;

pub use self::dump::{action_script, dump};
pub use self::restore::{restore, RestoreHow};

use std::path::{Path, PathBuf};
use std::time::Duration;

use criu_gpu_host::settings::declared::{
    ADDRESS_MAP, CLUSTER, DEVICE_MAP, LIBCUDA, LIBNVML, MIGRATE,
};
use criu_gpu_host::settings::Settings;
use process_facts::process::{self, TcpState};
use serde::Serialize;

use self::facts::JobFacts;
use self::plan::{Plan, Problem};
use self::record::JobRecord;
use crate::out;
use criu_gpu_host::criu_bin;

/// The longest a dump or restore may run (32 GiB jobs take well under a minute on an H200).
const LIMIT: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("process {0} does not exist")]
    NoProcess(i32),
    #[error("no criu found ($CRIU, PATH, /usr/local/sbin): install it (scripts/install.sh) or name it with --criu PATH")]
    NoCriu,
    #[error("{path} is CRIU {version}; GPU jobs need CRIU 4.0 or later: install the project's CRIU (scripts/install.sh) or name it with --criu PATH")]
    OldCriu { path: String, version: String },
    #[error("{} problem(s) to fix first; nothing was done", .0.len())]
    Refused(Vec<Problem>),
    #[error("criu {phase} failed ({status}); {after}. CRIU's log: {log}{}", last_lines(.errors))]
    Failed {
        phase: &'static str,
        status: String,
        after: &'static str,
        log: String,
        errors: Vec<String>,
    },
    #[error("criu {phase} failed ({status}), and {left}. CRIU's log: {log}{}", last_lines(.errors))]
    LeftRunning {
        phase: &'static str,
        status: String,
        /// What is left, and what to do.
        left: String,
        log: String,
        errors: Vec<String>,
    },
    #[error("{0} holds no {file}: it was not made by `criu-gpu dump`; restore it with `criu restore` and the options it was dumped with", file = record::FILE)]
    NoRecord(String),
    #[error("{0}")]
    Record(#[from] criu_gpu_image::record::RecordError),
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
    #[error(transparent)]
    Migrate(#[from] migrate::MigrateError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

fn last_lines(errors: &[String]) -> String {
    let tail: Vec<&String> = errors.iter().rev().take(4).collect();
    tail.iter()
        .rev()
        .map(|l| format!("\n  {l}"))
        .collect::<String>()
}

/// What a dump or restore is asked to do.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub dir: PathBuf,
    pub dry_run: bool,
    pub criu: Option<PathBuf>,
    /// Options passed to criu as they are, after the chosen ones.
    pub extra: Vec<String>,
    /// CRIU's log at -v4 instead of -v3.
    pub verbose: bool,
    /// The plugin's settings on this node, read by the command line.
    pub settings: Settings,
}

/// What was done.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub command: Vec<String>,
    pub dry_run: bool,
    pub plan: Plan,
    pub seconds: f64,
    /// The images' size (dump) or the restored tree's root (restore).
    pub image_bytes: Option<u64>,
    pub restored_root: Option<i32>,
}

fn criu(r: &Request) -> Result<PathBuf, JobError> {
    let path = r
        .criu
        .clone()
        .or_else(crate::find_criu)
        .ok_or(JobError::NoCriu)?;
    match criu_bin::version_of(&path) {
        Some((major, _, _)) if major >= 4 => Ok(path),
        other => Err(JobError::OldCriu {
            path: path.display().to_string(),
            version: other.map_or("of an unknown version".into(), |v| v.2),
        }),
    }
}

fn verbosity(r: &Request) -> &'static str {
    if r.verbose {
        "-v4"
    } else {
        "-v3"
    }
}

fn show_plan(plan: &Plan) {
    for c in plan.common.iter().chain(&plan.dump) {
        out::line(format!("option: {} ({})", c.args.join(" "), c.why));
    }
    for n in &plan.notes {
        out::line(format!("note: {n}"));
    }
    for p in &plan.problems {
        out::line(format!("problem: {}", p.what));
        if !p.fix.is_empty() {
            out::line(format!("  fix: {}", p.fix));
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The NVML library the settings name (else the system's).
fn libnvml(settings: &Settings) -> Option<String> {
    settings.get(&LIBNVML).ok().flatten()
}

/// Says the plan; refuses it when it has problems, before anything is done.
fn show_or_refuse(plan: Plan) -> Result<Plan, JobError> {
    show_plan(&plan);
    if plan.problems.is_empty() {
        Ok(plan)
    } else {
        Err(JobError::Refused(plan.problems))
    }
}

/// CRIU and its arguments: the command as said and as reported.
fn full_command(criu: &Path, args: &[String]) -> Vec<String> {
    let mut command = vec![criu.display().to_string()];
    command.extend(args.iter().cloned());
    command
}

/// A dry run: says the command and does nothing.
fn would_run(command: Vec<String>, plan: Plan) -> Outcome {
    out::line(format!("would run: {}", command.join(" ")));
    Outcome {
        command,
        dry_run: true,
        plan,
        seconds: 0.0,
        image_bytes: None,
        restored_root: None,
    }
}

/// `--action-script` naming this criu-gpu, which CRIU then runs at each of its steps (the job's
/// files recorded while it is frozen, the barriers of jobs across machines and moves).
pub(super) fn action_script_args() -> Result<[String; 2], JobError> {
    let me = std::env::current_exe().map_err(|source| JobError::Io {
        what: "finding criu-gpu's own path for CRIU's action script".into(),
        source,
    })?;
    Ok(["--action-script".into(), me.display().to_string()])
}
