//! `CUDA_SIM_TRACE=FILE` in a controller's environment: one line per finished action,
//!
//! `pid=P op=OP start_ns=S end_ns=E result=R`
//!
//! with the CLOCK_MONOTONIC times at which the target's helper thread took and finished the
//! request (P as the controller named the target, R the `CUresult`). Tests use it to prove that
//! actions on several processes overlapped. Each line is one `write` to a file opened with
//! O_APPEND, so lines from concurrent controllers never interleave. Written by the controller,
//! which may live in another mount namespace than the target; an action whose controller died
//! or whose target died leaves no line.

use std::io::Write;

use crate::control::{Done, Op};

pub const TRACE_ENV: &str = "CUDA_SIM_TRACE";

pub fn line(pid: i32, op: Op, done: &Done) -> String {
    format!(
        "pid={pid} op={} start_ns={} end_ns={} result={}\n",
        op.name(),
        done.started_ns,
        done.finished_ns,
        done.result
    )
}

/// Appends the line of one finished action, if this controller traces.
pub fn record(pid: i32, op: Op, done: &Done) {
    let Some(path) = crate::config::var(TRACE_ENV) else {
        return;
    };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line(pid, op, done).as_bytes()));
    if let Err(e) = written {
        eprintln!("cuda-sim: cannot append to {TRACE_ENV}={path}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_have_the_documented_form() {
        let done = Done {
            result: 0,
            started_ns: 5,
            finished_ns: 9,
        };
        assert_eq!(
            line(42, Op::Checkpoint, &done),
            "pid=42 op=checkpoint start_ns=5 end_ns=9 result=0\n"
        );
    }
}
