//! What can go wrong in a `criu-gpu` command, in operators' words, and the exit status of each.

use crate::archive::ArchiveError;
use crate::job::JobError;
use criu_gpu_node::NodeError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line itself is wrong.
    #[error("{0}")]
    Usage(String),
    /// The checkpoint cannot be read.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// A Kubernetes node operation failed or was refused.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The command ran and its answer is "no" (a refused restore, a node not ready).
    #[error("{0}")]
    Refused(String),
    /// A job's dump or restore was refused or failed.
    #[error(transparent)]
    Job(#[from] JobError),
    /// The snapshot store refused or failed.
    #[error(transparent)]
    Store(Box<snapshot_store::StoreError>),
}

impl From<snapshot_store::StoreError> for Error {
    fn from(e: snapshot_store::StoreError) -> Error {
        Error::Store(Box::new(e))
    }
}

impl Error {
    /// 1: the answer is no, or the operation failed; 2: the input could not be used.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) | Error::Archive(_) => 2,
            Error::Node(_) | Error::Refused(_) | Error::Job(_) | Error::Store(_) => 1,
        }
    }

    /// A stable name for `--json` consumers.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Usage(_) => "usage",
            Error::Archive(_) => "unreadable-checkpoint",
            Error::Node(_) => "node",
            Error::Refused(_) => "refused",
            Error::Job(JobError::Refused(_)) => "refused",
            Error::Job(_) => "job",
            Error::Store(_) => "store",
        }
    }
}
