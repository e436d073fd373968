//! --device-map: partial pairs and `auto` completed with this machine's GPUs into the complete
//! map the driver needs (docs/driver-facts.md, F8); impossible maps refused before restoring.

use super::*;

/// GPU memory held per GPU, in GPU order.
fn used(sim: &Sim) -> Vec<u64> {
    sim.gpus().into_iter().map(|(_, b)| b).collect()
}

#[test]
fn a_partial_map_is_completed_into_a_swap() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        memory: "256MiB",
        ..SimSpec::default()
    });
    let app = sim.app("app", &["--mib", "32"]);
    let p = pid_s(app.pid);
    let gpus = sim.gpu_uuids();
    assert_eq!(used(&sim), [32 << 20, 0]);
    assert!(sim.ctl(&["--suspend", "--pid", &p]).status.success());

    // A GPU that is not here: refused before anything is restored.
    let ghost = format!("{}=GPU-00000000-0000-0000-0000-000000000001", gpus[0]);
    let out = sim.ctl(&["--resume", "--pid", &p, "--device-map", &ghost]);
    assert_eq!(exit_code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a GPU of this machine"),
        "{}",
        stderr(&out)
    );
    assert_eq!(sim.state(app.pid), "checkpointed", "nothing was restored");

    // OLD0=NEW1 alone: the driver would refuse it (F8); completed, it is a swap.
    let map = format!("{}={}", gpus[0], gpus[1]);
    let out = sim.ctl(&["--resume", "--pid", &p, "-d", &map]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(used(&sim), [0, 32 << 20], "now on the second GPU");
    assert!(app.advances(3));
    app.assert_healthy();
}

#[test]
fn four_gpus_a_tree_and_one_pair() {
    let mut sim = Sim::with(SimSpec {
        gpus: 4,
        memory: "256MiB",
        ..SimSpec::default()
    });
    // The root on GPU 0, its children on 1, 2 and 3; each holds a different amount.
    let root = sim.app("four", &["--children", "3", "--mib", "8"]);
    gpu_children(&root, 3);
    let gpus = sim.gpu_uuids();
    let before = used(&sim);
    assert!(before.iter().all(|b| *b == 8 << 20), "{before:?}");
    let tree = pid_s(root.pid);
    assert!(sim.ctl(&["--suspend", "--tree", &tree]).status.success());
    assert_eq!(used(&sim), [0, 0, 0, 0]);
    let map = format!("{}={}", gpus[3], gpus[0]);
    let v = sim.ctl_json(&["--resume", "--tree", &tree, "--device-map", &map]);
    for p in v["processes"].as_array().unwrap() {
        assert!(p["error"].is_null(), "{p}");
    }
    let expected = format!(
        "{}={},{}={},{}={},{}={}",
        gpus[0], gpus[3], gpus[1], gpus[1], gpus[2], gpus[2], gpus[3], gpus[0]
    );
    assert_eq!(
        v["device_map"],
        expected.as_str(),
        "3 and 0 swapped, 1 and 2 stay"
    );
    // The root (GPU 0 before) is on GPU 3 now, the child from GPU 3 on GPU 0.
    let list = sim.ctl_json(&["--list", "--tree", &tree]);
    let gpu_of = |pid: i32| -> String {
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .map(|p| p["gpus"][0]["gpu"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert_eq!(gpu_of(root.pid), gpus[3]);
    assert!(root.advances(2));
    root.assert_healthy();
}

#[test]
fn auto_keeps_a_process_on_its_gpu_on_the_same_machine() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        memory: "256MiB",
        ..SimSpec::default()
    });
    let app = sim.app("auto", &["--mib", "16", "--device", "1"]);
    let p = pid_s(app.pid);
    assert!(sim.ctl(&["--suspend", "--pid", &p]).status.success());
    let out = sim.ctl(&["--resume", "--pid", &p, "--device-map", "auto"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(used(&sim), [0, 16 << 20]);
    assert!(app.advances(2));
}

#[test]
fn two_gpus_onto_one_are_refused_before_restoring() {
    let mut sim = Sim::with(SimSpec {
        gpus: 2,
        ..SimSpec::default()
    });
    let app = sim.app("app", &[]);
    let p = pid_s(app.pid);
    let gpus = sim.gpu_uuids();
    assert!(sim.ctl(&["--suspend", "--pid", &p]).status.success());
    let onto_one = format!("{}={},{}={}", gpus[0], gpus[1], gpus[1], gpus[1]);
    let out = sim.ctl(&["--resume", "--pid", &p, "--device-map", &onto_one]);
    assert_eq!(exit_code(&out), 1);
    assert!(
        stderr(&out).contains("twice on the new side"),
        "{}",
        stderr(&out)
    );
    assert_eq!(sim.state(app.pid), "checkpointed");
    assert!(sim.ctl(&["--resume", "--pid", &p]).status.success());
}
