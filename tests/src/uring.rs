//! A GPU process beside a libuv-like event loop on io_uring (third_party/criu/tests/uring-app.c:
//! an epoll-control ring without SQ array and a file ring, serving requests on a unix socket), as
//! the io_uring tests and the kill sweep start it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::*;

const DATA: &str = "data for the io_uring test\n";

/// uring-app, built with the system's C compiler.
fn uring_app(dir: &Path) -> PathBuf {
    let bin = dir.join("uring-app");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../third_party/criu/tests/uring-app.c");
    crate::artifacts::cc(&src, &bin, &["-O2"]);
    bin
}

/// A tree: cuda-sim-app (the root, 8 MiB on the simulated GPU) with the event loop as its child,
/// serving on `dir/loop.sock`.
pub struct Tree {
    pub app: App,
    app_bin: PathBuf,
    sock: PathBuf,
}

/// Starts the tree on `sim`; `extra`: options for the loop; `interval_ms`: the GPU process's.
pub fn start_tree(sim: &mut Sim, extra: &str, interval_ms: u32) -> Tree {
    let app_bin = uring_app(&sim.dir);
    let data = sim.dir.join("data");
    std::fs::write(&data, DATA).unwrap();
    let sock = sim.dir.join("loop.sock");
    let log = sim.dir.join("gpu.log");
    let script = format!(
        "{} serve {} {} {extra} >{} 2>&1 </dev/null & exec {} --log {} --mib 8 --interval-ms {interval_ms}",
        app_bin.display(),
        sock.display(),
        data.display(),
        sim.dir.join("loop.out").display(),
        artifact("cuda-sim-app").display(),
        log.display()
    );
    let child = Command::new("setsid")
        .args(["sh", "-c", &script])
        .envs(sim.env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = reap_in_background(child);
    sim.adopt(pid);
    let app = App { pid, log };
    assert!(
        wait_until(Duration::from_secs(20), || app.steps() >= 2),
        "{}",
        app.tail()
    );
    let t = Tree { app, app_bin, sock };
    assert!(
        wait_until(Duration::from_secs(20), || t.ask("nop").starts_with("nop")),
        "the loop does not serve"
    );
    t
}

impl Tree {
    pub fn ask(&self, request: &str) -> String {
        let out = Command::new(&self.app_bin)
            .arg("ask")
            .arg(&self.sock)
            .arg(request)
            .output()
            .unwrap();
        stdout(&out).trim().to_owned()
    }

    /// Every request answered right: a file read and a pipe through the file ring, a no-op, and
    /// each connection added to and removed from the epoll set through the control ring.
    pub fn serves(&self) -> bool {
        self.ask("read") == format!("read {} {}", DATA.len(), DATA.trim_end())
            && self.ask("pipe").starts_with("pipe word")
            && self.ask("nop") == "nop 0"
    }
}
