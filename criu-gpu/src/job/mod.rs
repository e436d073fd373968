//! `criu-gpu dump PID DIR` and `criu-gpu restore DIR`: a GPU job outside containers (one
//! process, a process tree, the ranks of a distributed job) checkpointed and restored with the
//! installed CRIU and the plugin, with the CRIU options the job needs chosen from what it holds
//! ([`plan`]), every problem named with its fix before anything is frozen, and progress shown as
//! CRIU goes ([`progress`]). The options the restore needs are kept in the image directory
//! ([`record`]). Plain `criu dump` and `criu restore` are unchanged.

mod adopt;
pub mod cluster;
pub mod facts;
pub mod files;
pub mod migrate;
pub mod plan;
pub mod prefetch;
pub mod progress;
pub mod record;
pub mod run;
mod signals;

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
use crate::{criu_bin, out};

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
        .or_else(criu_bin::find_criu)
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

/// Dumps the job rooted at `pid` into `r.dir` (killing it, unless `leave_running`).
pub fn dump(pid: i32, leave_running: bool, r: &Request) -> Result<Outcome, JobError> {
    let criu = criu(r)?;
    let facts = read_job(pid, &r.settings)?;
    let plan = show_or_refuse(dump_plan(&facts, &criu))?;
    let args = dump_args(pid, leave_running, r, &plan)?;
    let command = full_command(&criu, &args);
    if r.dry_run {
        return Ok(would_run(command, plan));
    }
    record_before_criu(pid, &facts, &plan, &r.dir)?;
    let ran = run_dump(&criu, &args, &[], &command, &r.dir)?;
    if !leave_running && plan.dump_args().iter().any(|a| a == "--network-lock") {
        release_network_lock(&r.dir);
    }
    say_files_recorded(&r.dir);
    let bytes = dir_bytes(&r.dir);
    out::line(format!(
        "dumped {} process(es) into {} in {:.1} s: {} of images ({})",
        facts.members.len(),
        r.dir.display(),
        ran.took.as_secs_f64(),
        crate::human::bytes(bytes),
        crate::human::gbps(bytes, ran.took)
    ));
    Ok(Outcome {
        command,
        dry_run: false,
        plan,
        seconds: ran.took.as_secs_f64(),
        image_bytes: Some(bytes),
        restored_root: None,
    })
}

/// The job's processes, with which of them hold CUDA state confirmed, and their device memory.
fn read_job(pid: i32, settings: &Settings) -> Result<JobFacts, JobError> {
    let mut facts = JobFacts::read(pid).ok_or(JobError::NoProcess(pid))?;
    facts.confirm_cuda(settings.get(&LIBCUDA).ok().flatten().as_deref());
    facts.read_device_memory(libnvml(settings).as_deref());
    Ok(facts)
}

/// The NVML library the settings name (else the system's).
fn libnvml(settings: &Settings) -> Option<String> {
    settings.get(&LIBNVML).ok().flatten()
}

/// The options the job needs; a network lock only when it has connections to keep.
fn dump_plan(facts: &JobFacts, criu: &Path) -> Plan {
    let lock = if facts.established().next().is_some() {
        criu_gpu_host::netlock::NodeLocks::probe(criu).choose()
    } else {
        None
    };
    Plan::make(facts, lock, ring_support(criu))
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

/// CRIU's arguments for the dump (without CRIU itself).
fn dump_args(
    pid: i32,
    leave_running: bool,
    r: &Request,
    plan: &Plan,
) -> Result<Vec<String>, JobError> {
    let mut args: Vec<String> = ["dump", "-t", &pid.to_string(), "-D"]
        .map(str::to_owned)
        .to_vec();
    args.push(r.dir.display().to_string());
    args.extend([verbosity(r), "-o", "dump.log"].map(str::to_owned));
    args.extend(plan.dump_args());
    if leave_running {
        args.push("--leave-running".into());
    }
    // The job's files, recorded while it is frozen, for a restore after it went on (files.rs):
    // CRIU runs criu-gpu itself as its action script.
    let me = std::env::current_exe().map_err(|source| JobError::Io {
        what: "finding criu-gpu's own path for CRIU's action script".into(),
        source,
    })?;
    args.push("--action-script".into());
    args.push(me.display().to_string());
    args.extend(r.extra.iter().cloned());
    Ok(args)
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

/// Runs CRIU's dump into `dir`; its failure leaves the job running (the plugin puts it back).
fn run_dump(
    criu: &Path,
    args: &[String],
    env: &[(String, String)],
    command: &[String],
    dir: &Path,
) -> Result<run::Ran, JobError> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |source| JobError::Io { what, source }
    };
    out::line(format!("running: {}", command.join(" ")));
    let ran = run::criu(criu, args, env, &dir.join("dump.log"), "dumping", LIMIT)
        .map_err(io("running criu"))?;
    if !ran.ok {
        return Err(JobError::Failed {
            phase: "dump",
            status: ran.status,
            after: "the job's processes are left running as they were: the plugin puts their \
                    GPU state back",
            log: dir.join("dump.log").display().to_string(),
            errors: ran.errors,
        });
    }
    Ok(ran)
}

