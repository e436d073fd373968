//! Operations on groups of processes (--tree, --cgroup, --all), listings and the GPU table.
//! Every driver call here is bounded (--wait): the driver may wait without limit.

use std::time::Duration;

use serde_json::json;

use cuda_checkpoint_ctl::driver::{Driver, ProcessState};
use cuda_checkpoint_ctl::inventory::Inventory;
use cuda_checkpoint_ctl::ops::{self, CudaProcess, Goal, Options, Outcome, Survey};
use cuda_checkpoint_ctl::Error;
use process_facts::nccl;
use process_facts::process::{self, Selector};
use process_facts::refusal;

use super::args::{Args, LIST_WAIT_S};
use super::{print, EXIT_FAILURE};

/// How long a listing waits for each process's state.
fn list_wait(args: &Args) -> Duration {
    Duration::from_secs(args.wait.unwrap_or(LIST_WAIT_S))
}

/// The state column: the driver's word, or why there is none ("held": the process cannot
/// run, so it was not asked; "busy": no answer in time).
fn state_word(p: &CudaProcess) -> &'static str {
    match (p.state, &p.held) {
        (Some(s), _) => s.as_str(),
        (None, Some(_)) => "held",
        (None, None) => "busy",
    }
}

/// Says why each held process was not asked (text mode; JSON has it in "held").
fn warn_held(processes: &[CudaProcess]) {
    for held in processes.iter().filter_map(|p| p.held.as_deref()) {
        tracing::warn!("{held}");
    }
}

/// Reports processes that could not be inspected; true if there were any.
fn report_denied(args: &Args, survey: &Survey) -> bool {
    match survey.denied_error() {
        Some(e) => {
            if !args.json {
                eprintln!("cuda-checkpoint-ctl: {e}");
            }
            true
        }
        None => false,
    }
}

fn denied_json(survey: &Survey) -> serde_json::Value {
    match survey.denied_error() {
        Some(e) => json!({"not_inspected": survey.denied, "error": e.to_string()}),
        None => json!({}),
    }
}

fn merge(mut a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    if let (Some(a), Some(b)) = (a.as_object_mut(), b.as_object()) {
        a.extend(b.clone());
    }
    a
}

pub fn many(
    args: &Args,
    driver: &Driver,
    target: &Selector,
    goal: &Goal,
    mut opts: Options,
) -> Result<i32, Error> {
    let pids = target.resolve()?;
    let survey = ops::survey(driver, &pids, list_wait(args));
    if args.get_state || args.get_restore_tid {
        return Ok(states(args, driver, &survey));
    }
    // A group must be whole: acting on the part this user can see could split it. Recovery
    // is the exception; it helps every process it reaches.
    if *goal != Goal::Recover {
        if let Some(e) = survey.denied_error() {
            return Err(e);
        }
    }
    let checkpoints = matches!(
        goal,
        Goal::Suspend | Goal::Toggle | Goal::Action(cuda_checkpoint_ctl::driver::Call::Checkpoint)
    );
    if checkpoints && !args.no_nccl_check {
        nccl_check(&survey)?;
    }
    opts.wait = Some(super::wait(args));
    opts.device_map = super::device_map(args, goal)?;
    let outcomes = ops::apply_all(driver, &survey.pids(), goal, &opts);
    let failed = outcomes.iter().filter(|o| !o.ok()).count();
    if args.json {
        let mut v = json!({"driver": driver.info(), "processes": outcomes});
        if !opts.device_map.is_empty() {
            v["device_map"] = json!(opts.device_map.to_string());
        }
        print::json(&merge(v, denied_json(&survey)));
    } else {
        if outcomes.is_empty() {
            print::line(&format!(
                "no CUDA processes found in {} process(es)",
                pids.len()
            ));
        }
        for o in &outcomes {
            print::line(&describe(o));
        }
        if !outcomes.is_empty() {
            print::line(&format!(
                "{} of {} CUDA process(es) {}",
                outcomes.len() - failed,
                outcomes.len(),
                if failed == 0 {
                    "done"
                } else {
                    "done; see the failures above"
                }
            ));
        }
    }
    let denied = report_denied(args, &survey);
    Ok(if failed == 0 && !denied {
        0
    } else {
        EXIT_FAILURE
    })
}

