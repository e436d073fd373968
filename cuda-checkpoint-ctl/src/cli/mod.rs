//! Command-line parsing and output. The work is done by the library; this parses, calls and
//! prints, and turns errors into operator words at the edge.

mod args;
mod group;
mod print;

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use cuda_checkpoint_ctl::driver::{Call, DeviceMap, Driver};
use cuda_checkpoint_ctl::inventory::Inventory;
use cuda_checkpoint_ctl::ops::{self, Goal, Options, Outcome};
use cuda_checkpoint_ctl::placement::{self, Request};
use cuda_checkpoint_ctl::process::Selector;
use cuda_checkpoint_ctl::Error;

use self::args::{Args, DEFAULT_WAIT_S};

/// Exit status for failures that are not a CUDA error.
const EXIT_FAILURE: i32 = 1;
/// Exit status for a command line that cannot be parsed.
const EXIT_USAGE: i32 = 2;

pub fn run(argv: impl IntoIterator<Item = OsString>) -> i32 {
    let argv: Vec<OsString> = argv.into_iter().collect();
    let args = match Args::try_parse_from(&argv) {
        Ok(a) => a,
        Err(e) => {
            if !e.use_stderr() {
                let _ = e.print();
                return 0;
            }
            if argv.iter().any(|a| a == "--json") {
                print::json_error(e.to_string().trim());
            }
            let _ = e.print();
            return EXIT_USAGE;
        }
    };
    init_logging(args.verbose);
    match dispatch(&args) {
        Ok(code) => code,
        Err(e) => {
            if args.json {
                print::json_error(&e.to_string());
            }
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
        return group::gpus(args);
    }
    let target = match (selector(args), args.list) {
        (Some(t), _) => t,
        (None, true) => Selector::All,
        (None, false) => {
            let msg = "name the process with --pid (or --tree, --cgroup, --all)";
            if args.json {
                print::json_error(msg);
            }
            eprintln!("cuda-checkpoint-ctl: {msg}");
            return Ok(EXIT_USAGE);
        }
    };
    let driver = Driver::load(args.driver.as_deref())?;
    if let Some(sim) = &driver.info().simulated {
        tracing::info!("using the SIMULATED driver: {sim}");
    }
    if args.list {
        return group::list(args, &driver, &target);
    }
    let goal = goal(args);
    let opts = Options {
        lock_timeout: args.timeout.filter(|t| *t > 0).map(Duration::from_millis),
        device_map: DeviceMap::default(),
        all_or_nothing: !args.no_rollback,
        wait: None,
    };
    match target {
        Selector::Pid(pid) => single(args, &driver, pid, &goal, opts),
        group => group::many(args, &driver, &group, &goal, opts),
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

/// The bound on driver calls for operations that must not hang.
fn wait(args: &Args) -> Duration {
    Duration::from_secs(args.wait.unwrap_or(DEFAULT_WAIT_S))
}

/// The device map for a restore: what the operator asked, completed with this machine's GPUs
/// (a checkpointed process's driver saw them at checkpoint when restoring here). What the
/// processes held is not known here (NVML shows nothing for a checkpointed process), so memory
/// is left for the driver to check.
fn device_map(args: &Args, goal: &Goal) -> Result<DeviceMap, Error> {
    let Some(text) = &args.device_map else {
        return Ok(DeviceMap::default());
    };
    let request: Request = text.parse()?;
    let restores = matches!(
        goal,
        Goal::Action(Call::Restore) | Goal::Resume | Goal::Toggle | Goal::Recover
    );
    if !restores {
        return Ok(DeviceMap::default());
    }
    let gpus = match Inventory::query(args.nvml.as_deref()) {
        Ok(inv) => inv.gpus,
        Err(e) => {
            return match request {
                Request::Pairs(map) => {
                    tracing::warn!("cannot complete the device map ({e}); passing it as given");
                    Ok(map)
                }
                Request::Auto => Err(e),
            }
        }
    };
    let placed = placement::place(&gpus, &[], &gpus, &request)?;
    tracing::info!("device map: {}", placed.map);
    for note in &placed.notes {
        tracing::info!("{note}");
    }
    Ok(placed.driver_map())
}

/// `cuda-checkpoint` behaviour: one process, terse output, the CUDA error as exit status. Only
/// --recover (not an NVIDIA operation) bounds its waits and explains its errors in full.
fn single(
    args: &Args,
    driver: &Driver,
    pid: i32,
    goal: &Goal,
    mut opts: Options,
) -> Result<i32, Error> {
    let compat = !args.recover;
    let report = |verb: &str, e: &Error| -> i32 {
        if args.json {
            print::json(&json!({"pid": pid, "error": e.to_string()}));
        }
        if !args.json {
            match e.cuda() {
                // NVIDIA's words, which CRIU's C plugin parses.
                Some(c) if compat => eprintln!(
                    "Error {verb} CUDA in process ID {pid}: \"{}\"",
                    c.description
                ),
                _ => eprintln!("Error {verb} CUDA in process ID {pid}: \"{e}\""),
            }
        }
        e.cuda().map_or(EXIT_FAILURE, |c| c.code as i32)
    };
    if args.get_state {
        return Ok(match driver.state(pid) {
            Ok(s) if args.json => print_json(json!({"pid": pid, "state": s})),
            Ok(s) => {
                print::line(s.as_str());
                0
            }
            Err(e) => report(Call::GetState.gerund(), &e.into()),
        });
    }
    if args.get_restore_tid {
        return Ok(match driver.restore_thread_id(pid) {
            Ok(t) if args.json => print_json(json!({"pid": pid, "restore_tid": t})),
            Ok(t) => {
                print::line(&t.to_string());
                0
            }
            Err(e) => report(Call::GetRestoreThreadId.gerund(), &e.into()),
        });
    }
    opts.device_map = match device_map(args, goal) {
        Ok(m) => m,
        Err(e) => return Ok(report(gerund(goal), &e)),
    };
    if *goal == Goal::Recover {
        opts.wait = Some(wait(args));
    }
    let outcome = ops::apply(driver, pid, goal, &opts);
    if args.json {
        let code = outcome_code(&outcome);
        print::json(&json!({"driver": driver.info(), "processes": [outcome]}));
        return Ok(code);
    }
    Ok(match &outcome.error {
        None => 0,
        Some(e) => report(gerund(goal), e),
    })
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

fn outcome_code(o: &Outcome) -> i32 {
    match &o.error {
        None => 0,
        Some(e) => e.cuda().map_or(EXIT_FAILURE, |c| c.code as i32),
    }
}

fn print_json(v: serde_json::Value) -> i32 {
    print::json(&v);
    0
}
