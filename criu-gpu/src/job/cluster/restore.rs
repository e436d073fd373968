//! `criu-gpu restore --nnodes N --rdzv etcd://HOST:PORT/JOB DIR`: this node's part of a restore
//! of the whole job. The part says which job, generation and node it is; the nodes join the
//! restore and exchange their preflights (parts of one dump, of this job, each node able to
//! restore its own) before anything starts. CRIU's post-restore action (criu-gpu) waits until
//! every node's processes and sockets are back: until then every node's network lock holds the
//! packets between them (dropped, so retransmitted later, never refused), and a node that does
//! not come stops the restore on every node, its images unchanged.

use std::sync::Arc;

use criu_gpu_host::settings::declared::CLUSTER;
use criu_gpu_image::addrmap::AddressMap;

use super::liveness::{self, IfFailed};
use super::moves;
use super::op::{Kind, NodeInfo, Op};
use super::part::Part;
use super::serve::Server;
use super::store::Store;
use super::{addresses, hostname, Across, ClusterError};
use crate::job::plan::Plan;
use crate::job::record::JobRecord;
use crate::job::{self, JobError, Outcome, Request, RestoreHow};
use crate::out;

/// This node's part of the restore of the job.
pub fn restore(how: &RestoreHow, r: &Request, across: &Across) -> Result<Outcome, JobError> {
    let part = read_part(r, across)?;
    let criu = job::criu(r)?;
    let rec =
        JobRecord::read(&r.dir)?.ok_or_else(|| JobError::NoRecord(r.dir.display().to_string()))?;
    let env = job::restore::device_map_env(how);
    let mut plan = job::restore::restore_plan(&rec, how, &r.dir, &r.settings);
    let mut me = NodeInfo {
        rank: part.node_rank,
        host: hostname(),
        addrs: addresses(),
        via: moves::via(&across.rdzv),
        part_gen: Some(part.generation),
        problems: Vec::new(),
        address_map: how.address_map.clone().unwrap_or_default(),
    };
    plan.problems
        .extend(moves::own_problem(&part, &me.address_map, &me));
    job::show_plan(&plan);
    me.problems = super::dump::problems(&plan);
    let store = Store::connect(&across.rdzv.endpoints).map_err(ClusterError::from)?;
    let op = Arc::new(Op::join(
        store,
        &across.rdzv,
        Kind::Restore,
        across.nnodes,
        part.node_rank,
        &me,
    )?);
    let result = restore_in(&op, (&part, &rec), how, r, across, &plan, env, &criu);
    if let Err(e) = &result {
        op.abort(&super::dump::abort_reason(e));
    }
    op.leave();
    result
}

/// The part in `r.dir`, checked against the command line: this job, this many nodes, this rank.
fn read_part(r: &Request, across: &Across) -> Result<Part, JobError> {
    let dir = r.dir.display();
    let part = Part::read(&r.dir)?.ok_or_else(|| {
        ClusterError::Part(format!(
            "{dir} holds no part of a job across machines ({}): it was not made by `criu-gpu \
             dump --nnodes`; restore it without --nnodes",
            super::part::FILE
        ))
    })?;
    let refuse = |what: String| {
        Err(ClusterError::Part(format!(
            "{dir} is {}; {what}",
            part.name()
        )))
    };
    if part.job != across.rdzv.job {
        return refuse(format!(
            "this restore is of job {}: name the part's job in --rdzv, or restore that job's part",
            across.rdzv.job
        ))?;
    }
    if part.nnodes != across.nnodes {
        return refuse(format!(
            "the job had {} nodes, not --nnodes {}",
            part.nnodes, across.nnodes
        ))?;
    }
    if let Some(rank) = across.node_rank.filter(|r| *r != part.node_rank) {
        return refuse(format!(
            "not node {rank}'s: leave --node-rank out (the part names its node) or restore node \
             {rank}'s part here"
        ))?;
    }
    Ok(part)
}

/// What the nodes must agree on, once all joined: parts of one dump; where the job's
/// connections go.
fn agree(part: &Part, nodes: &[NodeInfo], criu: &std::path::Path) -> Result<AddressMap, JobError> {
    if let Some(other) = nodes.iter().find(|n| n.part_gen != Some(part.generation)) {
        return Err(ClusterError::Part(format!(
            "{} restores a part of generation {}, this node one of generation {}: restore parts \
             of one dump on every node",
            other.name(),
            other.part_gen.map_or("?".into(), |g| g.to_string()),
            part.generation
        ))
        .into());
    }
    let map = moves::derive(part, nodes)?;
    if map.is_empty() {
        return Ok(map);
    }
    if let Some(p) = job::restore::address_map_problem(criu, &map) {
        return Err(ClusterError::Part(format!("{}: {}; nothing was done", p.what, p.fix)).into());
    }
    out::line(format!(
        "cluster: the job's connections move with its nodes: {map} (both ends, on every node)"
    ));
    Ok(map)
}

#[allow(clippy::too_many_arguments)]
fn restore_in(
    op: &Arc<Op>,
    (part, rec): (&Part, &JobRecord),
    how: &RestoreHow,
    r: &Request,
    across: &Across,
    plan: &Plan,
    mut env: Vec<(String, String)>,
    criu: &std::path::Path,
) -> Result<Outcome, JobError> {
    let nodes = op.exchange(across.timeout)?;
    super::dump::refuse_any(&nodes, plan)?;
    let map = agree(part, &nodes, criu)?;
    if !map.is_empty() {
        env.push(job::restore::address_map_env(&map));
    }
    let work = job::restore::work_dir(how, r)?;
    let mut args = job::restore::restore_args(rec, r, &work);
    // A torchrun job stays stopped until its rendezvous heartbeats are fresh (liveness.rs).
    if !part.agents.is_empty() {
        args.push("--leave-stopped".into());
    }
    args.extend(job::action_script_args()?);
    let command = job::full_command(criu, &args);
    if r.dry_run {
        return Ok(job::would_run(command, plan.clone()));
    }
    if how.truncate_grown {
        job::restore::cut_back_grown(&r.dir)?;
    }
    let server = Server::start(op.clone(), across.timeout).map_err(|source| JobError::Io {
        what: "serving the restore's barrier on a unix socket".into(),
        source,
    })?;
    env.push((CLUSTER.key.to_owned(), server.path.display().to_string()));
    let ran = job::restore::run_restore(criu, &args, &env, &command, &work)?;
    if !part.agents.is_empty() {
        let tree: Vec<i32> = rec.members.iter().map(|m| m.0).collect();
        liveness::resume(
            op,
            &moves::agents(&part.agents, &map),
            &tree,
            across.timeout,
            IfFailed::End,
            || {},
        )
        .map_err(ClusterError::Part)?;
    }
    let root = std::fs::read_to_string(work.join("restore.pid"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    out::line(format!(
        "restored {} ({} process(es)) in {:.1} s{}",
        part.name(),
        rec.members.len(),
        ran.took.as_secs_f64(),
        root.map_or(String::new(), |p: i32| format!("; its root is pid {p}"))
    ));
    Ok(Outcome {
        command,
        dry_run: false,
        plan: plan.clone(),
        seconds: ran.took.as_secs_f64(),
        image_bytes: None,
        restored_root: root,
    })
}
