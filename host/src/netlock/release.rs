//! Taking back a CRIU run's network lock, and what the operator reads of it: one rule for the
//! guardian (CRIU killed half-way) and `criu-gpu dump` (a dump that ended the job's tasks).

use std::path::Path;

use super::nftables::{table, unlock, Unlocked};

/// What taking back a run's network lock found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// The run's table was there and is gone: the job's connections carry packets again.
    Removed { table: String },
    /// The run held no lock (none was taken, or CRIU took it back).
    NotLocked,
    /// The images name no CRIU run (why): no lock was looked at.
    NoRun(String),
    /// The lock could not be looked at or removed.
    Failed { table: String, error: String },
}

impl Released {
    /// Whether the operator is told: a lock was there, or it could not be looked at.
    pub fn worth_saying(&self) -> bool {
        !matches!(self, Released::NotLocked)
    }
}

impl std::fmt::Display for Released {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Released::Removed { table } => write!(
                f,
                "took back CRIU's network lock (nftables table {table}): the job's connections \
                 carry packets again"
            ),
            Released::NotLocked => f.write_str("CRIU's network lock was not held"),
            Released::NoRun(why) => write!(
                f,
                "the images name no CRIU run ({why}): its network lock was not looked at"
            ),
            Released::Failed { table, error } => write!(
                f,
                "could not take back CRIU's network lock ({table}): {error}; if the job's \
                 connections carry nothing, run `nft delete table {table}`"
            ),
        }
    }
}

/// Takes back the network lock of CRIU run `run_id` in this network namespace.
pub fn release(run_id: &str) -> Released {
    let table = table(run_id);
    match unlock(run_id) {
        Ok(Unlocked::Removed) => Released::Removed { table },
        Ok(Unlocked::NotLocked) => Released::NotLocked,
        Err(error) => Released::Failed { table, error },
    }
}

/// Takes back the network lock of the CRIU run that dumped the images in `dir`.
pub fn release_dumped(dir: &Path) -> Released {
    match criu_gpu_image::criu_image::dump_run_id(dir) {
        Ok(Some(id)) => release(&id),
        Ok(None) => Released::NoRun("their inventory has no run id".to_owned()),
        Err(e) => Released::NoRun(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_without_a_run_are_said_so_and_nothing_is_unlocked() {
        let dir = tempfile::tempdir().unwrap();
        let r = release_dumped(dir.path());
        assert!(matches!(r, Released::NoRun(_)), "{r:?}");
        assert!(r.worth_saying());
        assert!(r.to_string().contains("not looked at"), "{r}");
    }

    #[test]
    fn a_lock_that_cannot_be_taken_back_names_the_table_and_the_fix() {
        let r = release("not a run id");
        assert!(matches!(&r, Released::Failed { .. }), "{r:?}");
        assert!(
            r.to_string()
                .contains("`nft delete table inet CRIU-not a run id`"),
            "{r}"
        );
        assert!(!Released::NotLocked.worth_saying());
    }
}
