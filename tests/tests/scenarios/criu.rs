//! Dumps and restores with the real CRIU and the plugin: a process, a tree checkpointed
//! concurrently and one process at a time, `--leave-running`, and a dump CRIU fails after the
//! GPU checkpoint.

use std::os::unix::net::UnixListener;

use gpu_ckpt_tests::criu::{self, assert_ok, Criu};
use gpu_ckpt_tests::scenario::{Host, Work};
use gpu_ckpt_tests::{signal, wait_gone};
use nix::sys::signal::Signal;

use crate::{data_mib, dump_kill_restore};

#[test]
fn a_process_is_dumped_and_restored_with_its_device_data() {
    let mut host = Host::start();
    let c = Criu::new(&host);
    let app = host.app("app", &Work::mib(data_mib(&host)));
    let images = host.path("img");
    dump_kill_restore(&mut host, &c, app.pid, &[&app], &images, &[]);
    // The plugin's phase times as data: what the benchmarks read.
    use criu_gpu_image::timings::{read, Command};
    let dump = read(&images, Command::Dump).unwrap().expect("dump timings");
    let restore = read(&images, Command::Restore)
        .unwrap()
        .expect("restore timings");
    assert_eq!(dump.phase("checkpoint").map(|p| p.processes), Some(1));
    assert_eq!(restore.phase("restore").map(|p| p.processes), Some(1));
}

#[test]
fn a_tree_is_checkpointed_concurrently_and_one_process_at_a_time() {
    let mut host = Host::start();
    let c = Criu::new(&host);
    for parallel in ["1", "0"] {
        let tree = host.tree(
            &format!("tree{parallel}"),
            3,
            &Work::mib(data_mib(&host) / 2),
        );
        let apps: Vec<_> = tree.apps.iter().collect();
        let images = host.path(&format!("img-{parallel}"));
        let env = [("CRIU_GPU_PARALLEL", parallel)];
        dump_kill_restore(&mut host, &c, tree.root, &apps, &images, &env);
        let log = criu::log(&images, "dump.log");
        assert!(
            log.contains("checkpointed 3 CUDA process"),
            "CRIU_GPU_PARALLEL={parallel}: {}",
            criu::tail(&log, 20)
        );
        signal(tree.root, Signal::SIGKILL);
        for app in &tree.apps {
            signal(app.pid, Signal::SIGKILL);
            wait_gone(app.pid);
        }
    }
}

#[test]
fn leave_running_keeps_the_process_going_and_the_image_restores_later() {
    let mut host = Host::start();
    let c = Criu::new(&host);
    let mib = data_mib(&host);
    let app = host.app("app", &Work::mib(mib));
    let images = host.path("img");
    let out = c.dump(&host, app.pid, &images, &["--leave-running"], &[]);
    assert_ok(&out, &images, "dump.log");
    host.runs_with_its_data(&app);
    assert!(
        host.gpu_memory_of(app.pid) >= mib << 20,
        "its GPU memory is back"
    );
    // Later: the process is lost, and comes back from the image.
    signal(app.pid, Signal::SIGKILL);
    wait_gone(app.pid);
    assert_ok(&c.restore(&host, &images, &[], &[]), &images, "restore.log");
    host.own(app.pid);
    host.runs_with_its_data(&app);
}

#[test]
fn criu_failing_after_the_checkpoint_puts_the_gpu_state_back() {
    let mut host = Host::start();
    let c = Criu::new(&host);
    // A socket CRIU cannot dump: the dump fails when it reaches the files, after the GPU
    // checkpoint.
    let outside = host.path("outside.sock");
    let listener = UnixListener::bind(&outside).unwrap();
    let mib = data_mib(&host);
    let app = host.app_holding("app", &Work::mib(mib), Some(&outside));
    let _conn = listener.accept().unwrap();
    let images = host.path("img");
    let out = c.dump(&host, app.pid, &images, &[], &[]);
    assert!(!out.status.success(), "the dump was expected to fail");
    let log = criu::log(&images, "dump.log");
    assert!(
        log.contains("checkpointed 1 CUDA process"),
        "the GPU part had succeeded: {}",
        criu::tail(&log, 30)
    );
    assert!(
        log.contains("returned to its state before the dump"),
        "{}",
        criu::tail(&log, 30)
    );
    host.runs_with_its_data(&app);
    assert!(
        host.gpu_memory_of(app.pid) >= mib << 20,
        "its GPU memory is back"
    );
}