/// The record a restore reads: the job's processes, listeners and the options to restore with.
/// Makes the image directory and records the job in it, before CRIU runs: a CRIU killed once
/// it has begun to end the dumped tree leaves complete images, which restore with this record
/// (a failed dump's images are refused by CRIU's own checks).
fn record_before_criu(pid: i32, facts: &JobFacts, plan: &Plan, dir: &Path) -> Result<(), JobError> {
    std::fs::create_dir_all(dir).map_err(|source| JobError::Io {
        what: "creating the image directory".into(),
        source,
    })?;
    record_job(pid, facts, plan, dir)
}

fn record_job(pid: i32, facts: &JobFacts, plan: &Plan, dir: &Path) -> Result<(), JobError> {
    JobRecord {
        root: pid,
        members: facts
            .members
            .iter()
            .map(|m| (m.pid, m.starttime, m.comm.clone()))
            .collect(),
        listeners: facts.listeners(),
        restore_args: plan.restore_args(),
        dumped_at: now(),
    }
    .write(dir)?;
    Ok(())
}

/// Whether the action script recorded the job's files (a restore after they changed needs it).
fn say_files_recorded(dir: &Path) {
    match files::FilesRecord::read(dir) {
        Ok(Some(f)) => out::line(format!(
            "recorded the job's {} open file(s) for a later restore ({} hashed in {:.3} s while \
             the job was frozen)",
            f.files.len(),
            crate::human::bytes(f.hashed_bytes),
            f.hash_seconds
        )),
        _ => out::line(
            "warning: the job's open files were not recorded (see CRIU's log): a restore after \
             they changed names them but cannot cut them back",
        ),
    }
}

/// CRIU keeps the job's connections locked after a dump that ended the tasks, for their restore
/// (a table of drop rules that outlives the dump). The connections were all between the job's own
/// processes, which are gone and restored together: the lock is taken back now, so that nothing
/// of the dump stays in the node's firewall (the restore takes it again for its time).
fn release_network_lock(dir: &Path) {
    let id = match criu_gpu_image::criu_image::dump_run_id(dir) {
        Ok(Some(id)) => id,
        _ => {
            out::line("warning: no CRIU run id in the images: the network lock was not looked at");
            return;
        }
    };
    let table = criu_gpu_host::netlock::table(&id);
    match criu_gpu_host::netlock::unlock(&id) {
        Ok(criu_gpu_host::netlock::Unlocked::Removed) => out::line(format!(
            "network: took back CRIU's lock of the job's connections ({table})"
        )),
        Ok(criu_gpu_host::netlock::Unlocked::NotLocked) => {}
        Err(e) => out::line(format!(
            "warning: CRIU's lock of the job's connections ({table}) could not be taken back: {e}; \
             `nft delete table {table}` removes it"
        )),
    }
}

