//! Moving a GPU job to another node without a disk: `criu-gpu dump PID DIR --to HOST:PORT` on
//! the node it runs on, `criu-gpu restore DIR --listen PORT` on the node it goes to, as CRIU's
//! `dump --page-server --address --port` and `page-server --port` pair up.
//!
//! It is CRIU's lazy migration ([`send`], [`receive`]): the sender's CRIU dumps everything but
//! the pages while the job is frozen, the receiver's CRIU restores the tree from those images at
//! once, and the pages (the GPU driver's checkpoint data among them) travel over CRIU's own page
//! server protocol as the receiver's lazy-pages daemon asks for them, streamed from the start
//! and put in place through userfaultfd while the receiver restores; its GPU driver's restore
//! reads the data as it arrives. The project's CRIU (patch 0014) makes that safe for GPU state:
//! the receiver resumes the job only once every page is in place and its GPU state is back,
//! and the sender ends the job only once the receiver said so; any failure before that (a cut
//! connection, a receiver that dies or lacks what it needs) fails the dump and the job runs on
//! at the sender, with nothing of it left at the receiver.
//!
//! Two TCP connections from sender to receiver: the control one ([`wire`]: the preflight, the
//! images, the outcome) and the pages one, handed to CRIU on both sides. Every wait on them is
//! bounded ([`net`]).

pub mod net;
pub mod preflight;
pub mod receive;
pub mod report;
pub mod seal;
pub mod send;
pub mod stage;
pub mod wire;

use std::path::Path;

use super::plan::Problem;

/// What goes wrong in a move, in the operator's words.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{0}")]
    Usage(String),
    #[error(
        "cannot reach the receiver at {0}: {1}; start `criu-gpu restore DIR --listen PORT` \
         there first (nothing was done)"
    )]
    Connect(String, std::io::Error),
    #[error("cannot listen on {0}: {1}")]
    Listen(String, std::io::Error),
    #[error("no move came: {0} (nothing was done here)")]
    NoSender(String),
    #[error("{host} refused the job before anything was frozen: {}", .problems.join("; "))]
    Refused { host: String, problems: Vec<String> },
    #[error("the other node went away or said something unexpected: {0}")]
    Lost(String),
    #[error("the sender gave up ({0}): the job runs on there; nothing was done here")]
    GaveUp(String),
    #[error(
        "the restore failed ({0}): nothing of the job was left on this node, and it runs on at \
         the sender"
    )]
    Failed(String),
}

/// A CRIU that cannot move pages while the other side restores: the project's CRIU (patch
/// 0012, `criu check --feature lazy_pages_complete`) on a kernel with userfaultfd's events.
pub fn streams_pages(criu: &Path) -> Option<Problem> {
    let ok = criu_gpu_host::criu_bin::has_feature(criu, "lazy_pages_complete");
    (!ok).then(|| Problem {
        what: format!(
            "{} cannot move a job's pages while the other node restores it (`criu check \
             --feature lazy_pages_complete` fails: it is not the project's CRIU, or the kernel's \
             userfaultfd lacks the fork, remap, remove and unmap events)",
            criu.display()
        ),
        fix: "install the project's CRIU (scripts/install.sh; patch 0014 of third_party/criu) or \
              name it with --criu PATH; Linux 4.11 or later"
            .into(),
    })
}

/// `criu-gpu` as the action script of a move's CRIU: at post-dump, has the sending `criu-gpu`
/// (its socket `socket`) send the images; false (the dump fails, the job runs on) when the
/// receiver did not take them.
pub fn action_script(socket: &Path, action: &str) -> bool {
    if action != "post-dump" {
        return true;
    }
    match super::cluster::serve::barrier(socket, action) {
        Ok(()) => true,
        Err(why) => {
            eprintln!("criu-gpu: the images did not reach the receiver: {why}");
            false
        }
    }
}
