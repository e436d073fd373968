//! Host memory that cannot take a checkpoint's device memory, as a container operator meets it: a
//! memory limit (a memory cgroup of the process) below the GPU memory the process holds. The
//! checkpoint would copy that memory into the process and the kernel would kill it half-way, so
//! the plugin (plain `criu dump`), `criu-gpu dump` and `criu-gpu doctor` refuse, with the
//! numbers, before anything is locked; the process runs on. The node's `MemAvailable` side of
//! the same rule is tested with numbers (cuda-checkpoint-ctl's refusal, the plugin's backend).

use gpu_ckpt_tests::criu::{self, assert_ok, Criu};
use gpu_ckpt_tests::job::{criu_gpu, text};
use gpu_ckpt_tests::memcg::MemoryCgroup;
use gpu_ckpt_tests::*;

const MIB: u64 = 1 << 20;

#[test]
fn a_memory_limit_below_the_device_memory_refuses_the_dump_before_any_lock() {
    let mut sim = Sim::start();
    let app = sim.app("app", &["--mib", "64"]);
    assert!(app.advances(2), "{}", app.tail());
    let cg = MemoryCgroup::new();
    cg.add(app.pid);
    // 64 MiB of device memory against 16 MiB left below the limit.
    cg.limit(Some(cg.current() + 16 * MIB));
    let c = Criu::new(&sim);
    let cgroup = cg.dir.display().to_string();

    let images = sim.dir.join("img");
    let out = c.dump(&sim, app.pid, &images, &[], &[]);
    let log = criu::log(&images, "dump.log");
    assert!(!out.status.success(), "the dump was expected to fail");
    assert!(
        log.contains(&format!("the memory cgroup {cgroup} allows"))
            && log.contains("need 64.00 MiB")
            && log.contains("nothing was locked")
            && log.contains(&format!("raise the memory limit of {cgroup}")),
        "{}",
        criu::tail(&log, 20)
    );
    assert_eq!(sim.state(app.pid), "running");
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();

    let job = criu_gpu(
        &sim,
        &c,
        &[
            "dump",
            &app.pid.to_string(),
            "--dry-run",
            sim.dir.join("job").to_str().unwrap(),
        ],
        &[],
    );
    assert!(!job.status.success());
    assert!(
        text(&job).contains(&format!("the memory cgroup {cgroup} allows")),
        "{}",
        text(&job)
    );

    let doctor = std::process::Command::new(artifact("criu-gpu"))
        .args(["doctor", "--json"])
        .envs(sim.env())
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let memory = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "memory")
        .unwrap_or_else(|| panic!("no memory check: {r}"));
    assert_eq!(memory["status"], "fail", "{memory}");
    assert!(
        memory["detail"].as_str().unwrap().contains(&cgroup),
        "{memory}"
    );

    // Without the limit the same dump goes ahead: the refusal was the memory's.
    cg.limit(None);
    let images = sim.dir.join("img2");
    let out = c.dump(&sim, app.pid, &images, &["--leave-running"], &[]);
    assert_ok(&out, &images, "dump.log");
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}
