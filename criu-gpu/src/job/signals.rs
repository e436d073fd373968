//! SIGINT and SIGTERM while criu runs: noted here and passed on to criu, so that criu (and the
//! plugin's guardian, which puts GPU processes back whatever ends criu) decides what happens.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn note(sig: i32) {
    PENDING.store(sig, Ordering::SeqCst);
}

/// From now on SIGINT and SIGTERM are noted instead of ending this process.
pub fn catch() {
    let action = SigAction::new(
        SigHandler::Handler(note),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(sig, &action) };
    }
}

/// A signal noted since the last call.
pub fn take() -> Option<Signal> {
    match PENDING.swap(0, Ordering::SeqCst) {
        0 => None,
        s => Signal::try_from(s).ok(),
    }
}
