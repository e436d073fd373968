//! `criu-gpu doctor`: is this node ready to checkpoint and restore GPU processes? Each check
//! says what it found and, when something is wrong, the fix.
//!
//! The checks, by what they look at: the kernel and this process's privileges (`kernel.rs`),
//! CRIU and its plugins (`criu.rs`), the GPUs and the room their memory needs (`gpus.rs`), and
//! the container runtimes with the network lock their CRIU takes (`runtimes.rs`).

mod criu;
mod gpus;
mod kernel;
mod runtimes;

use std::path::PathBuf;

use serde::Serialize;

use crate::out;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        check,
        status: Status::Ok,
        detail: detail.into(),
        fix: None,
    }
}

fn problem(
    check: &'static str,
    status: Status,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check,
        status,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

/// Where to look, and which libraries to load.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub driver: Option<String>,
    pub nvml: Option<String>,
    /// Directories checkpoint images will be written to.
    pub image_dirs: Vec<PathBuf>,
}

pub fn run(opts: &Options) -> Vec<Finding> {
    let mut f = vec![kernel::privileges()];
    f.extend(criu::criu());
    let criu = crate::find_criu();
    let (gpu, used) = gpus::gpus(opts);
    f.extend(gpu);
    f.push(kernel::huge_pages());
    f.push(kernel::ptrace());
    f.push(kernel::seccomp());
    f.extend(runtimes::runtimes(criu.as_deref()));
    f.extend(gpus::space(opts, used));
    f
}

pub fn print(findings: &[Finding]) {
    for x in findings {
        let tag = match x.status {
            Status::Ok => "ok  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        out::line(format!("{tag}  {:<9} {}", x.check, x.detail));
        if let Some(fix) = &x.fix {
            out::line(format!("      {:<9} fix: {fix}", ""));
        }
    }
    let fails = findings.iter().filter(|x| x.status == Status::Fail).count();
    let warns = findings.iter().filter(|x| x.status == Status::Warn).count();
    out::line(match fails {
        0 => format!("this node is ready ({warns} warning(s))"),
        n => format!("this node is NOT ready: {n} problem(s) to fix, {warns} warning(s)"),
    });
}