/// `criu-gpu` as CRIU's action script (`action` from CRTOOLS_SCRIPT_ACTION): at post-dump, while
/// the job is frozen, records the job's files in the image directory (CRTOOLS_IMAGE_DIR); what
/// it cannot record is said on stderr (CRIU's) and left out. For a job across machines
/// (`CRIU_GPU_CLUSTER` in CRIU's environment, read with `settings`) it then waits at the barrier
/// of post-dump or post-restore until every node is there; `false` (the dump or restore fails,
/// on every node) when the job cannot go on.
pub fn action_script(action: &str, settings: &Settings) -> bool {
    // A move needs no record of the job's files (it is not a snapshot to go back to): no
    // hashing while the job is frozen.
    if let Ok(Some(socket)) = settings.get(&MIGRATE) {
        return migrate::action_script(&socket, action);
    }
    if action == "post-dump" {
        record_files();
    }
    let Ok(Some(socket)) = settings.get(&CLUSTER) else {
        return true;
    };
    if !matches!(action, "post-dump" | "post-restore") {
        return true;
    }
    match cluster::serve::barrier(&socket, action) {
        Ok(()) => true,
        Err(why) => {
            eprintln!("criu-gpu: the job's nodes did not all reach {action}: {why}");
            false
        }
    }
}

fn record_files() {
    let Some(dir) = std::env::var_os("CRTOOLS_IMAGE_DIR").map(PathBuf::from) else {
        eprintln!("criu-gpu: no CRTOOLS_IMAGE_DIR: the job's files were not recorded");
        return;
    };
    match files::record(&dir) {
        Ok(rec) => eprintln!(
            "criu-gpu: recorded the job's {} file(s) for a later restore ({} hashed in {:.3} s \
             while the job was frozen)",
            rec.files.len(),
            crate::human::bytes(rec.hashed_bytes),
            rec.hash_seconds
        ),
        Err(e) => eprintln!("criu-gpu: the job's files were not recorded: {e}"),
    }
}

/// The files the job had open that changed since the snapshot: a problem each, unless it only
/// grew and `truncate` lets it be cut back.
fn file_problems(dir: &Path, truncate: bool, plan: &mut Plan) {
    let changes = match files::changes(dir) {
        Ok(c) => c,
        Err(e) => {
            plan.problems.push(Problem {
                what: format!("the record of the job's files cannot be read: {e}"),
                fix: String::new(),
            });
            return;
        }
    };
    for (path, change) in changes {
        let what = change.describe(&path);
        if change.can_cut_back() && truncate {
            plan.notes
                .push(format!("{what}: cut back to its size at the snapshot"));
        } else if change.can_cut_back() {
            let why = match change {
                files::Change::Grew { appended: true, .. } => "",
                _ => " (CRIU restores a file only at that size)",
            };
            plan.problems.push(Problem {
                what,
                fix: format!(
                    "its first bytes are as they were: `criu-gpu restore --truncate-grown` cuts \
                     it back to its size at the snapshot{why}"
                ),
            });
        } else {
            plan.problems.push(Problem {
                what,
                fix: "put the file back as it was at the snapshot: CRIU restores the job only \
                      with its files as they were"
                    .into(),
            });
        }
    }
}

/// What the CRIU at `criu` does with io_uring rings: the project's CRIU answers `criu check
/// --feature io_uring` (patch 0008); stock CRIU knows no such feature.
fn ring_support(criu: &Path) -> process_facts::refusal::RingSupport {
    if criu_bin::has_feature(criu, "io_uring") {
        process_facts::refusal::RingSupport::Idle
    } else {
        process_facts::refusal::RingSupport::None
    }
}

/// The plugin's setting for a restore that moves the job's connections.
fn address_map_env(map: &criu_gpu_image::addrmap::AddressMap) -> (String, String) {
    (ADDRESS_MAP.key.to_owned(), map.to_string())
}

/// A restore that moves connections needs CRIU's UPDATE_INETSK hook (patch 0012), which only a
/// CRIU that exports `criu_plugin_max_hooks` offers the plugin: its name is in the binary's
/// dynamic symbols (stock CRIU 4.2.1 has neither, and no `criu check` feature tells).
fn address_map_problem(criu: &Path, map: &criu_gpu_image::addrmap::AddressMap) -> Option<Problem> {
    let symbol: &[u8] = b"criu_plugin_max_hooks";
    let has = std::fs::read(criu).is_ok_and(|b| b.windows(symbol.len()).any(|w| w == symbol));
    (!has).then(|| Problem {
        what: format!(
            "the job's connections must move ({map}), and {} cannot move them: it lacks the \
             UPDATE_INETSK plugin hook",
            criu.display()
        ),
        fix: "install the project's CRIU (scripts/install.sh; patch 0012 of third_party/criu) or \
              name it with --criu PATH"
            .into(),
    })
}

