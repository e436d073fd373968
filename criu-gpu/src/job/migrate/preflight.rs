//! Before anything is frozen: what the sender's job needs of the receiving node, and the
//! receiver's answer. The receiver refuses what would make its restore fail (no CRIU that
//! streams pages, GPUs without the room, pids already taken, a directory in use), so that the
//! sender never freezes a job that cannot land.

use std::path::Path;

use cuda_checkpoint_ctl::inventory::{Gpu, GpuUsage, Inventory};
use cuda_checkpoint_ctl::placement::{self, Request};
use process_facts::process;
use serde::{Deserialize, Serialize};

use crate::job::facts::JobFacts;
use crate::job::plan::Plan;

/// What the sender tells the receiver.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Preflight {
    pub host: String,
    /// The job's processes (pid and name, as the sender sees them).
    pub processes: Vec<(i32, String)>,
    /// The root is the first process of a pid namespace of its own: CRIU restores the pids
    /// inside a new one, so none can be taken on the receiver.
    pub own_pid_ns: bool,
    /// The sender's GPUs and what the job holds on each (NVML; empty where it cannot tell).
    pub gpus: Vec<Gpu>,
    pub usage: Vec<GpuUsage>,
    /// What NVML said when it could not be asked.
    pub nvml: Option<String>,
    /// The CRIU options the job's restore needs.
    pub restore_args: Vec<String>,
}

/// The receiver's answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Verdict {
    pub host: String,
    /// Each a reason the move cannot be done, with its fix.
    pub problems: Vec<String>,
    /// Where the GPU state goes, and what was not checked.
    pub notes: Vec<String>,
    /// The complete map the receiver's restore gives the driver (empty: the same GPUs).
    pub device_map: String,
}

impl Preflight {
    /// The preflight of the job `facts` to be dumped with `plan` (`libnvml`: the settings'
    /// NVML, else the system's).
    pub fn of(facts: &JobFacts, plan: &Plan, libnvml: Option<&str>) -> Preflight {
        let (gpus, usage, nvml) = match Inventory::query(libnvml) {
            Ok(inv) => {
                let usage = facts
                    .members
                    .iter()
                    .filter(|m| m.cuda)
                    .flat_map(|m| inv.usage_of(m.pid))
                    .collect();
                (inv.gpus, usage, None)
            }
            Err(e) => (Vec::new(), Vec::new(), Some(e.to_string())),
        };
        Preflight {
            host: crate::job::cluster::hostname(),
            processes: facts
                .members
                .iter()
                .map(|m| (m.pid, m.comm.clone()))
                .collect(),
            own_pid_ns: facts.root != 1 && process::ns_pid(facts.root) == Some(1),
            gpus,
            usage,
            nvml,
            restore_args: plan.restore_args(),
        }
    }

    /// GPU memory the job holds, all GPUs together.
    pub fn gpu_bytes(&self) -> u64 {
        self.usage.iter().filter_map(|u| u.memory).sum()
    }
}

/// The receiver's checks of `pre`: GPUs placed as `request` asks, with room on each (NVML from
/// `libnvml`, else the system's); the pids; the image directory `dir`.
pub fn check(pre: &Preflight, request: &Request, libnvml: Option<&str>, dir: &Path) -> Verdict {
    let mut v = Verdict {
        host: crate::job::cluster::hostname(),
        ..Verdict::default()
    };
    place(pre, request, libnvml, &mut v);
    pids(pre, &mut v);
    directory(dir, &mut v);
    v
}

/// Where each GPU's state goes here, and whether it fits (the placement a restore makes).
fn place(pre: &Preflight, request: &Request, libnvml: Option<&str>, v: &mut Verdict) {
    if let Some(e) = &pre.nvml {
        v.notes.push(format!(
            "the sender could not ask NVML ({e}): GPU memory is not checked before the move"
        ));
        return;
    }
    if pre.gpus.is_empty() {
        return;
    }
    let here = match Inventory::query(libnvml) {
        Ok(inv) => inv,
        Err(e) => {
            v.problems.push(format!(
                "this node cannot see its GPUs: {e}; the job holds GPU state, which can only \
                 be restored onto a GPU"
            ));
            return;
        }
    };
    match placement::place(&pre.gpus, &pre.usage, &here.gpus, request) {
        Ok(placed) => {
            v.notes.extend(placed.notes.iter().cloned());
            let map = placed.driver_map();
            if !map.is_empty() {
                v.device_map = map.to_string();
            }
        }
        Err(e) => v.problems.push(format!(
            "the job's GPU state does not fit on this node's GPUs: {e}"
        )),
    }
}

/// CRIU restores pids: outside a pid namespace of its own, the job's must be free here.
fn pids(pre: &Preflight, v: &mut Verdict) {
    if pre.own_pid_ns {
        return;
    }
    let taken: Vec<String> = pre
        .processes
        .iter()
        .filter(|(pid, _)| process::exists(*pid))
        .map(|(pid, comm)| format!("{pid} ({comm}; here {})", process::name(*pid)))
        .collect();
    if !taken.is_empty() {
        v.problems.push(format!(
            "the job's pid(s) {} are taken on this node, and CRIU restores processes with their \
             pids: start the job in a pid namespace of its own (a container, or `unshare \
             --pid --fork`), whose pids CRIU restores inside a new one",
            taken.join(", ")
        ));
    }
}

/// The images land in `dir`: a directory of another checkpoint would be mixed with them.
fn directory(dir: &Path, v: &mut Verdict) {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                v.problems.push(format!(
                    "{} is not empty: name a new or empty directory for the moved job's images",
                    dir.display()
                ));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => v
            .problems
            .push(format!("{} cannot be used: {e}", dir.display())),
    }
}
