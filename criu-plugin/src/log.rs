//! Routes `tracing` events into CRIU's log, at CRIU's verbosity, prefixed with the plugin's name.
//! The C edge installs the writer ([`init`]); without one (tests, tools) lines go to stderr.
//!
//! CRIU's log buffer is not thread-safe: a line logged on any other thread than CRIU's (the one
//! that loaded the plugin) is queued and written by CRIU's thread at its next line. In a guardian
//! process (forked from CRIU) nothing is written to CRIU's log: the guardian reports to the plugin.

// Every function here reads as named steps (clippy.toml: at most 80 lines).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// CRIU's log levels (criu/include/log.h), which the writer receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CriuLevel {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

/// Writes one line into CRIU's log; `false` when there is no CRIU to write to.
pub type Writer = fn(CriuLevel, &str) -> bool;

struct CriuLog {
    prefix: &'static str,
}

static WRITER: std::sync::OnceLock<Writer> = std::sync::OnceLock::new();

/// CRIU's thread: the one that initialised the plugin (its tid equals the pid of that
/// process: CRIU's main thread).
static CRIU_THREAD: AtomicI32 = AtomicI32::new(0);
static IN_GUARDIAN: AtomicBool = AtomicBool::new(false);
static QUEUED: Mutex<Vec<(CriuLevel, String)>> = Mutex::new(Vec::new());

fn this_thread() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// Whether this is a thread other than CRIU's in CRIU's process. A process CRIU forks (a task
/// being restored runs some hooks) has one thread, its own.
fn off_criu_thread() -> bool {
    let main = CRIU_THREAD.load(Ordering::Relaxed);
    main != 0 && std::process::id() as i32 == main && this_thread() != main
}

/// Called first thing in a guardian process.
pub fn enter_guardian() {
    IN_GUARDIAN.store(true, Ordering::SeqCst);
}

fn write_line(level: CriuLevel, text: &str) {
    if !WRITER.get().is_some_and(|w| w(level, text)) {
        eprintln!("{text}");
    }
}

#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for CriuLog {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut line = Line::default();
        event.record(&mut line);
        let level = *event.metadata().level();
        if level == Level::TRACE {
            return;
        }
        let (criu_level, tag) = match level {
            Level::ERROR => (CriuLevel::Error, "Error: "),
            Level::WARN => (CriuLevel::Warn, "Warn: "),
            Level::INFO => (CriuLevel::Info, ""),
            _ => (CriuLevel::Debug, ""),
        };
        if IN_GUARDIAN.load(Ordering::Relaxed) {
            return;
        }
        // CRIU's own error lines read "Error (file:line): ..."; ours name the plugin instead.
        let text = format!("{tag}{}: {}{}", self.prefix, line.message, line.fields);
        let mut queue = QUEUED.lock().unwrap_or_else(|e| e.into_inner());
        if off_criu_thread() {
            queue.push((criu_level, text));
            return;
        }
        for (level, queued) in queue.drain(..) {
            write_line(level, &queued);
        }
        drop(queue);
        write_line(criu_level, &text);
    }
}

/// Installs CRIU's log, written by `writer` with lines prefixed `prefix:`, as this library's
/// tracing subscriber (once per process), from CRIU's thread.
pub fn init(prefix: &'static str, writer: Writer) {
    let _ = CRIU_THREAD.compare_exchange(0, this_thread(), Ordering::SeqCst, Ordering::SeqCst);
    let _ = WRITER.set(writer);
    let _ = tracing_subscriber::registry()
        .with(CriuLog { prefix })
        .try_init();
}

/// Writes lines other threads queued (CRIU's thread calls this when a hook returns).
pub fn flush() {
    if off_criu_thread() {
        return;
    }
    let lines: Vec<(CriuLevel, String)> = QUEUED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain(..)
        .collect();
    for (level, text) in lines {
        write_line(level, &text);
    }
}
