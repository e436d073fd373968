//! Command-line parsing and output.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Parser, ValueEnum};
use serde_json::json;

use cuda_checkpoint_ctl::driver::{Call, DeviceMap, Driver, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;
use cuda_checkpoint_ctl::ops::{self, Goal, Options, Outcome};
use cuda_checkpoint_ctl::process::{self, Selector};
use cuda_checkpoint_ctl::Error;

const AFTER_HELP: &str = "\
Compatible with NVIDIA's cuda-checkpoint: with --pid, the operations print the same words and
exit with the same status (0, or the CUDA error code). --tree, --cgroup and --all act on every
CUDA process found there, concurrently; a --suspend or --toggle that fails for one of them puts
the others back (unless --no-rollback).

Environment: CUDA_CKPT_LIBCUDA and CUDA_CKPT_LIBNVML name the driver and NVML libraries
(defaults libcuda.so.1 and libnvidia-ml.so.1).";

#[derive(Parser, Debug)]
#[command(
    name = "cuda-checkpoint-ctl",
    version,
    about = "CUDA checkpoint and restore utility (cuda-checkpoint compatible)",
    after_help = AFTER_HELP
)]
#[command(group(
    ArgGroup::new("operation")
        .required(true)
        .args(["get_state", "action", "toggle", "get_restore_tid", "suspend", "resume", "recover", "list", "gpus"])
))]
#[command(group(ArgGroup::new("target").args(["pid", "tree", "cgroup", "all"])))]
struct Args {
    /// Print the checkpoint state (running, locked, checkpointed, failed).
    #[arg(long)]
    get_state: bool,
    /// Perform one driver action.
    #[arg(long, value_enum, value_name = "ACTION")]
    action: Option<ActionArg>,
    /// Toggle between running and checkpointed.
    #[arg(long)]
    toggle: bool,
    /// Print the CUDA restore thread id.
    #[arg(long)]
    get_restore_tid: bool,
    /// Lock and checkpoint (running -> checkpointed); undone if the checkpoint fails.
    #[arg(long)]
    suspend: bool,
    /// Restore and unlock (checkpointed -> running).
    #[arg(long)]
    resume: bool,
    /// Bring locked or checkpointed processes back to running (e.g. after CRIU was killed).
    #[arg(long)]
    recover: bool,
    /// List CUDA processes with state and GPU memory (all processes unless a target is given).
    #[arg(long)]
    list: bool,
    /// Show the GPUs of this machine (NVML).
    #[arg(long)]
    gpus: bool,

    /// The process to act on.
    #[arg(short, long)]
    pid: Option<i32>,
    /// A process and all its descendants.
    #[arg(long, value_name = "PID")]
    tree: Option<i32>,
    /// Every process of a cgroup (absolute, or relative to /sys/fs/cgroup).
    #[arg(long, value_name = "PATH")]
    cgroup: Option<PathBuf>,
    /// Every CUDA process on the machine.
    #[arg(long)]
    all: bool,

    /// Lock timeout in milliseconds.
    #[arg(short, long, value_name = "MS")]
    timeout: Option<u64>,
    /// Restore onto other GPUs: OLD_UUID=NEW_UUID[,...].
    #[arg(short, long, value_name = "MAP")]
    device_map: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Do not put other processes back when one of a group fails to suspend.
    #[arg(long)]
    no_rollback: bool,
    /// The driver library (default: $CUDA_CKPT_LIBCUDA or libcuda.so.1).
    #[arg(long, value_name = "PATH")]
    driver: Option<String>,
    /// The NVML library (default: $CUDA_CKPT_LIBNVML or libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    nvml: Option<String>,
    /// More log output (repeat for more).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ActionArg {
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

impl ActionArg {
    fn call(self) -> Call {
        match self {
            ActionArg::Lock => Call::Lock,
            ActionArg::Checkpoint => Call::Checkpoint,
            ActionArg::Restore => Call::Restore,
            ActionArg::Unlock => Call::Unlock,
        }
    }
}

/// Exit status for failures that are not a CUDA error.
const EXIT_FAILURE: i32 = 1;

pub fn run(argv: impl IntoIterator<Item = OsString>) -> i32 {
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    init_logging(args.verbose);
    match dispatch(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cuda-checkpoint-ctl: {e}");
            EXIT_FAILURE
        }
    }
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CUDA_CKPT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

fn selector(args: &Args) -> Option<Selector> {
    if let Some(p) = args.pid {
        Some(Selector::Pid(p))
    } else if let Some(p) = args.tree {
        Some(Selector::Tree(p))
    } else if let Some(c) = &args.cgroup {
        Some(Selector::Cgroup(c.clone()))
    } else if args.all {
        Some(Selector::All)
    } else {
        None
    }
}

fn dispatch(args: &Args) -> Result<i32, Error> {
    if args.gpus {
        return gpus(args);
    }
    let target = match (selector(args), args.list) {
        (Some(t), _) => t,
        (None, true) => Selector::All,
        (None, false) => {
            eprintln!(
                "cuda-checkpoint-ctl: name the process with --pid (or --tree, --cgroup, --all)"
            );
            return Ok(2);
        }
    };
    let driver = Driver::load(args.driver.as_deref())?;
    if let Some(sim) = &driver.info().simulated {
        tracing::info!("using the SIMULATED driver: {sim}");
    }
    if args.list {
        return list(args, &driver, &target);
    }
    let opts = Options {
        lock_timeout: args.timeout.filter(|t| *t > 0).map(Duration::from_millis),
        device_map: args
            .device_map
            .as_deref()
            .map(str::parse::<DeviceMap>)
            .transpose()?
            .unwrap_or_default(),
        all_or_nothing: !args.no_rollback,
    };
    match target {
        Selector::Pid(pid) => single(args, &driver, pid, &opts),
        group => many(args, &driver, &group, &opts),
    }
}

fn goal(args: &Args) -> Goal {
    if let Some(a) = args.action {
        Goal::Action(a.call())
    } else if args.toggle {
        Goal::Toggle
    } else if args.suspend {
        Goal::Suspend
    } else if args.resume {
        Goal::Resume
    } else {
        Goal::Recover
    }
}

/// The gerund NVIDIA's tool prints for an operation.
fn gerund(goal: &Goal) -> &'static str {
    match goal {
        Goal::Action(c) => c.gerund(),
        Goal::Toggle => "toggling",
        Goal::Suspend => "suspending",
        Goal::Resume => "resuming",
        Goal::Recover => "recovering",
    }
}