/// What stops a restore of `rec` on this host: pids and listening addresses in use.
fn restore_problems(rec: &JobRecord) -> Vec<Problem> {
    let mut problems = Vec::new();
    // The processes of a dump that just ended may still be on their way out.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rec.members.iter().any(|(p, _, _)| process::exists(*p))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (pid, started, comm) in &rec.members {
        if !process::exists(*pid) {
            continue;
        }
        let (what, fix) = if process::starttime(*pid) == Some(*started) {
            (
                format!("process {pid} ({comm}) of the dumped job still runs"),
                "stop the job first (a dump with --leave-running leaves it running): CRIU \
                 restores processes with their pids",
            )
        } else {
            (
                format!(
                    "pid {pid} ({comm} in the job) is taken by another process ({})",
                    process::name(*pid)
                ),
                "CRIU restores processes with their pids: wait for that process to end, or \
                 restore in a new pid namespace (a container)",
            )
        };
        problems.push(Problem {
            what,
            fix: fix.into(),
        });
    }
    let me = std::process::id() as i32;
    for addr in &rec.listeners {
        // CRIU binds with SO_REUSEADDR and SO_REUSEPORT: only another listener is in the way
        // (connections in TIME_WAIT after a failed restore are not).
        let taken = process::tcp_sockets(me).into_iter().find(|s| {
            s.state == TcpState::Listen
                && s.local.port() == addr.port()
                && (s.local.ip() == addr.ip()
                    || s.local.ip().is_unspecified()
                    || addr.ip().is_unspecified())
        });
        if let Some(s) = taken {
            problems.push(Problem {
                what: format!(
                    "the job listened on {addr}, and {} holds {} now",
                    holder(s.inode),
                    s.local
                ),
                fix: "stop that process, or wait for it to let the port go".into(),
            });
        }
    }
    problems
}

fn holder(inode: u64) -> String {
    process::all_pids()
        .into_iter()
        .find(|p| process::socket_inodes(*p).contains(&inode))
        .map_or("another process".into(), |p| {
            format!("process {p} ({})", process::name(p))
        })
}

/// How a restore treats what changed since the dump.
#[derive(Debug, Clone, Default)]
pub struct RestoreHow {
    /// Onto other GPUs: OLD=NEW[,...] or `auto`.
    pub device_map: Option<String>,
    /// Onto other addresses: the job's connections moved, both ends.
    pub address_map: Option<criu_gpu_image::addrmap::AddressMap>,
    /// Cut files that only grew since the snapshot back to their size then.
    pub truncate_grown: bool,
    /// Do not read the pages images ahead while CRIU starts ([`prefetch`]).
    pub no_prefetch: bool,
    /// CRIU's --work-dir (None: a new one in the system's temporary directory).
    pub work_dir: Option<PathBuf>,
}

