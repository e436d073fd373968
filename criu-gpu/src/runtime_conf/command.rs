//! `criu-gpu runtime-config`: the network lock this node can take, written into the container
//! runtimes' CRIU settings ([`super::apply`]), and said.

use std::path::PathBuf;

use criu_gpu_host::netlock::NodeLocks;

use crate::error::Error;
use crate::out;

/// `criu-gpu runtime-config`: exit status 1 when the runtimes' CRIU will not be able to lock a
/// container's network on this node (nothing it can take, or an own setting it cannot take).
pub fn run(
    files: Vec<PathBuf>,
    template: Option<PathBuf>,
    criu: Option<PathBuf>,
    dry_run: bool,
    json: bool,
) -> Result<u8, Error> {
    let criu = criu.or_else(crate::find_criu).ok_or_else(|| {
        Error::Refused(
            "criu not found ($CRIU, PATH, /usr/local/sbin, /usr/sbin): it is what tells \
                 whether this node can take an nftables lock; install it first \
                 (scripts/install-criu.sh) or name it with --criu"
                .into(),
        )
    })?;
    let template = match template {
        Some(t) => std::fs::read_to_string(&t)
            .map_err(|e| Error::Usage(format!("--template {}: {e}", t.display())))?,
        None => super::TEMPLATE.to_owned(),
    };
    let files = if files.is_empty() {
        super::RUNTIMES
            .iter()
            .map(|(_, f)| PathBuf::from(f))
            .collect()
    } else {
        files
    };
    let node = NodeLocks::probe(&criu);
    let done = super::apply(&files, &template, node, dry_run)
        .map_err(|e| Error::Refused(format!("writing CRIU's settings: {e}")))?;
    let problem = done.iter().any(|(r, _)| r.outcome.is_problem());
    if json {
        let results: Vec<_> = done.iter().map(|(r, _)| r).collect();
        out::json(&serde_json::json!({
            "node": node,
            "choice": node.choose(),
            "dry_run": dry_run,
            "files": results,
        }));
    } else {
        for (r, new) in &done {
            out::line(r.describe(node));
            if let (true, Some(new)) = (dry_run, new) {
                for l in new.lines() {
                    out::line(format!("  | {l}"));
                }
            }
        }
        if node.choose().is_none() {
            out::line(format!(
                "WARNING: this node can take no network lock: {}",
                NodeLocks::NO_LOCK_FIX
            ));
        }
    }
    Ok(u8::from(problem))
}
