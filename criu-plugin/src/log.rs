//! Routes `tracing` events into CRIU's log, at CRIU's verbosity, prefixed with the plugin's name.
//! Outside CRIU (tests, tools) the lines go to stderr instead.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

use crate::abi::criu;
use crate::core::NAME;

struct CriuLog;

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
            Level::ERROR => (criu::LOG_ERROR, "Error: "),
            Level::WARN => (criu::LOG_WARN, "Warn: "),
            Level::INFO => (criu::LOG_INFO, ""),
            _ => (criu::LOG_DEBUG, ""),
        };
        // CRIU's own error lines read "Error (file:line): ..."; ours name the plugin instead.
        let text = format!("{tag}{NAME}: {}{}", line.message, line.fields);
        if !criu::log(criu_level, &text) {
            eprintln!("{text}");
        }
    }
}

/// Installs the CRIU log as this library's tracing subscriber (once per process).
pub fn init() {
    let _ = tracing_subscriber::registry().with(CriuLog).try_init();
}