/// `cuda-checkpoint` behaviour: one process, terse output, the CUDA error as exit status.
fn single(args: &Args, driver: &Driver, pid: i32, opts: &Options) -> Result<i32, Error> {
    let report = |verb: &str, e: &Error| -> i32 {
        match e {
            Error::Cuda(c) => {
                eprintln!(
                    "Error {verb} CUDA in process ID {pid}: \"{}\"",
                    c.description
                );
                c.code as i32
            }
            other => {
                eprintln!("Error {verb} CUDA in process ID {pid}: \"{other}\"");
                EXIT_FAILURE
            }
        }
    };
    if args.get_state {
        return Ok(match driver.state(pid) {
            Ok(s) if args.json => print_json(json!({"pid": pid, "state": s})),
            Ok(s) => {
                println!("{s}");
                0
            }
            Err(e) => report(Call::GetState.gerund(), &e.into()),
        });
    }
    if args.get_restore_tid {
        return Ok(match driver.restore_thread_id(pid) {
            Ok(t) if args.json => print_json(json!({"pid": pid, "restore_tid": t})),
            Ok(t) => {
                println!("{t}");
                0
            }
            Err(e) => report(Call::GetRestoreThreadId.gerund(), &e.into()),
        });
    }
    let goal = goal(args);
    let outcome = ops::apply(driver, pid, &goal, opts);
    if args.json {
        let code = outcome_code(&outcome);
        print_json(json!({"driver": driver.info(), "processes": [outcome]}));
        return Ok(code);
    }
    Ok(match &outcome.error {
        None => 0,
        Some(e) => report(gerund(&goal), e),
    })
}

fn outcome_code(o: &Outcome) -> i32 {
    match &o.error {
        None => 0,
        Some(Error::Cuda(c)) => c.code as i32,
        Some(_) => EXIT_FAILURE,
    }
}

fn many(args: &Args, driver: &Driver, target: &Selector, opts: &Options) -> Result<i32, Error> {
    let pids = target.resolve()?;
    let found = ops::discover(driver, &pids);
    if args.get_state || args.get_restore_tid {
        if args.json {
            print_json(json!({"driver": driver.info(), "processes": found}));
        } else {
            for p in &found {
                if args.get_state {
                    println!("{} {}", p.pid, p.state);
                } else {
                    println!("{} {}", p.pid, p.restore_tid);
                }
            }
        }
        return Ok(0);
    }
    let goal = goal(args);
    let cuda_pids: Vec<i32> = found.iter().map(|p| p.pid).collect();
    let outcomes = ops::apply_all(driver, &cuda_pids, &goal, opts);
    let failed = outcomes.iter().filter(|o| !o.ok()).count();
    if args.json {
        print_json(json!({"driver": driver.info(), "processes": outcomes}));
    } else {
        if outcomes.is_empty() {
            println!("no CUDA processes found in {} process(es)", pids.len());
        }
        for o in &outcomes {
            println!("{}", describe(o));
        }
        if !outcomes.is_empty() {
            println!(
                "{} of {} CUDA process(es) {}",
                outcomes.len() - failed,
                outcomes.len(),
                if failed == 0 {
                    "done"
                } else {
                    "done; see the failures above"
                }
            );
        }
    }
    Ok(if failed == 0 { 0 } else { EXIT_FAILURE })
}

