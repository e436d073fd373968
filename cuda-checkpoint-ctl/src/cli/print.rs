//! Output: lines on stdout that end quietly when the reader goes away (`... | head -1`), JSON,
//! and human-readable sizes.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once stdout could not be written (a closed pipe): nobody reads any more.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Prints one line on stdout; once the reader is gone, prints nothing more.
pub fn line(text: &str) {
    if CLOSED.load(Ordering::SeqCst) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
        CLOSED.store(true, Ordering::SeqCst);
    }
}

pub fn json(v: &serde_json::Value) {
    line(&serde_json::to_string_pretty(v).unwrap_or_default());
}

/// An error as the JSON modes report it.
pub fn json_error(text: &str) {
    json(&serde_json::json!({ "error": text }));
}

/// A size for the tables (`process_facts::units`).
pub fn human(bytes: u64) -> String {
    process_facts::units::bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 30), "3.00 GiB");
    }
}
