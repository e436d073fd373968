//! cuda-checkpoint-ctl alone: a process and a tree suspended to host memory and resumed, and
//! the driver's steps one by one as NVIDIA's cuda-checkpoint takes them.

use gpu_ckpt_tests::scenario::{Host, Work};
use gpu_ckpt_tests::{stderr, stdout};

use crate::data_mib;

#[test]
fn a_process_suspended_to_host_memory_gives_back_its_gpu_and_resumes_with_its_data() {
    let mut host = Host::start();
    let mib = data_mib(&host);
    let app = host.app("app", &Work::mib(mib));
    let p = app.pid.to_string();
    let before = host.gpu_memory_of(app.pid);
    assert!(
        before >= mib << 20,
        "it holds its data on the GPU: {before} bytes"
    );
    let out = host.ctl(&["--suspend", "--pid", &p, "--timeout", "10000", "--json"]);
    assert!(out.status.success(), "suspend: {}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["processes"].as_array().is_some_and(|a| a.len() == 1));
    assert_eq!(host.state(app.pid), "checkpointed");
    let during = host.gpu_memory_of(app.pid);
    assert_eq!(
        during, 0,
        "GPU memory of the process: {before} bytes before, {during} while checkpointed"
    );
    let fds = std::fs::read_dir(format!("/proc/{p}/fd")).unwrap();
    let nvidia = fds
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with("/dev/nvidia"))
        .count();
    assert_eq!(nvidia, 0, "no /dev/nvidia* open while checkpointed");
    let out = host.ctl(&["--resume", "--pid", &p, "--json"]);
    assert!(out.status.success(), "resume: {}", stderr(&out));
    host.runs_with_its_data(&app);
}

#[test]
fn a_tree_is_suspended_and_resumed_as_one() {
    let mut host = Host::start();
    let tree = host.tree("tree", 3, &Work::mib(data_mib(&host) / 2));
    let root = tree.root.to_string();
    let out = host.ctl(&["--suspend", "--tree", &root, "--timeout", "10000", "--json"]);
    assert!(out.status.success(), "suspend --tree: {}", stderr(&out));
    let states = stdout(&host.ctl(&["--get-state", "--tree", &root]));
    assert_eq!(
        states.matches("checkpointed").count(),
        3,
        "get-state --tree: {states}"
    );
    let out = host.ctl(&["--resume", "--tree", &root, "--json"]);
    assert!(out.status.success(), "resume --tree: {}", stderr(&out));
    for app in &tree.apps {
        host.runs_with_its_data(app);
    }
}

#[test]
fn the_driver_steps_one_by_one_as_cuda_checkpoint_takes_them() {
    let mut host = Host::start();
    let app = host.app("app", &Work::mib(data_mib(&host) / 4));
    let p = app.pid.to_string();
    let tid = stdout(&host.ctl(&["--get-restore-tid", "--pid", &p]));
    assert!(
        std::path::Path::new(&format!("/proc/{p}/task/{}", tid.trim())).exists(),
        "get-restore-tid names a thread of the process: {tid:?}"
    );
    // A restore map names every GPU the driver saw (docs/driver-facts.md): here each onto itself.
    let same_gpu = host
        .gpu_uuids()
        .iter()
        .map(|u| format!("{u}={u}"))
        .collect::<Vec<_>>()
        .join(",");
    for (args, state) in [
        (vec!["--action", "lock", "--timeout", "5000"], "locked"),
        (vec!["--action", "checkpoint"], "checkpointed"),
        (
            vec!["--action", "restore", "--device-map", &same_gpu],
            "locked",
        ),
        (vec!["--action", "unlock"], "running"),
        (vec!["--toggle"], "checkpointed"),
        (vec!["--toggle"], "running"),
    ] {
        let mut a = args.clone();
        a.extend(["--pid", &p]);
        let out = host.ctl(&a);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(host.state(app.pid), state, "after {args:?}");
    }
    host.runs_with_its_data(&app);
}
