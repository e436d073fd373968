//! A GPU process beside a libuv-like event loop on io_uring (third_party/criu/tests/uring-app.c:
//! an epoll-control ring without SQ array and a file ring, serving requests on a unix socket),
//! through `criu-gpu` and the project's CRIU (patch 0008): dumped and restored with nothing set
//! by hand, the GPU process going on with its data and the loop still serving. Stock CRIU, which
//! fails on any ring after the GPU checkpoint, is still refused before anything is frozen, and so
//! is a ring with a request in flight.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpu_ckpt_tests::criu::{Criu, STOCK};
use gpu_ckpt_tests::job::*;
use gpu_ckpt_tests::*;

const DATA: &str = "data for the io_uring test\n";

/// uring-app, built with the system's C compiler.
fn uring_app(dir: &Path) -> PathBuf {
    let bin = dir.join("uring-app");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../third_party/criu/tests/uring-app.c");
    let out = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(out.status.success(), "cc: {}", stderr(&out));
    bin
}

/// A tree: cuda-sim-app (the root, 8 MiB on the simulated GPU) with the event loop as its child,
/// serving on `dir/loop.sock`; `extra` options for the loop.
struct Tree {
    app: App,
    app_bin: PathBuf,
    sock: PathBuf,
}

fn start_tree(sim: &mut Sim, extra: &str) -> Tree {
    let app_bin = uring_app(&sim.dir);
    let data = sim.dir.join("data");
    std::fs::write(&data, DATA).unwrap();
    let sock = sim.dir.join("loop.sock");
    let log = sim.dir.join("gpu.log");
    let script = format!(
        "{} serve {} {} {extra} >{} 2>&1 </dev/null & exec {} --log {} --mib 8 --interval-ms 50",
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
    fn ask(&self, request: &str) -> String {
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
    fn serves(&self) -> bool {
        self.ask("read") == format!("read {} {}", DATA.len(), DATA.trim_end())
            && self.ask("pipe").starts_with("pipe word")
            && self.ask("nop") == "nop 0"
    }
}

#[test]
fn a_gpu_process_beside_an_event_loop_on_io_uring_is_dumped_and_restored_and_the_loop_serves() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let t = start_tree(&mut sim, "");
    assert!(t.serves(), "before the dump");
    let images = sim.dir.join("img");
    let root = t.app.pid.to_string();
    let out = criu_gpu(&sim, &c, &["dump", &root, images.to_str().unwrap()], &[]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(!said.contains("problem:"), "{said}");
    wait_gone(t.app.pid);
    let out = criu_gpu(&sim, &c, &["restore", images.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(t.app.advances(3), "{}", t.app.tail());
    t.app.assert_healthy();
    assert!(t.serves(), "after the restore: {}", t.ask("state"));
    assert!(t.serves(), "and again");
}

#[test]
fn stock_criu_and_a_ring_with_a_request_in_flight_are_refused_before_anything_is_frozen() {
    let mut sim = Sim::start();
    let stock = Criu {
        bin: PathBuf::from(STOCK),
        ..Criu::new(&sim)
    };
    let t = start_tree(&mut sim, "");
    let images = sim.dir.join("img-stock");
    let root = t.app.pid.to_string();
    let out = criu_gpu(
        &sim,
        &stock,
        &["dump", &root, images.to_str().unwrap()],
        &[],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("holds io_uring instances")
            && said.contains("which this CRIU cannot dump")
            && said.contains("patch 0008"),
        "{said}"
    );
    assert!(!images.join("dump.log").exists(), "criu never ran");
    assert!(t.app.advances(3) && t.serves());

    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let t = start_tree(&mut sim, "--pending");
    let images = sim.dir.join("img-pending");
    let root = t.app.pid.to_string();
    let out = criu_gpu(&sim, &c, &["dump", &root, images.to_str().unwrap()], &[]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("request(s) in flight"), "{said}");
    assert!(!images.join("dump.log").exists(), "criu never ran");
    assert!(t.app.advances(3) && t.serves());
}
