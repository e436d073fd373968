//! What a node command shows while it runs (steps, progress, its summary), through the screen
//! the command line installs: `criu-gpu`'s standard output, which ends quietly when its reader
//! goes. Until one is installed nothing is shown, so the library never writes on its own.

use std::sync::OnceLock;

/// Where the lines go.
pub trait Screen: Send + Sync {
    /// Writes `text` as is (the progress display draws with it).
    fn write(&self, text: &str);
    /// Whether it is a terminal that is still there (for live displays).
    fn is_terminal(&self) -> bool;
}

static SCREEN: OnceLock<Box<dyn Screen>> = OnceLock::new();

/// Installs the screen for the rest of the process; a second one is ignored.
pub fn install(screen: Box<dyn Screen>) {
    let _ = SCREEN.set(screen);
}

/// `text` and a newline.
pub fn line(text: impl AsRef<str>) {
    raw(&format!("{}\n", text.as_ref()));
}

/// `text` as is.
pub fn raw(text: &str) {
    if let Some(s) = SCREEN.get() {
        s.write(text);
    }
}

/// `value` as pretty JSON.
pub fn json(value: &impl serde::Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => line(text),
        Err(e) => line(format!("{{\"error\": \"encoding the output: {e}\"}}")),
    }
}

pub fn is_terminal() -> bool {
    SCREEN.get().is_some_and(|s| s.is_terminal())
}
