//! A restore of an image with CUDA state.
//!
//! `init`, before CRIU creates anything, refuses what cannot succeed: a missing or damaged
//! record, image files that differ from what the dump wrote, no driver, no GPU, GPUs that do not
//! fit. The first RESUME_DEVICES_LATE restores every CUDA process of the restored tree at once.
//! CRIU ignores that hook's errors, so a failed GPU restore kills the restored tree: CRIU then
//! reports the restore as failed, and the images, which a restore never changes, serve for the
//! next attempt. The guardian kills a half-restored tree if CRIU dies before the GPU state is
//! back.
//!
//! The phases, one file each: [`init`] (the checks and the GPU plan), [`tree`] (the CUDA
//! processes of the restored tree, their restore threads and device nodes), [`resume`] (the
//! threads let run and every process restored and unlocked at once), [`late`] (the pages images
//! checked while CRIU restored). Each process's outcome is a [`RestoreError`](super::error::RestoreError) until the hook
//! answers ([`outcome`]); it becomes the operator's text only in CRIU's log and the hook's error.

mod init;
mod late;
mod outcome;
mod resume;
mod tree;

use std::sync::Arc;

use criu_gpu_image::placement::Plan;
use criu_gpu_image::restorable::CudaHolds as Holds;

use self::outcome::Outcomes;
use super::procs::Procs;
use super::settings::RestoreSettings;
use crate::core::{HookError, HookResult, Host, Verdict};
use crate::guardian::proto::Order;
use crate::guardian::{Guardian, Ticket, Verified};

enum Phase {
    /// The image holds no CUDA state.
    NoCuda,
    Ready(Box<Ready>),
    /// After the first RESUME_DEVICES_LATE: what each call of the hook answers.
    Resumed(outcome::Answers),
}

/// What `init` prepared for the first RESUME_DEVICES_LATE.
struct Ready {
    settings: RestoreSettings,
    holds: Holds,
    plan: Plan,
    guardian: Guardian,
    /// Large pages images the guardian checks against their digests while CRIU restores.
    later: Option<Later>,
}

/// The guardian's check of the large pages images, asked for in `init`.
struct Later {
    seq: Ticket<Verified>,
    bytes: u64,
}

pub struct Restore {
    procs: Box<dyn Procs>,
    phase: Phase,
}

impl Restore {
    /// RESUME_DEVICES_LATE: the first call (for the root of the restored tree) restores all of
    /// it; each call answers for its own process.
    pub fn resume(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        self.phase = match std::mem::replace(&mut self.phase, Phase::NoCuda) {
            Phase::Ready(ready) => Phase::Resumed(self.resume_tree(host, pid, *ready).answers()),
            other => other,
        };
        match &self.phase {
            Phase::Resumed(answers) => Ok(match answers.get(&pid) {
                None => Verdict::NotMine,
                Some(Ok(())) => Verdict::Done(()),
                Some(Err(e)) => return Err(HookError::gpu(Arc::clone(e))),
            }),
            _ => Ok(Verdict::NotMine),
        }
    }

    /// Restores the tree under `root`, checks the late digests, and kills the tree when anything
    /// failed; the guardian is done with either way.
    fn resume_tree(&self, host: &dyn Host, root: i32, ready: Ready) -> Outcomes {
        let Ready {
            settings,
            holds,
            plan,
            mut guardian,
            later,
        } = ready;
        let mut outcomes = self.restore_tree(host, root, &holds, &plan, &settings, &mut guardian);
        if let (Some(later), true) = (later, outcomes.all_ok()) {
            if let Err(e) = late::checked(&mut guardian, &later) {
                tracing::error!("{e}");
                outcomes.tree_failed(e);
            }
        }
        if outcomes.all_ok() {
            let _ = guardian.order(&Order::Restored);
        } else {
            self.kill_tree(root);
        }
        let _ = guardian.order(&Order::Bye);
        outcomes
    }

    /// A failed restore: the restored tree is killed, so that CRIU (which ignores this hook's
    /// errors) fails the restore; the images are unchanged.
    fn kill_tree(&self, root: i32) {
        let tree = self.procs.tree(root);
        tracing::error!(
            "killing the restored process tree ({} processes) so that criu reports the restore \
             as failed; the images are unchanged and can be restored again",
            tree.len()
        );
        for p in tree.iter().rev() {
            self.procs.kill(*p);
        }
    }

    /// The guardian of a restore that has not resumed yet (tests).
    #[cfg(test)]
    pub fn guardian(&mut self) -> Option<&mut Guardian> {
        match &mut self.phase {
            Phase::Ready(ready) => Some(&mut ready.guardian),
            _ => None,
        }
    }

    /// CRIU's `exit`: a restore that never reached RESUME_DEVICES_LATE lets its guardian go.
    pub fn exit(&mut self) {
        if let Phase::Ready(mut ready) = std::mem::replace(&mut self.phase, Phase::NoCuda) {
            let _ = ready.guardian.order(&Order::Bye);
        }
    }
}
