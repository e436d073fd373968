//! A GPU process beside a libuv-like event loop on io_uring (third_party/criu/tests/uring-app.c:
//! an epoll-control ring without SQ array and a file ring, serving requests on a unix socket),
//! through `criu-gpu` and the project's CRIU (patch 0008): dumped and restored with nothing set
//! by hand, the GPU process going on with its data and the loop still serving. Stock CRIU, which
//! fails on any ring after the GPU checkpoint, is still refused before anything is frozen, and so
//! is a ring with a request in flight.

use std::path::PathBuf;

use gpu_ckpt_tests::criu::{Criu, STOCK};
use gpu_ckpt_tests::job::*;
use gpu_ckpt_tests::uring::start_tree;
use gpu_ckpt_tests::*;

#[test]
fn a_gpu_process_beside_an_event_loop_on_io_uring_is_dumped_and_restored_and_the_loop_serves() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let t = start_tree(&mut sim, "", 50);
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
    let t = start_tree(&mut sim, "", 50);
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
    let t = start_tree(&mut sim, "--pending", 50);
    let images = sim.dir.join("img-pending");
    let root = t.app.pid.to_string();
    let out = criu_gpu(&sim, &c, &["dump", &root, images.to_str().unwrap()], &[]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("request(s) in flight"), "{said}");
    assert!(!images.join("dump.log").exists(), "criu never ran");
    assert!(t.app.advances(3) && t.serves());
}
