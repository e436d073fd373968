//! The late digests: the guardian's answer about the large pages images it checked while CRIU
//! restored. Before the restored tree runs, a damaged one fails the restore (the tree is killed;
//! the images are unchanged). The driver read them meanwhile, as it reads any memory of the
//! process.

use std::time::{Duration, Instant};

use super::Later;
use crate::backends::cuda::error::RestoreError;
use crate::backends::cuda::gib;
use crate::guardian::Guardian;

/// Waits for the check asked for in `init` (2 minutes, plus 2 s per GiB), and its answer.
pub(super) fn checked(g: &mut Guardian, later: &Later) -> Result<(), RestoreError> {
    let limit = Duration::from_secs(120) + Duration::from_secs(2 * later.bytes.div_ceil(1 << 30));
    let start = Instant::now();
    if !g.wait_all(&[later.seq], start + limit, &mut || {})? {
        return Err(RestoreError::PagesUnchecked {
            bytes: later.bytes,
            limit,
        });
    }
    match g.take(later.seq) {
        Some(Ok(())) => {
            tracing::info!(
                "pages images checked against their digests while CRIU restored ({:.2} GiB; \
                 waited {:.2} s for the check)",
                gib(later.bytes),
                start.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some(Err(e)) => Err(RestoreError::PagesDamaged(e)),
        None => Err(RestoreError::PagesNoAnswer),
    }
}
