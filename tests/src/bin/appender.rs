//! `appender LOG INTERVAL_MS [PROGRAM ARGS...]`: a job's log writer, as `tee -a`, `>>` or Python's
//! `logging.FileHandler` is: LOG opened once, write-only for appending (O_WRONLY|O_APPEND), and a
//! numbered line (`line N`) appended every INTERVAL_MS. PROGRAM, if given, is started first as
//! its child (the job's GPU process), its output thrown away.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: appender LOG INTERVAL_MS [PROGRAM ARGS...]";
    let (log, interval) = match (args.first(), args.get(1).and_then(|a| a.parse().ok())) {
        (Some(log), Some(ms)) => (log.clone(), Duration::from_millis(ms)),
        _ => panic!("{usage}"),
    };
    let _child = args.get(2).map(|program| {
        Command::new(program)
            .args(&args[3..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e}"))
    });
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&log)
        .unwrap_or_else(|e| panic!("opening {log}: {e}"));
    for n in 0u64.. {
        writeln!(f, "line {n}").unwrap_or_else(|e| panic!("appending to {log}: {e}"));
        std::thread::sleep(interval);
    }
}
