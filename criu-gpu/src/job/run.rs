//! Runs criu as a child and follows its log until it ends: progress on the way, SIGINT and
//! SIGTERM passed on to it, and a bound on the whole run (past it criu gets SIGTERM, then
//! SIGKILL; the plugin's guardian puts GPU processes back whatever ends criu).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::progress::{parse, Progress};
use super::signals;

/// How criu ended.
#[derive(Debug)]
pub struct Ran {
    pub ok: bool,
    /// CRIU's exit code, or the signal that ended it.
    pub status: String,
    pub took: Duration,
    /// Error lines of its log (the last ones say why it failed).
    pub errors: Vec<String>,
    /// The program criu ran as, last seen (through a wrapper script's exec: the real binary).
    pub program: Option<PathBuf>,
}

/// Runs `criu ARGS` with `env`, following `log` (written by criu with `-o`), for at most `limit`.
pub fn criu(
    criu: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
    phase: &'static str,
    limit: Duration,
) -> std::io::Result<Ran> {
    let _ = std::fs::remove_file(log);
    signals::catch();
    let start = Instant::now();
    let mut child = Command::new(criu)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    let pid = Pid::from_raw(child.id() as i32);
    let mut progress = Progress::new(phase);
    let mut offset = 0u64;
    let mut partial = String::new();
    let mut term_sent: Option<Instant> = None;
    let mut program = None;
    let status = loop {
        follow(log, &mut offset, &mut partial, &mut progress);
        if let Ok(p) = std::fs::read_link(format!("/proc/{pid}/exe")) {
            program = Some(p);
        }
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if let Some(sig) = signals::take() {
            let _ = kill(pid, sig);
        }
        if start.elapsed() > limit {
            match term_sent {
                None => {
                    progress.errors.push(format!(
                        "criu ran longer than {} s: stopped (its GPU processes are put back)",
                        limit.as_secs()
                    ));
                    let _ = kill(pid, Signal::SIGTERM);
                    term_sent = Some(Instant::now());
                }
                Some(t) if t.elapsed() > Duration::from_secs(30) => {
                    let _ = kill(pid, Signal::SIGKILL);
                }
                Some(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    follow(log, &mut offset, &mut partial, &mut progress);
    progress.finish();
    let status_text = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown".into(),
    };
    Ok(Ran {
        ok: status.success(),
        status: status_text,
        took: start.elapsed(),
        errors: progress.errors,
        program,
    })
}

/// Reads what was added to the log since `offset` and passes each whole line on.
fn follow(log: &Path, offset: &mut u64, partial: &mut String, progress: &mut Progress) {
    let Ok(mut f) = std::fs::File::open(log) else {
        return;
    };
    if f.seek(SeekFrom::Start(*offset)).is_err() {
        return;
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return;
    }
    *offset += buf.len() as u64;
    partial.push_str(&String::from_utf8_lossy(&buf));
    while let Some(end) = partial.find('\n') {
        let line: String = partial.drain(..=end).collect();
        if let Some(e) = parse(line.trim_end()) {
            progress.event(e);
        }
    }
}
