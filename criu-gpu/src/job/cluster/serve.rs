//! The unix socket through which CRIU's side of this node reaches the operation: the plugin's
//! lock rounds (`criu_gpu_image::cluster::Report` in, `Answer` out) and `criu-gpu` as CRIU's
//! action script at the barriers (`{"barrier": STAGE}` in, `{"ok": ..., "why": ...}` out). One
//! line of JSON each way; a thread per connection.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use criu_gpu_image::cluster::Report;
use serde::{Deserialize, Serialize};

use super::op::Op;

#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Incoming {
    Barrier { barrier: String },
    Round(Report),
}

/// The answer at a barrier.
#[derive(Debug, Serialize, Deserialize)]
pub struct Passed {
    pub ok: bool,
    pub why: Option<String>,
}

/// The socket, served while this lives; removed on drop.
pub struct Server {
    pub path: PathBuf,
}

impl Server {
    /// Serves `op` on a socket of its own (named from this process's id).
    pub fn start(op: Arc<Op>, barrier_limit: Duration) -> std::io::Result<Server> {
        let path = std::env::temp_dir().join(format!("criu-gpu-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let op = op.clone();
                std::thread::spawn(move || serve(&op, conn, barrier_limit));
            }
        });
        Ok(Server { path })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(op: &Op, conn: UnixStream, barrier_limit: Duration) {
    let Ok(mut writer) = conn.try_clone() else {
        return;
    };
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        let answer = match serde_json::from_str::<Incoming>(&line) {
            Ok(Incoming::Round(report)) => serde_json::to_string(&op.round(&report)),
            Ok(Incoming::Barrier { barrier }) => {
                let r = op.barrier(&barrier, barrier_limit);
                serde_json::to_string(&Passed {
                    ok: r.is_ok(),
                    why: r.err(),
                })
            }
            Err(e) => serde_json::to_string(&Passed {
                ok: false,
                why: Some(format!("criu-gpu cannot read {line:?}: {e}")),
            }),
        };
        let Ok(mut answer) = answer else { return };
        answer.push('\n');
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// `criu-gpu` as CRIU's action script at `stage`: waits at the operation's barrier through the
/// socket `path`; the reason when the job cannot go on.
pub fn barrier(path: &Path, stage: &str) -> Result<(), String> {
    let mut s = UnixStream::connect(path).map_err(|e| {
        format!(
            "this node's criu-gpu ({}) cannot be reached: {e}",
            path.display()
        )
    })?;
    let mut line = serde_json::json!({ "barrier": stage }).to_string();
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
    let mut answer = String::new();
    BufReader::new(s)
        .read_line(&mut answer)
        .map_err(|e| e.to_string())?;
    match serde_json::from_str::<Passed>(&answer) {
        Ok(Passed { ok: true, .. }) => Ok(()),
        Ok(Passed { why, .. }) => Err(why.unwrap_or_default()),
        Err(_) => Err("this node's criu-gpu went away".into()),
    }
}