/// Restores the job dumped into `r.dir`.
pub fn restore(how: &RestoreHow, r: &Request) -> Result<Outcome, JobError> {
    let criu = criu(r)?;
    let rec =
        JobRecord::read(&r.dir)?.ok_or_else(|| JobError::NoRecord(r.dir.display().to_string()))?;
    let mut env = device_map_env(how);
    let mut plan = restore_plan(&rec, how, &r.dir, &r.settings);
    if let Some(map) = how.address_map.as_ref().filter(|m| !m.is_empty()) {
        plan.problems.extend(address_map_problem(&criu, map));
        env.push(address_map_env(map));
    }
    let work = work_dir(how, r)?;
    let args = restore_args(&rec, r, &work);
    let plan = show_or_refuse(plan)?;
    let command = full_command(&criu, &args);
    if r.dry_run {
        return Ok(would_run(command, plan));
    }
    if how.truncate_grown {
        cut_back_grown(&r.dir)?;
    }
    out::line(format!(
        "the restore writes into {} (CRIU's log, the GPU timings); the images are left as they were",
        work.display()
    ));
    let ahead = if how.no_prefetch {
        None
    } else {
        prefetch::start(&r.dir)
    };
    let ran = run_restore(&criu, &args, &env, &command, &work);
    if let Some(p) = ahead.map(prefetch::Prefetch::finish) {
        out::line(format!(
            "read ahead {} of pages images from the disk while CRIU restored",
            crate::human::bytes(p.bytes)
        ));
    }
    let ran = ran?;
    let root = std::fs::read_to_string(work.join("restore.pid"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    out::line(format!(
        "restored {} process(es) in {:.1} s{}",
        rec.members.len(),
        ran.took.as_secs_f64(),
        root.map_or(String::new(), |p: i32| format!(
            "; the job's root is pid {p}"
        ))
    ));
    Ok(Outcome {
        command,
        dry_run: false,
        plan,
        seconds: ran.took.as_secs_f64(),
        image_bytes: None,
        restored_root: root,
    })
}

/// The plugin's environment for a restore onto other GPUs.
fn device_map_env(how: &RestoreHow) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if let Some(map) = &how.device_map {
        env.push((DEVICE_MAP.key.to_owned(), map.clone()));
    }
    env
}

/// The settings the plugin will read in a restore: this node's, and the map it is given.
fn with_device_map(how: &RestoreHow, settings: &Settings) -> Settings {
    match &how.device_map {
        Some(map) => settings.clone().with(&DEVICE_MAP, map, "--device-map"),
        None => settings.clone(),
    }
}

/// What stands in the way of the restore: pids and ports, changed files, this node's GPUs.
fn restore_plan(rec: &JobRecord, how: &RestoreHow, dir: &Path, settings: &Settings) -> Plan {
    let mut plan = Plan {
        common: Vec::new(),
        dump: Vec::new(),
        problems: restore_problems(rec),
        notes: Vec::new(),
    };
    file_problems(dir, how.truncate_grown, &mut plan);
    if let Err(e) = criu_gpu_host::restore_check::check(dir, false, &with_device_map(how, settings))
    {
        plan.problems.push(Problem {
            what: e.to_string(),
            fix: String::new(),
        });
    }
    if !rec.restore_args.is_empty() {
        plan.notes.push(format!(
            "restore options as dumped: {}",
            rec.restore_args.join(" ")
        ));
    }
    plan
}

/// Where the restore writes, made if it is not there: never the image directory, which a
/// restore leaves as it was (and which may be read-only, a mounted checkpoint image).
fn work_dir(how: &RestoreHow, r: &Request) -> Result<PathBuf, JobError> {
    let io = |source| JobError::Io {
        what: "making the restore's work directory".into(),
        source,
    };
    let name = r
        .dir
        .file_name()
        .map_or("job".into(), |n| n.to_string_lossy());
    let prefix = format!("criu-gpu-restore.{name}.");
    match &how.work_dir {
        Some(d) if r.dry_run => Ok(d.clone()),
        Some(d) => {
            std::fs::create_dir_all(d).map_err(io)?;
            Ok(d.clone())
        }
        // A dry run makes nothing: the name is what a restore would make.
        None if r.dry_run => Ok(std::env::temp_dir().join(format!("{prefix}XXXXXX"))),
        None => {
            let d = tempfile::Builder::new()
                .prefix(&prefix)
                .tempdir()
                .map_err(io)?;
            Ok(d.keep())
        }
    }
}

/// CRIU's arguments for the restore (without CRIU itself): the options the job was dumped with.
fn restore_args(rec: &JobRecord, r: &Request, work: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec!["restore".into(), "-D".into(), r.dir.display().to_string()];
    args.extend(["--work-dir".into(), work.display().to_string()]);
    args.extend(
        [
            "-d",
            "--pidfile",
            "restore.pid",
            verbosity(r),
            "-o",
            "restore.log",
        ]
        .map(str::to_owned),
    );
    args.extend(rec.restore_args.iter().cloned());
    args.extend(r.extra.iter().cloned());
    args
}

/// Cuts the files that only grew since the snapshot back to their size then.
fn cut_back_grown(dir: &Path) -> Result<(), JobError> {
    let cut = files::cut_back(dir).map_err(|e| JobError::Io {
        what: "cutting the job's files back".into(),
        source: std::io::Error::other(e),
    })?;
    for (path, change) in cut {
        if let files::Change::Grew { from, to, .. } = change {
            out::line(format!(
                "cut {} back from {to} to {from} bytes",
                path.display()
            ));
        }
    }
    Ok(())
}

/// Runs CRIU's restore, writing into `dir` (its work directory); its failure leaves nothing
/// running and the images as they were, or says which processes of the restore run on.
fn run_restore(
    criu: &Path,
    args: &[String],
    env: &[(String, String)],
    command: &[String],
    dir: &Path,
) -> Result<run::Ran, JobError> {
    out::line(format!("running: {}", command.join(" ")));
    // The pid file CRIU writes is how the restored root is found: none is left from before.
    let _ = std::fs::remove_file(dir.join("restore.pid"));
    let guardian_from = adopt::guardian_log_end(dir);
    // What a killed CRIU forked comes to this process, to be seen.
    let adopter = adopt::adopt();
    let ran = run::criu(
        criu,
        args,
        env,
        &dir.join("restore.log"),
        "restoring",
        LIMIT,
    )
    .map_err(|source| JobError::Io {
        what: "running criu".into(),
        source,
    })?;
    if ran.ok {
        return Ok(ran);
    }
    let left = adopter.left(criu, ran.program.as_deref());
    let guardian = adopt::guardian_lines(dir, guardian_from);
    for line in &guardian {
        out::line(format!("the plugin's guardian: {line}"));
    }
    let log = dir.join("restore.log").display().to_string();
    let after = match left {
        adopt::Left::Nothing { ended } => {
            if !ended.is_empty() {
                out::line(format!(
                    "ended what the failed CRIU had left, which could not go on without it (its \
                     helpers, tasks it had not made the job's yet): {}",
                    named(&ended)
                ));
            }
            "nothing of the job was left running and the images are unchanged: fix the cause \
             and run criu-gpu restore again"
        }
        adopt::Left::Unknown => {
            "the plugin's guardian kills what CRIU had restored, and the images are unchanged: \
             check that no process of the job runs, fix the cause and run criu-gpu restore again"
        }
        adopt::Left::Job(job) => {
            return Err(left_running(ran, log, left_the_job(&job, &guardian)));
        }
        adopt::Left::Stuck(stuck) => {
            return Err(left_running(ran, log, left_stuck(&stuck, &guardian)));
        }
    };
    Err(JobError::Failed {
        phase: "restore",
        status: ran.status,
        after,
        log,
        errors: ran.errors,
    })
}

fn left_running(ran: run::Ran, log: String, left: String) -> JobError {
    JobError::LeftRunning {
        phase: "restore",
        status: ran.status,
        left,
        log,
        errors: ran.errors,
    }
}

/// A restore killed once the job was back: its processes run on.
fn left_the_job(left: &[(i32, String)], guardian: &[String]) -> String {
    let said = guardian.last().map_or(
        "the plugin's guardian had let them go (it kills a restored tree only before its GPU \
         state is back)"
            .to_owned(),
        |l| format!("the plugin's guardian: {l}"),
    );
    format!(
        "processes of the restore run on: {}; {said}. The images are unchanged. Those processes \
         run the job without CRIU's last steps (its post-resume scripts): keep them, or end them \
         (kill -9 {}) before restoring again",
        named(left),
        pids(left)
    )
}

/// Processes that still run CRIU's program (or do not end), long after it ended, beside the
/// job's.
fn left_stuck(left: &[(i32, String)], guardian: &[String]) -> String {
    let said = guardian.last().map_or(
        "the plugin's guardian said nothing of them".to_owned(),
        |l| format!("the plugin's guardian: {l}"),
    );
    format!(
        "processes of the restore still run CRIU's program (or do not end), {} s after it \
         ended: {}; {said}. The images are unchanged: end them and what runs of the job (kill \
         -9 {}) and run criu-gpu restore again",
        adopt::SETTLE_LIMIT.as_secs(),
        named(left),
        pids(left)
    )
}

fn named(list: &[(i32, String)]) -> String {
    let each: Vec<String> = list.iter().map(|(p, n)| format!("{p} ({n})")).collect();
    each.join(", ")
}

fn pids(list: &[(i32, String)]) -> String {
    let each: Vec<String> = list.iter().map(|(p, _)| p.to_string()).collect();
    each.join(" ")
}
