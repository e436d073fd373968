//! The unix socket on which CRIU's post-dump action (criu-gpu, run by CRIU as its action script)
//! asks the sending `criu-gpu` to send the images, while the job is frozen and before CRIU
//! serves the pages. The script's side is the barrier client of jobs across machines
//! (`cluster::serve::barrier`): one line `{"barrier": STAGE}` in, `{"ok": ..., "why": ...}` out.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use serde::Deserialize;

use crate::job::cluster::serve::Passed;

#[derive(Deserialize)]
struct Asked {
    barrier: String,
}

/// The socket, served while this lives; removed on drop.
pub struct StageServer {
    pub path: PathBuf,
}

impl StageServer {
    /// Answers each stage CRIU's action script reaches with `act(stage)`.
    pub fn start(
        act: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static,
    ) -> std::io::Result<StageServer> {
        let path = std::env::temp_dir().join(format!("criu-gpu-move-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let act = std::sync::Arc::new(act);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let act = act.clone();
                std::thread::spawn(move || serve(conn, &*act));
            }
        });
        Ok(StageServer { path })
    }
}

impl Drop for StageServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(conn: UnixStream, act: &dyn Fn(&str) -> Result<(), String>) {
    let Ok(mut writer) = conn.try_clone() else {
        return;
    };
    let mut line = String::new();
    if BufReader::new(conn).read_line(&mut line).is_err() {
        return;
    }
    let r = match serde_json::from_str::<Asked>(&line) {
        Ok(a) => act(&a.barrier),
        Err(e) => Err(format!("criu-gpu cannot read {line:?}: {e}")),
    };
    let passed = Passed {
        ok: r.is_ok(),
        why: r.err(),
    };
    if let Ok(mut answer) = serde_json::to_string(&passed) {
        answer.push('\n');
        let _ = writer.write_all(answer.as_bytes());
    }
}
