//! The live display of concurrent checkpoints: on a terminal, one line per container redrawn
//! in place with the aggregate throughput; otherwise (a pipe, a log, `--json`), one plain line
//! per change of state, so logs stay readable.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::human::{bytes, gbps, secs};
use crate::screen;

#[derive(Debug, Clone)]
pub enum Phase {
    Waiting,
    Checkpointing(Instant),
    Copying { done: u64, total: u64 },
    Saved { bytes: u64, took: Duration },
    Failed(String),
}

impl Phase {
    fn text(&self) -> String {
        match self {
            Phase::Waiting => "waiting".into(),
            Phase::Checkpointing(since) => format!("checkpointing ({})", secs(since.elapsed())),
            Phase::Copying { done, total } => {
                format!("copying to the store {} of {}", bytes(*done), bytes(*total))
            }
            Phase::Saved { bytes: b, took } => format!(
                "saved {} in {} ({})",
                bytes(*b),
                secs(*took),
                gbps(*b, *took)
            ),
            Phase::Failed(why) => format!("FAILED: {why}"),
        }
    }

    /// Copy progress is redrawn on a terminal, not logged line by line.
    fn is_noisy(&self) -> bool {
        matches!(self, Phase::Copying { .. })
    }
}

struct State {
    labels: Vec<String>,
    phases: Vec<Phase>,
    copied: Vec<u64>,
    drawn: usize,
}

pub struct Board {
    state: Arc<Mutex<State>>,
    start: Instant,
    live: bool,
    to_stderr: bool,
    stop: Arc<AtomicBool>,
    painter: Option<std::thread::JoinHandle<()>>,
}

impl Board {
    /// `to_stderr`: progress goes to stderr (stdout carries JSON).
    pub fn new(labels: Vec<String>, to_stderr: bool) -> Board {
        let n = labels.len();
        let state = Arc::new(Mutex::new(State {
            labels,
            phases: vec![Phase::Waiting; n],
            copied: vec![0; n],
            drawn: 0,
        }));
        let live = !to_stderr && screen::is_terminal();
        let stop = Arc::new(AtomicBool::new(false));
        let mut board = Board {
            state,
            start: Instant::now(),
            live,
            to_stderr,
            stop,
            painter: None,
        };
        if live {
            let (state, stop, start) = (board.state.clone(), board.stop.clone(), board.start);
            board.painter = Some(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    paint(&state, start);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }));
        }
        board
    }

    pub fn set(&self, i: usize, phase: Phase) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &phase {
            Phase::Copying { done, .. } => s.copied[i] = *done,
            Phase::Saved { bytes, .. } => s.copied[i] = *bytes,
            _ => {}
        }
        if !self.live && !phase.is_noisy() {
            let line = format!(
                "[{}/{}] {}: {}",
                i + 1,
                s.labels.len(),
                s.labels[i],
                phase.text()
            );
            if self.to_stderr {
                eprintln!("{line}");
            } else {
                screen::line(line);
            }
        }
        s.phases[i] = phase;
    }

    /// Stops the display; returns the bytes saved and the time since the start.
    pub fn finish(mut self) -> (u64, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(p) = self.painter.take() {
            let _ = p.join();
            paint(&self.state, self.start);
        }
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let saved = s
            .phases
            .iter()
            .map(|p| match p {
                Phase::Saved { bytes, .. } => *bytes,
                _ => 0,
            })
            .sum();
        (saved, self.start.elapsed())
    }
}

fn paint(state: &Mutex<State>, start: Instant) {
    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
    let mut text = String::new();
    if s.drawn > 0 {
        text.push_str(&format!("\x1b[{}A", s.drawn));
    }
    for (i, (label, phase)) in s.labels.iter().zip(&s.phases).enumerate() {
        text.push_str(&format!(
            "\x1b[2K[{}/{}] {label}: {}\n",
            i + 1,
            s.labels.len(),
            phase.text()
        ));
    }
    let moved: u64 = s.copied.iter().sum();
    let saved = s
        .phases
        .iter()
        .filter(|p| matches!(p, Phase::Saved { .. }))
        .count();
    text.push_str(&format!(
        "\x1b[2K{saved} of {} saved, {} in {} ({})\n",
        s.labels.len(),
        bytes(moved),
        secs(start.elapsed()),
        gbps(moved, start.elapsed())
    ));
    s.drawn = s.labels.len() + 1;
    screen::raw(&text);
}
