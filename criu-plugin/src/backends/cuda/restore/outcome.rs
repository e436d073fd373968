//! What the restore of a tree came to: each CUDA process's outcome, and the failures of the tree
//! as a whole (a process of the checkpoint missing from it, the guardian gone, threads that could
//! not run, the late digests), which the root's call of the hook answers with.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backends::cuda::error::RestoreError;

/// What each call of RESUME_DEVICES_LATE answers, by pid: shared, the errors being answered
/// to each call that asks and written to CRIU's log once.
pub(super) type Answers = BTreeMap<i32, Result<(), Arc<RestoreError>>>;

pub(super) struct Outcomes {
    root: i32,
    /// Failures of the tree as a whole, in the order they happened.
    tree: Vec<RestoreError>,
    /// Each CUDA process's outcome.
    procs: BTreeMap<i32, Result<(), RestoreError>>,
}

impl Outcomes {
    pub(super) fn new(root: i32) -> Outcomes {
        Outcomes {
            root,
            tree: Vec::new(),
            procs: BTreeMap::new(),
        }
    }

    pub(super) fn tree_failed(&mut self, e: impl Into<RestoreError>) {
        self.tree.push(e.into());
    }

    pub(super) fn set(&mut self, pid: i32, outcome: Result<(), RestoreError>) {
        self.procs.insert(pid, outcome);
    }

    pub(super) fn all_ok(&self) -> bool {
        self.tree.is_empty() && self.procs.values().all(Result::is_ok)
    }

    /// Whether process `pid` is restored (so far).
    pub(super) fn restored(&self, pid: i32) -> bool {
        self.procs.get(&pid).is_some_and(Result::is_ok)
    }

    /// How many processes were restored, of how many.
    pub(super) fn count(&self) -> (usize, usize) {
        let ok = self.procs.values().filter(|r| r.is_ok()).count();
        (ok, self.procs.len())
    }

    /// Every failure, for the log.
    pub(super) fn errors(&self) -> impl Iterator<Item = &RestoreError> {
        self.tree
            .iter()
            .chain(self.procs.values().filter_map(|r| r.as_ref().err()))
    }

    /// The answers: each process's own outcome; the root's is the first failure of the tree
    /// when there is one.
    pub(super) fn answers(self) -> Answers {
        let mut answers: Answers = self
            .procs
            .into_iter()
            .map(|(pid, r)| (pid, r.map_err(Arc::new)))
            .collect();
        if let Some(first) = self.tree.into_iter().next() {
            answers.insert(self.root, Err(Arc::new(first)));
        }
        answers
    }
}
