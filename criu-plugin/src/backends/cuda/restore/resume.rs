//! The GPU restore itself: the driver's restore threads let run under CRIU's ptrace, and every
//! process restored and unlocked at once (one after another with CRIU_GPU_PARALLEL=0), within a
//! size-aware limit.

use std::time::{Duration, Instant};

use criu_gpu_image::placement::Plan;
use cuda_checkpoint_ctl::driver::ProcessState;

use super::outcome::Outcomes;
use super::tree::{Found, Restorable};
use super::Restore;
use crate::backends::cuda::error::{ActionFailure, RestoreError};
use crate::backends::cuda::gib;
use crate::backends::cuda::settings::action_limit;
use crate::backends::cuda::settings::RestoreSettings;
use crate::core::stats;
use crate::core::{Host, ThreadWindow};
use crate::guardian::proto::{Act, Answer};
use crate::guardian::{Guardian, Ticket};

impl Restore {
    /// Lets the restore threads of `ready` run and restores all of them at once.
    pub(super) fn restore_all(
        &self,
        host: &dyn Host,
        g: &mut Guardian,
        ready: &[Restorable<'_>],
        plan: &Plan,
        settings: &RestoreSettings,
        out: &mut Outcomes,
    ) {
        let limit = limit(settings, ready);
        let parallel = settings.parallel;
        let start = Instant::now();
        let threads: Vec<(i32, i32)> = ready.iter().map(|r| (r.found.pid, r.thread)).collect();
        let (mut window, failed) = ThreadWindow::open(host.threads(), &threads);
        for e in failed {
            out.tree_failed(RestoreError::Threads(e));
        }
        let until = start + limit;
        let mut acts = Vec::new();
        for r in ready {
            // Every process comes back running, also one that someone else had paused when it
            // was dumped: whoever paused it has no hold on the restored process, and a restore
            // that reports success leaves nothing paused (CRIU's C plugin does the same).
            let act = Act::Resume {
                pairs: plan.map.pairs().to_vec(),
                unlock: true,
            };
            match g.act(r.found.pid, act) {
                Ok(seq) => {
                    if !parallel {
                        let _ = g.wait_all(&[seq], until, &mut || window.watch());
                    }
                    acts.push((r.found, seq));
                }
                Err(e) => out.set(r.found.pid, Err(e.into())),
            }
        }
        let seqs: Vec<_> = acts.iter().map(|(_, s)| *s).collect();
        if let Err(e) = g.wait_all(&seqs, until, &mut || window.watch()) {
            out.tree_failed(e);
        }
        for e in window.close() {
            tracing::error!("{e}");
        }
        for (f, seq) in acts {
            out.set(f.pid, restored(g, f, seq, limit));
        }
    }

    /// The restore in CRIU's log: how many, how much and how fast, and every failure.
    pub(super) fn report(&self, found: &[Found], out: &Outcomes, start: Instant) {
        let (ok, of) = out.count();
        let bytes: u64 = found
            .iter()
            .filter(|f| out.restored(f.pid))
            .map(device_bytes)
            .sum();
        let secs = start.elapsed().as_secs_f64();
        stats::phase("restore", start.elapsed(), ok, bytes);
        tracing::info!(
            "restored CUDA state of {ok} of {of} process(es) in {secs:.2} s ({:.2} GiB, {:.2} GB/s)",
            gib(bytes),
            bytes as f64 / 1e9 / secs.max(1e-9)
        );
        for e in out.errors() {
            tracing::error!("{e}");
        }
    }
}

/// The GPU memory `f` had at the dump (0 when unknown).
fn device_bytes(f: &Found) -> u64 {
    f.record.gpus.iter().filter_map(|u| u.memory).sum()
}

/// The outcome of the restore of `f`, asked as `seq`.
fn restored(
    g: &mut Guardian,
    f: &Found,
    seq: Ticket<Answer>,
    limit: Duration,
) -> Result<(), RestoreError> {
    let failure = match g.take(seq) {
        Some(Ok(_)) => {
            if f.record.initial_state != ProcessState::Running {
                tracing::info!(
                    "CUDA {} was {} by someone else when it was dumped; it is restored running",
                    f.who(),
                    f.record.initial_state
                );
            }
            return Ok(());
        }
        Some(Err(e)) => ActionFailure::Driver(e),
        None => ActionFailure::Stuck { limit },
    };
    Err(RestoreError::Action {
        who: f.who(),
        failure,
    })
}

/// How long the restore of `ready` may take (CRIU_GPU_ACTION_TIMEOUT_S, else from the GPU memory
/// they had).
fn limit(settings: &RestoreSettings, ready: &[Restorable<'_>]) -> Duration {
    let bytes: u64 = ready.iter().map(|r| device_bytes(r.found)).sum();
    action_limit(settings.action_timeout, (bytes > 0).then_some(bytes))
}
