//! Progress of a CRIU dump or restore, read from its log as it grows: the plugin's lines (GPU
//! locks, checkpoint, restore, with sizes and GB/s) and the project's CRIU's page lines (every
//! 2 s per process, and a line per process when it is done). On a terminal one line is redrawn;
//! otherwise each event is a line of its own.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::out;

/// What a log line says, if it says anything about progress.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// `criu_gpu: locked N CUDA process(es) ...`
    Locked(String),
    /// `criu_gpu: checkpointed ...` / `criu_gpu: restored CUDA state ...`
    Gpu(String),
    /// Pages of a process so far: (pid or image id, GiB done, GiB in all if known).
    Pages {
        key: String,
        done: f64,
        of: Option<f64>,
    },
    /// A process's pages are planned, to be copied while criu goes on (patch 0006): GiB.
    Planned { key: String, of: f64 },
    /// A process's pages are all written or read.
    PagesDone { key: String, line: String },
    /// An error line of CRIU's or the plugin's.
    Error(String),
}

/// Reads one log line.
pub fn parse(line: &str) -> Option<Event> {
    // "(00.123456) criu_gpu: ..." or "(00.123456) pages: pid 12: wrote 1.5 of at most 8.0 GiB, ..."
    let text = line.split_once(") ").map_or(line, |(_, t)| t);
    if text.starts_with("Error") || text.contains("Error (") {
        return Some(Event::Error(text.to_owned()));
    }
    if let Some(rest) = text.strip_prefix("criu_gpu: ") {
        if rest.starts_with("locked ") {
            return Some(Event::Locked(rest.to_owned()));
        }
        if rest.starts_with("checkpointed ") || rest.starts_with("restored CUDA state") {
            return Some(Event::Gpu(rest.to_owned()));
        }
        if rest.starts_with("Error") {
            return Some(Event::Error(rest.to_owned()));
        }
        return None;
    }
    let rest = text.strip_prefix("pages")?;
    // Per process, done: "pages: pid N: wrote X GiB in T s, ..." / "... read X GiB in T s, ...".
    if let Some(r) = rest.strip_prefix(": pid ") {
        let (pid, what) = r.split_once(": ")?;
        // "planned 8.00 GiB in 0.40 s, to be copied while criu goes on"
        if let Some(p) = what.strip_prefix("planned ") {
            return Some(Event::Planned {
                key: format!("pid {pid}"),
                of: p.split_whitespace().next()?.parse().ok()?,
            });
        }
        if what.contains(" in ") && !what.contains(" of ") {
            return Some(Event::PagesDone {
                key: format!("pid {pid}"),
                line: what.to_owned(),
            });
        }
        // "wrote 1.5 of at most 8.0 GiB, 3.2 GB/s", "copied 1.5 of 8.0 GiB, 3.2 GB/s, ..."
        let mut words = what.split_whitespace().skip(1);
        let done: f64 = words.next()?.parse().ok()?;
        let of = what
            .split(" of ")
            .nth(1)
            .map(|t| t.trim_start_matches("at most "))
            .and_then(|t| t.split_whitespace().next()?.parse().ok());
        return Some(Event::Pages {
            key: format!("pid {pid}"),
            done,
            of,
        });
    }
    // Restore: "pages N: read X of Y GiB, Z GB/s" (N: the pages image).
    let (id, what) = rest.trim_start().split_once(": ")?;
    let mut words = what.split_whitespace();
    if words.next()? != "read" {
        return None;
    }
    let done: f64 = words.next()?.parse().ok()?;
    let of = what
        .split(" of ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next()?.parse().ok());
    Some(Event::Pages {
        key: format!("image {id}"),
        done,
        of,
    })
}

/// The display.
pub struct Progress {
    started: Instant,
    live: bool,
    phase: &'static str,
    pages: BTreeMap<String, (f64, Option<f64>)>,
    pub errors: Vec<String>,
    drawn: bool,
}

impl Progress {
    pub fn new(phase: &'static str) -> Progress {
        Progress {
            started: Instant::now(),
            live: out::is_terminal(),
            phase,
            pages: BTreeMap::new(),
            errors: Vec::new(),
            drawn: false,
        }
    }

    fn say(&mut self, text: &str) {
        if self.drawn {
            out::write_raw("\r\x1b[2K");
            self.drawn = false;
        }
        out::line(format!(
            "[{:6.1} s] {text}",
            self.started.elapsed().as_secs_f64()
        ));
    }

    pub fn event(&mut self, e: Event) {
        match e {
            Event::Locked(t) | Event::Gpu(t) => self.say(&format!("GPU: {t}")),
            Event::PagesDone { key, line } => {
                self.pages.remove(&key);
                self.say(&format!("pages of {key}: {line}"));
            }
            Event::Planned { key, of } => {
                self.pages.insert(key.clone(), (0.0, Some(of)));
                self.say(&format!(
                    "pages of {key}: {of:.2} GiB planned, copied while criu goes on"
                ));
            }
            Event::Pages { key, done, of } => {
                self.pages.insert(key.clone(), (done, of));
                if self.live {
                    self.draw();
                } else {
                    // CRIU writes these every 2 s: a line each is not too many.
                    let of = of.map_or(String::new(), |o| format!(" of {o:.1}"));
                    self.say(&format!("pages of {key}: {done:.1}{of} GiB"));
                }
            }
            Event::Error(t) => self.errors.push(t),
        }
    }

    /// The live line: the phase, the time, and each process's pages so far.
    fn draw(&mut self) {
        let parts: Vec<String> = self
            .pages
            .iter()
            .map(|(k, (d, of))| match of {
                Some(of) => format!("{k} {d:.1}/{of:.1} GiB"),
                None => format!("{k} {d:.1} GiB"),
            })
            .collect();
        out::write_raw(&format!(
            "\r\x1b[2K{} {:.1} s: {}",
            self.phase,
            self.started.elapsed().as_secs_f64(),
            parts.join(", ")
        ));
        self.drawn = true;
    }

    pub fn finish(&mut self) {
        if self.drawn {
            out::write_raw("\r\x1b[2K");
            self.drawn = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_plugins_and_the_page_lines() {
        assert_eq!(
            parse("(00.105370) criu_gpu: locked 2 CUDA process(es) at once in 0.9 ms"),
            Some(Event::Locked(
                "locked 2 CUDA process(es) at once in 0.9 ms".into()
            ))
        );
        assert!(matches!(
            parse("(01.5) criu_gpu: checkpointed 2 CUDA process(es), 5.14 GiB of device memory, in 1.41 s (3.91 GB/s)"),
            Some(Event::Gpu(_))
        ));
        assert_eq!(
            parse("(02.0) pages: pid 12: wrote 1.5 of at most 8.0 GiB, 3.20 GB/s"),
            Some(Event::Pages {
                key: "pid 12".into(),
                done: 1.5,
                of: Some(8.0)
            })
        );
        assert!(matches!(
            parse("(04.0) pages: pid 12: wrote 8.00 GiB in 2.40 s, 3.58 GB/s, 16 threads"),
            Some(Event::PagesDone { .. })
        ));
        // Patch 0006: planned, copied while criu goes on, done.
        assert_eq!(
            parse(
                "(01.0) pages: pid 12: planned 8.00 GiB in 0.40 s, to be copied while criu goes on"
            ),
            Some(Event::Planned {
                key: "pid 12".into(),
                of: 8.0
            })
        );
        assert_eq!(
            parse("(03.0) pages: pid 12: copied 2.5 of 8.0 GiB, 3.90 GB/s, while criu goes on"),
            Some(Event::Pages {
                key: "pid 12".into(),
                done: 2.5,
                of: Some(8.0)
            })
        );
        assert!(matches!(
            parse("(05.0) pages: pid 12: copied 8.00 GiB in 2.10 s, 4.09 GB/s, 4 threads, while criu went on"),
            Some(Event::PagesDone { .. })
        ));
        assert_eq!(
            parse("(03.0) pages 7: read 2.0 of 8.0 GiB, 9.10 GB/s"),
            Some(Event::Pages {
                key: "image 7".into(),
                done: 2.0,
                of: Some(8.0)
            })
        );
        assert!(matches!(
            parse("(00.2) Error (criu/cr-dump.c:1979): Dumping FAILED."),
            Some(Event::Error(_))
        ));
        assert_eq!(parse("(00.2) Seized task 50, state 1"), None);
    }
}
