//! `criu-gpu dump --nnodes N --node-rank R --rdzv etcd://HOST:PORT/JOB ROOT DIR`: this node's
//! part of a dump of the whole job. Before anything is frozen the nodes join the dump's
//! generation and exchange their preflights: a problem on any node stops every node. CRIU then
//! runs with `CRIU_GPU_CLUSTER` naming this node's socket: the plugin's lock rounds are decided
//! with the other nodes, and CRIU's post-dump action (criu-gpu) waits until every node's dump is
//! complete (the commit). A node that fails, dies or loses etcd before the commit stops every
//! node's dump, and every node's ranks go on.

use std::sync::Arc;

use criu_gpu_host::settings::declared::CLUSTER;

use super::liveness::{self, IfFailed};
use super::op::{Kind, NodeInfo, Op};
use super::part::{Node, Part};
use super::serve::Server;
use super::store::Store;
use super::torchrun;
use super::watch::{self, Watch};
use super::{addresses, hostname, Across, ClusterError};
use crate::job::plan::{Plan, Problem};
use crate::job::{self, JobError, Outcome, Request};
use crate::out;

/// This node's part of the dump of the job rooted here at `pid`.
pub fn dump(
    pid: i32,
    leave_running: bool,
    r: &Request,
    across: &Across,
) -> Result<Outcome, JobError> {
    let rank = across.node_rank.ok_or_else(|| {
        ClusterError::Part(
            "a dump across nodes needs this node's --node-rank (0 to NNODES-1), as torchrun's \
             --node-rank"
                .into(),
        )
    })?;
    let criu = job::criu(r)?;
    let facts = job::dump::read_job(pid, &r.settings)?;
    let plan = job::dump::dump_plan(&facts, &criu);
    job::show_plan(&plan);
    let me = NodeInfo {
        rank,
        host: hostname(),
        addrs: addresses(),
        via: super::moves::via(&across.rdzv),
        part_gen: None,
        problems: problems(&plan),
        address_map: Default::default(),
    };
    let store = Store::connect(&across.rdzv.endpoints).map_err(ClusterError::from)?;
    let op = Arc::new(Op::join(
        store,
        &across.rdzv,
        Kind::Dump,
        across.nnodes,
        rank,
        &me,
    )?);
    let result = dump_in(&op, (pid, &facts), leave_running, r, across, &me, &plan);
    if let Err(e) = &result {
        op.abort(&abort_reason(e));
    }
    op.leave();
    result
}

pub(super) fn problems(plan: &Plan) -> Vec<String> {
    described(&plan.problems)
}

/// Each problem and its fix, in a line.
fn described(problems: &[Problem]) -> Vec<String> {
    problems
        .iter()
        .map(|p| {
            if p.fix.is_empty() {
                p.what.clone()
            } else {
                format!("{} (fix: {})", p.what, p.fix)
            }
        })
        .collect()
}

/// Why this node stops the job's operation, for the other nodes (each abort is shown there as
/// "node R: WHY"): a refusal names each problem and its fix, as this node shows them.
pub(super) fn abort_reason(e: &JobError) -> String {
    match e {
        JobError::Refused(problems) => format!(
            "its preflight refused the job: {}",
            described(problems).join("; ")
        ),
        e => e.to_string(),
    }
}

/// Refuses when any node's preflight found problems: every node says which.
pub(super) fn refuse_any(nodes: &[NodeInfo], plan: &Plan) -> Result<(), JobError> {
    let mine = !plan.problems.is_empty();
    let theirs: Vec<String> = nodes
        .iter()
        .filter(|n| !n.problems.is_empty())
        .map(|n| format!("{}: {}", n.name(), n.problems.join("; ")))
        .collect();
    if mine {
        return Err(JobError::Refused(plan.problems.clone()));
    }
    if theirs.is_empty() {
        return Ok(());
    }
    Err(ClusterError::Aborted(format!(
        "another node's preflight refused the job ({}); nothing was done on any node",
        theirs.join(" | ")
    ))
    .into())
}

fn dump_in(
    op: &Arc<Op>,
    (pid, facts): (i32, &crate::job::facts::JobFacts),
    leave_running: bool,
    r: &Request,
    across: &Across,
    me: &NodeInfo,
    plan: &Plan,
) -> Result<Outcome, JobError> {
    let nodes = op.exchange(across.timeout)?;
    refuse_any(&nodes, plan)?;
    let criu = job::criu(r)?;
    // A snapshot of a torchrun job stays stopped until its rendezvous heartbeats are fresh.
    let agents = torchrun::agents(&facts.members.iter().map(|m| m.pid).collect::<Vec<_>>());
    let hold = leave_running && !agents.is_empty();
    let mut args = job::dump::dump_args(pid, leave_running && !hold, r, plan)?;
    if hold {
        args.push("--leave-stopped".into());
    }
    let command = job::full_command(&criu, &args);
    if r.dry_run {
        return Ok(job::would_run(command, plan.clone()));
    }
    let server = Server::start(op.clone(), across.timeout).map_err(|source| JobError::Io {
        what: "serving the plugin's lock rounds on a unix socket".into(),
        source,
    })?;
    let members = watch::members(facts);
    op.hold_members(members.clone());
    let _watch = Watch::start(op.clone(), members);
    let env = vec![(CLUSTER.key.to_owned(), server.path.display().to_string())];
    job::dump::record_before_criu(pid, facts, plan, &r.dir)?;
    let ran = job::dump::run_dump(&criu, &args, &env, &command, &r.dir)?;
    Part {
        job: op.job.clone(),
        generation: op.gen,
        nnodes: op.nnodes,
        node_rank: op.rank,
        nodes: nodes.iter().map(Node::from).collect(),
        leave_running,
        dumped_at: job::now(),
        agents: agents.clone(),
    }
    .write(&r.dir)?;
    let locked = plan.dump_args().iter().any(|a| a == "--network-lock");
    if hold {
        let tree: Vec<i32> = facts.members.iter().map(|m| m.pid).collect();
        let release = || {
            if locked {
                job::dump::release_network_lock(&r.dir)
            }
        };
        liveness::resume(op, &agents, &tree, across.timeout, IfFailed::GoOn, release)
            .map_err(ClusterError::Part)?;
    } else if !leave_running && locked {
        job::dump::release_network_lock(&r.dir);
    }
    job::dump::say_files_recorded(&r.dir);
    let bytes = job::dir_bytes(&r.dir);
    out::line(format!(
        "dumped node {}'s part of job {} (generation {}, {} node(s)) into {} in {:.1} s: {}",
        me.rank,
        op.job,
        op.gen,
        op.nnodes,
        r.dir.display(),
        ran.took.as_secs_f64(),
        crate::human::bytes(bytes)
    ));
    Ok(Outcome {
        command,
        dry_run: false,
        plan: plan.clone(),
        seconds: ran.took.as_secs_f64(),
        image_bytes: Some(bytes),
        restored_root: None,
    })
}
