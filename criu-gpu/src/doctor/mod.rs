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

use criu_gpu_host::settings::declared::{LIBCUDA, LIBNVML};
use criu_gpu_host::settings::Settings;

use crate::error::Error;
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

/// `criu-gpu doctor`: the libraries default to those the plugin would load (its `settings`);
/// exit status 1 when a check failed.
pub fn command(given: &Options, settings: &Settings, json: bool) -> Result<u8, Error> {
    // By default, the libraries the plugin would load.
    let named = |s| settings.get(s).ok().flatten();
    let opts = &Options {
        driver: given.driver.clone().or_else(|| named(&LIBCUDA)),
        nvml: given.nvml.clone().or_else(|| named(&LIBNVML)),
        image_dirs: given.image_dirs.clone(),
    };
    for (flag, v) in [("--driver", &opts.driver), ("--nvml", &opts.nvml)] {
        if v.as_deref() == Some("") {
            return Err(Error::Usage(format!(
                "{flag} was given an empty path: name the library (e.g. {flag} /usr/lib/x86_64-linux-gnu/{}), or leave the option out to use the system's",
                if flag == "--driver" { "libcuda.so.1" } else { "libnvidia-ml.so.1" }
            )));
        }
    }
    let findings = run(opts);
    let ready = findings.iter().all(|f| f.status != Status::Fail);
    if json {
        out::json(&serde_json::json!({"ready": ready, "checks": findings}));
    } else {
        print(&findings);
    }
    Ok(if ready { 0 } else { 1 })
}
