//! `criu-gpu dump`: the job read, its plan said (or refused), CRIU run, the record a restore
//! reads written, and CRIU's network lock taken back; and `criu-gpu` as CRIU's action script.

use super::*;

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
pub(super) fn read_job(pid: i32, settings: &Settings) -> Result<JobFacts, JobError> {
    let mut facts = JobFacts::read(pid).ok_or(JobError::NoProcess(pid))?;
    facts.confirm_cuda(settings.get(&LIBCUDA).ok().flatten().as_deref());
    facts.read_device_memory(libnvml(settings).as_deref());
    Ok(facts)
}

/// The options the job needs; a network lock only when it has connections to keep.
pub(super) fn dump_plan(facts: &JobFacts, criu: &Path) -> Plan {
    let lock = if facts.established().next().is_some() {
        criu_gpu_host::netlock::NodeLocks::probe(criu).choose()
    } else {
        None
    };
    Plan::make(facts, lock, ring_support(criu))
}

/// CRIU's arguments for the dump (without CRIU itself).
pub(super) fn dump_args(
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
    args.extend(action_script_args()?);
    args.extend(r.extra.iter().cloned());
    Ok(args)
}

/// Runs CRIU's dump into `dir`; its failure leaves the job running (the plugin puts it back).
pub(super) fn run_dump(
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
pub(super) fn record_before_criu(
    pid: i32,
    facts: &JobFacts,
    plan: &Plan,
    dir: &Path,
) -> Result<(), JobError> {
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
pub(super) fn say_files_recorded(dir: &Path) {
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
pub(super) fn release_network_lock(dir: &Path) {
    use criu_gpu_host::netlock::{release_dumped, Released};
    match release_dumped(dir) {
        r @ Released::Removed { .. } => out::line(format!("network: {r}")),
        r if r.worth_saying() => out::line(format!("warning: {r}")),
        _ => {}
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

/// What the CRIU at `criu` does with io_uring rings: the project's CRIU answers `criu check
/// --feature io_uring` (patch 0008); stock CRIU knows no such feature.
fn ring_support(criu: &Path) -> process_facts::refusal::RingSupport {
    if criu_bin::has_feature(criu, "io_uring") {
        process_facts::refusal::RingSupport::Idle
    } else {
        process_facts::refusal::RingSupport::None
    }
}
