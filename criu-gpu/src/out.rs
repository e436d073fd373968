//! Standard output as operators meet it: a reader that goes away (`criu-gpu ... | head`) ends
//! the output quietly, never a panic, and never the work: a drain whose terminal closed still
//! finishes, and its exit status still tells how it went.

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` and a newline to stdout; once stdout is gone, writes nothing more.
pub fn line(text: impl AsRef<str>) {
    write_raw(&format!("{}\n", text.as_ref()));
}

/// Writes `text` as is (the progress display draws with it).
pub fn write_raw(text: &str) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = io::stdout().lock();
    let result = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
    if let Err(e) = result {
        // EPIPE, or any other failure to write: the reader is gone; stop talking to it.
        if e.kind() != io::ErrorKind::BrokenPipe {
            tracing::debug!("stdout: {e}");
        }
        CLOSED.store(true, Ordering::Relaxed);
    }
}

/// `value` as pretty JSON on stdout.
pub fn json(value: &impl serde::Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => line(text),
        Err(e) => line(format!("{{\"error\": \"encoding the output: {e}\"}}")),
    }
}

/// True when stdout is a terminal that is still there (for live displays).
pub fn is_terminal() -> bool {
    !CLOSED.load(Ordering::Relaxed) && io::stdout().is_terminal()
}

/// Standard output as a node command's screen (`criu_gpu_node::screen`).
pub struct Stdout;

impl criu_gpu_node::screen::Screen for Stdout {
    fn write(&self, text: &str) {
        write_raw(text);
    }
    fn is_terminal(&self) -> bool {
        is_terminal()
    }
}