/// NCCL ranks of this node whose transports the driver checkpoints but cannot restore (F13):
/// refused before any call, with the fix.
fn nccl_check(survey: &Survey) -> Result<(), Error> {
    let ranks: Vec<(i32, String)> = survey
        .processes
        .iter()
        .filter(|p| process::libraries(p.pid).is_ok_and(|l| l.nccl))
        .map(|p| (p.pid, p.comm.clone()))
        .collect();
    match refusal::nccl(&ranks, |pid| nccl::Config::of(pid).unwrap_or_default()) {
        Some(r) => Err(Error::Refused(r)),
        None => Ok(()),
    }
}

/// --get-state / --get-restore-tid of a group.
fn states(args: &Args, driver: &Driver, survey: &Survey) -> i32 {
    if args.json {
        let v = json!({"driver": driver.info(), "processes": survey.processes});
        print::json(&merge(v, denied_json(survey)));
    } else {
        for p in &survey.processes {
            if args.get_state {
                print::line(&format!("{} {}", p.pid, state_word(p)));
            } else {
                print::line(&format!("{} {}", p.pid, p.restore_tid));
            }
        }
        warn_held(&survey.processes);
    }
    if report_denied(args, survey) {
        EXIT_FAILURE
    } else {
        0
    }
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
    let state = |s: Option<ProcessState>| s.map_or("?", |s| s.as_str());
    format!(
        "{:>8} {:<16} {} -> {}  {}{}",
        o.pid,
        o.comm,
        state(o.before),
        state(o.after),
        result,
        if times.is_empty() {
            String::new()
        } else {
            format!("  ({})", times.join(", "))
        }
    )
}

pub fn list(args: &Args, driver: &Driver, target: &Selector) -> Result<i32, Error> {
    let pids = target.resolve()?;
    let survey = ops::survey(driver, &pids, list_wait(args));
    let inventory = Inventory::query(args.nvml.as_deref());
    if let Err(e) = &inventory {
        tracing::info!("no GPU memory figures: {e}");
    }
    let row = |p: &CudaProcess| {
        let usage = inventory
            .as_ref()
            .map(|i| i.usage_of(p.pid))
            .unwrap_or_default();
        json!({
            "pid": p.pid,
            "comm": p.comm,
            "state": state_word(p),
            "restore_tid": p.restore_tid,
            "gpus": usage,
            "held": p.held,
        })
    };
    let rows: Vec<_> = survey.processes.iter().map(row).collect();
    if args.json {
        let v = json!({"driver": driver.info(), "processes": rows});
        print::json(&merge(v, denied_json(&survey)));
    } else {
        print::line(&format!(
            "{:>8} {:<16} {:<13} {:>11}  GPU MEMORY",
            "PID", "COMMAND", "STATE", "RESTORE_TID"
        ));
        for (p, row) in survey.processes.iter().zip(&rows) {
            let mem: Vec<String> = row["gpus"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|u| {
                    format!(
                        "{}:{}",
                        u["gpu"].as_str().unwrap_or("?"),
                        u["memory"].as_u64().map_or("?".into(), print::human)
                    )
                })
                .collect();
            print::line(&format!(
                "{:>8} {:<16} {:<13} {:>11}  {}",
                p.pid,
                p.comm,
                state_word(p),
                p.restore_tid,
                if mem.is_empty() {
                    "-".into()
                } else {
                    mem.join(" ")
                }
            ));
        }
        warn_held(&survey.processes);
        if survey
            .processes
            .iter()
            .any(|p| p.state.is_none() && p.held.is_none())
        {
            tracing::warn!(
                "busy: the driver did not give the state within {} s (an action is in \
                 progress); --wait SECONDS waits longer",
                list_wait(args).as_secs()
            );
        }
    }
    Ok(if report_denied(args, &survey) {
        EXIT_FAILURE
    } else {
        0
    })
}

pub fn gpus(args: &Args) -> Result<i32, Error> {
    let inv = Inventory::query(args.nvml.as_deref())?;
    if args.json {
        print::json(&serde_json::to_value(&inv).unwrap_or_default());
        return Ok(0);
    }
    print::line(&format!(
        "driver {}  CUDA {}",
        inv.driver_version,
        inv.cuda_version
            .map(cuda_checkpoint_ctl::driver::format_cuda_version)
            .unwrap_or_else(|| "?".into())
    ));
    for g in &inv.gpus {
        print::line(&format!(
            "{:>2} {} {:<36} total {:>9} used {:>9} free {:>9}",
            g.index,
            g.uuid,
            g.name,
            print::human(g.memory_total),
            print::human(g.memory_used),
            print::human(g.memory_free)
        ));
    }
    Ok(0)
}
