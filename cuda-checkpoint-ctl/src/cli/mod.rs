//! Command-line parsing and output. The work is done by the library; this parses, calls and
//! prints, and turns errors into operator words at the edge.

mod args;
mod group;
mod print;

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use cuda_checkpoint_ctl::driver::{code, Call, DeviceMap, Driver, LIBCUDA_ENV};
use cuda_checkpoint_ctl::inventory::{Inventory, LIBNVML_ENV};
use cuda_checkpoint_ctl::ops::{self, Goal, Options};
use cuda_checkpoint_ctl::placement::{self, Request};
use cuda_checkpoint_ctl::Error;
use process_facts::process::Selector;

use self::args::{Args, DEFAULT_WAIT_S};

/// Exit status for failures that are not a CUDA error.
const EXIT_FAILURE: i32 = 1;
/// Exit status for a command line that cannot be parsed.
const EXIT_USAGE: i32 = 2;

pub fn run(argv: impl IntoIterator<Item = OsString>) -> i32 {
    let argv: Vec<OsString> = argv.into_iter().collect();
    let mut args = match Args::try_parse_from(&argv) {
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
    // The libraries' variables, read here, at the edge: the library takes names only.
    let named = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
    args.driver = args.driver.or_else(|| named(LIBCUDA_ENV));
    args.nvml = args.nvml.or_else(|| named(LIBNVML_ENV));
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
        rounds: args.lock_rounds,
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
    if request == Request::Same {
        return Ok(DeviceMap::default());
    }
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
                Request::Auto | Request::Same => Err(e.into()),
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

/// `cuda-checkpoint` behaviour: one process, terse output, the CUDA error as exit status, except
/// that every wait is bounded: a held process is refused and a call that does not return within
/// --wait is given up on (NVIDIA's tool waits for ever). --recover (not an NVIDIA operation)
/// explains its errors in full.
fn single(
    args: &Args,
    driver: &Driver,
    pid: i32,
    goal: &Goal,
    mut opts: Options,
) -> Result<i32, Error> {
    let compat = !args.recover;
    let status = |e: &Error| {
        if compat {
            compat_status(e)
        } else {
            e.cuda().map_or(EXIT_FAILURE, |c| c.code as i32)
        }
    };
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
        status(e)
    };
    let wait = wait(args);
    if args.get_state {
        return Ok(match ops::state(driver, pid, wait) {
            Ok(s) if args.json => print_json(json!({"pid": pid, "state": s})),
            Ok(s) => {
                print::line(s.as_str());
                0
            }
            Err(e) => report(Call::GetState.gerund(), &e),
        });
    }
    if args.get_restore_tid {
        return Ok(match ops::restore_thread_id(driver, pid, wait) {
            Ok(t) if args.json => print_json(json!({"pid": pid, "restore_tid": t})),
            Ok(t) => {
                print::line(&t.to_string());
                0
            }
            Err(e) => report(Call::GetRestoreThreadId.gerund(), &e),
        });
    }
    opts.device_map = match device_map(args, goal) {
        Ok(m) => m,
        Err(e) => return Ok(report(gerund(goal), &e)),
    };
    opts.wait = Some(wait);
    let outcome = ops::apply(driver, pid, goal, &opts);
    if args.json {
        let code = outcome.error.as_ref().map_or(0, status);
        print::json(&json!({"driver": driver.info(), "processes": [outcome]}));
        return Ok(code);
    }
    Ok(match &outcome.error {
        None => 0,
        Some(e) => report(gerund(goal), e),
    })
}

/// The exit status of `cuda-checkpoint`-compatible operations: 0, or a CUDA error code (the
/// shell sees it modulo 256), as NVIDIA's tool. Where this tool itself stops short of the
/// driver, it exits with the CUDA code closest in meaning, so that a script that handles the
/// driver's codes handles these too:
/// - a held process (stopped, traced, frozen): CUDA_ERROR_NOT_READY (600, status 88). Nothing
///   was asked and nothing changed, and it can be tried again once the process runs: what the
///   driver itself answers for a lock that gave up (docs/driver-facts.md, F1).
/// - a call given up on after --wait: CUDA_ERROR_TIMEOUT (909, status 141), distinct from the
///   above because the call goes on in the driver and an action may still take effect.
///
/// Other failures of the tool (bad map, no NVML) exit 1.
fn compat_status(e: &Error) -> i32 {
    let code = match e {
        Error::Held { .. } => code::NOT_READY,
        Error::NoAnswer { .. } => code::TIMEOUT,
        e => match e.cuda() {
            Some(c) => c.code,
            None => return EXIT_FAILURE,
        },
    };
    code as i32
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

fn print_json(v: serde_json::Value) -> i32 {
    print::json(&v);
    0
}