fn state_word(s: Option<ProcessState>) -> String {
    s.map_or_else(|| "?".into(), |s| s.to_string())
}

fn describe(o: &Outcome) -> String {
    let t = &o.timings;
    let times: Vec<String> = [
        ("lock", t.lock_ms),
        ("checkpoint", t.checkpoint_ms),
        ("restore", t.restore_ms),
        ("unlock", t.unlock_ms),
    ]
    .iter()
    .filter_map(|(n, v)| v.map(|ms| format!("{n} {ms:.1} ms")))
    .collect();
    let result = match (&o.error, o.rolled_back) {
        (Some(e), _) => format!("FAILED: {e}"),
        (None, true) => "put back (another process failed)".into(),
        (None, false) => "ok".into(),
    };
    format!(
        "{:>8} {} -> {}  {}{}",
        o.pid,
        state_word(o.before),
        state_word(o.after),
        result,
        if times.is_empty() {
            String::new()
        } else {
            format!("  ({})", times.join(", "))
        }
    )
}

fn list(args: &Args, driver: &Driver, target: &Selector) -> Result<i32, Error> {
    let pids = target.resolve()?;
    let found = ops::discover(driver, &pids);
    let inventory = Inventory::query(args.nvml.as_deref());
    if let Err(e) = &inventory {
        tracing::info!("no GPU memory figures: {e}");
    }
    let rows: Vec<_> = found
        .iter()
        .map(|p| {
            let usage = inventory
                .as_ref()
                .map(|i| i.usage_of(p.pid))
                .unwrap_or_default();
            json!({
                "pid": p.pid,
                "comm": process::comm(p.pid),
                "state": p.state,
                "restore_tid": p.restore_tid,
                "gpus": usage,
            })
        })
        .collect();
    if args.json {
        print_json(json!({"driver": driver.info(), "processes": rows}));
        return Ok(0);
    }
    println!(
        "{:>8} {:<16} {:<13} {:>11}  GPU MEMORY",
        "PID", "COMMAND", "STATE", "RESTORE_TID"
    );
    for (p, row) in found.iter().zip(&rows) {
        let mem: Vec<String> = row["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|u| {
                format!(
                    "{}:{}",
                    u["gpu"].as_str().unwrap_or("?"),
                    u["memory"].as_u64().map_or("?".into(), human)
                )
            })
            .collect();
        println!(
            "{:>8} {:<16} {:<13} {:>11}  {}",
            p.pid,
            process::comm(p.pid).unwrap_or_default(),
            p.state.to_string(),
            p.restore_tid,
            if mem.is_empty() {
                "-".into()
            } else {
                mem.join(" ")
            }
        );
    }
    Ok(0)
}

fn gpus(args: &Args) -> Result<i32, Error> {
    let inv = Inventory::query(args.nvml.as_deref())?;
    if args.json {
        print_json(serde_json::to_value(&inv).unwrap_or_default());
        return Ok(0);
    }
    println!(
        "driver {}  CUDA {}",
        inv.driver_version,
        inv.cuda_version
            .map(cuda_checkpoint_ctl::driver::format_cuda_version)
            .unwrap_or_else(|| "?".into())
    );
    for g in &inv.gpus {
        println!(
            "{:>2} {} {:<36} total {:>9} used {:>9} free {:>9}",
            g.index,
            g.uuid,
            g.name,
            human(g.memory_total),
            human(g.memory_used),
            human(g.memory_free)
        );
    }
    Ok(0)
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn print_json(v: serde_json::Value) -> i32 {
    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("cuda-checkpoint-ctl").chain(args.iter().copied()))
    }

    #[test]
    fn accepts_the_cuda_checkpoint_command_line() {
        let a = parse(&["--toggle", "--pid", "42"]).unwrap();
        assert!(a.toggle && a.pid == Some(42));
        let a = parse(&["--action", "lock", "-p", "42", "-t", "500"]).unwrap();
        assert!(matches!(a.action, Some(ActionArg::Lock)) && a.timeout == Some(500));
        let a = parse(&["--action", "restore", "--pid", "1", "-d", "GPU-a=GPU-b"]).unwrap();
        assert_eq!(a.device_map.as_deref(), Some("GPU-a=GPU-b"));
        assert!(
            parse(&["--get-restore-tid", "--pid", "7"])
                .unwrap()
                .get_restore_tid
        );
        assert!(parse(&["--get-state", "--pid", "7"]).unwrap().get_state);
    }

    #[test]
    fn refuses_two_operations_or_two_targets() {
        assert!(parse(&["--toggle", "--get-state", "--pid", "1"]).is_err());
        assert!(parse(&["--toggle", "--pid", "1", "--tree", "1"]).is_err());
        assert!(parse(&["--pid", "1"]).is_err());
        assert!(parse(&["--action", "explode", "--pid", "1"]).is_err());
    }

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
