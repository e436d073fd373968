//! `criu-gpu restore`: what stands in the way on this host (pids, ports, changed files, GPUs)
//! named before anything starts, the files that only grew cut back, CRIU run.

use super::*;

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

/// The plugin's setting for a restore that moves the job's connections.
pub(super) fn address_map_env(map: &criu_gpu_image::addrmap::AddressMap) -> (String, String) {
    (ADDRESS_MAP.key.to_owned(), map.to_string())
}

/// A restore that moves connections needs CRIU's UPDATE_INETSK hook (patch 0012): `criu check
/// --feature update_inetsk` says so (a wrapper script passes it on); builds of the patch from
/// before that feature are known by `criu_plugin_max_hooks` in the binary's dynamic symbols.
/// Stock CRIU 4.2.1 has neither.
pub(super) fn address_map_problem(
    criu: &Path,
    map: &criu_gpu_image::addrmap::AddressMap,
) -> Option<Problem> {
    let symbol: &[u8] = b"criu_plugin_max_hooks";
    let has = criu_bin::has_feature(criu, "update_inetsk")
        || std::fs::read(criu).is_ok_and(|b| b.windows(symbol.len()).any(|w| w == symbol));
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
pub(super) fn device_map_env(how: &RestoreHow) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if let Some(map) = &how.device_map {
        env.push((DEVICE_MAP.key.to_owned(), map.clone()));
    }
    env
}

/// The settings the plugin will read in a restore: this node's, and the map it is given.
pub(super) fn with_device_map(how: &RestoreHow, settings: &Settings) -> Settings {
    match &how.device_map {
        Some(map) => settings.clone().with(&DEVICE_MAP, map, "--device-map"),
        None => settings.clone(),
    }
}

/// What stands in the way of the restore: pids and ports, changed files, this node's GPUs.
pub(super) fn restore_plan(
    rec: &JobRecord,
    how: &RestoreHow,
    dir: &Path,
    settings: &Settings,
) -> Plan {
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
pub(super) fn work_dir(how: &RestoreHow, r: &Request) -> Result<PathBuf, JobError> {
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
pub(super) fn restore_args(rec: &JobRecord, r: &Request, work: &Path) -> Vec<String> {
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
pub(super) fn cut_back_grown(dir: &Path) -> Result<(), JobError> {
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
pub(super) fn run_restore(
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
