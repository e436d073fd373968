//! The CRIU plugin's AMD path with the real CRIU and the simulated KFD: a ROCm-like process is
//! dumped and restored (DUMP_EXT_FILE, RESTORE_EXT_FILE in the task, RESUME_DEVICES_LATE),
//! restores that cannot work are refused before anything starts, a CRIU killed in the middle of
//! a dump leaves the process running on its GPUs (the guardian restarts its queues), and one
//! killed in the middle of a restore leaves nothing half-restored behind.

use std::time::Duration;

use gpu_ckpt_tests::amd::AmdSim;
use gpu_ckpt_tests::criu::{self, assert_ok, guardian_log, plugin_lines, signal_when, Criu};
use gpu_ckpt_tests::*;
use nix::sys::signal::Signal;

use amd_kfd::topology::fixture;

fn two_gpus() -> amd_kfd::topology::Topology {
    fixture::machine(1, &[fixture::MI210; 2], &[], 0)
}

#[test]
fn a_rocm_process_is_dumped_and_restored() {
    let mut m = AmdSim::new(&two_gpus());
    let c = Criu::new(&m);
    let app = m.app("rocm", &["--mib", "8"]);
    let images = m.dir.join("img");
    let out = c.dump(&m, app.pid, &images, &[], &[]);
    assert_ok(&out, &images, "dump.log");
    let image = AmdSim::image_of(&images).expect("a KFD image");
    assert!(
        std::fs::metadata(&image).unwrap().len() > 16 << 20,
        "two GPUs' buffers saved"
    );
    let log = plugin_lines(&images, "dump.log").join("\n");
    assert!(log.contains("dumped KFD state of process"), "{log}");
    wait_gone(app.pid);
    let before = app.steps();
    let out = c.restore(&m, &images, &[], &[]);
    assert_ok(&out, &images, "restore.log");
    m.adopt(app.pid);
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("restored KFD state of process"),
        "{}",
        criu::tail(&log, 30)
    );
    assert!(
        log.contains("resumed on its AMD GPUs"),
        "{}",
        criu::tail(&log, 30)
    );
    assert!(app.advances(3), "{}", app.tail());
    assert!(app.steps() > before);
    app.assert_healthy();
}

#[test]
fn leave_running_unpauses_the_queues() {
    let mut m = AmdSim::new(&fixture::single_gpu());
    let c = Criu::new(&m);
    let app = m.app("rocm", &[]);
    let images = m.dir.join("img");
    let out = c.dump(&m, app.pid, &images, &["--leave-running"], &[]);
    assert_ok(&out, &images, "dump.log");
    assert!(app.advances(3), "GPU work goes on: {}", app.tail());
    app.assert_healthy();
}

/// The process runs on after CRIU died in the middle of its dump: its GPU queues are running
/// again (the guardian restarted them) and every buffer still holds what it must.
fn runs_on_with_its_data(m: &AmdSim, app: &App, images: &std::path::Path) {
    let rec = guardian_log(images, "its GPU queues are running again");
    assert!(rec.contains("ended in the middle of a dump"), "{rec}");
    assert!(!m.paused(app.pid), "{rec}");
    assert!(app.advances(3), "GPU work goes on: {}", app.tail());
    app.assert_healthy();
}

#[test]
fn criu_killed_while_the_kfd_state_is_saved_leaves_the_app_running() {
    let mut m = AmdSim::new(&two_gpus());
    let c = Criu::new(&m);
    let app = m.app("rocm", &["--mib", "64"]);
    let images = m.dir.join("img");
    let mut criu = c.spawn_dump(&m, app.pid, &images, &[], &[]);
    // The queues are paused; the plugin copies 128 MiB of buffers: CRIU is SIGKILLed.
    let log = images.join("dump.log");
    let killed = signal_when(
        &mut criu,
        &log,
        "paused the GPU queues",
        Duration::ZERO,
        Signal::SIGKILL,
    );
    assert!(
        killed,
        "CRIU ended before the kill: {}",
        criu::tail(&criu::log(&images, "dump.log"), 20)
    );
    assert!(
        !criu::log(&images, "dump.log").contains("dumped KFD state of process"),
        "killed while the state was being saved"
    );
    runs_on_with_its_data(&m, &app, &images);
}

#[test]
fn criu_killed_after_the_kfd_state_was_saved_leaves_the_app_running() {
    // CRIU dies at its post-dump action: everything is dumped, the queues are still paused, the
    // plugin's `exit` never runs.
    let mut m = AmdSim::new(&fixture::single_gpu());
    let c = Criu::new(&m);
    let app = m.app("rocm", &[]);
    let images = m.dir.join("img");
    let script = criu::killing_script(&m.dir, "post-dump");
    let out = c.dump(&m, app.pid, &images, &["--action-script", &script], &[]);
    assert!(!out.status.success(), "CRIU was killed");
    let log = plugin_lines(&images, "dump.log").join("\n");
    assert!(log.contains("dumped KFD state of process"), "{log}");
    runs_on_with_its_data(&m, &app, &images);
}

#[test]
fn criu_killed_mid_restore_leaves_no_half_restored_process_and_the_images_restore() {
    let mut m = AmdSim::new(&fixture::single_gpu());
    let c = Criu::new(&m);
    let app = m.app("rocm", &[]);
    let images = m.dir.join("img");
    assert_ok(&c.dump(&m, app.pid, &images, &[], &[]), &images, "dump.log");
    wait_gone(app.pid);
    // The KFD state is restored, RESUME has not come: CRIU dies.
    let script = criu::killing_script(&m.dir, "post-restore");
    let out = c.restore(&m, &images, &["--action-script", &script], &[]);
    assert!(!out.status.success());
    let rec = guardian_log(&images, "half-restored");
    assert!(rec.contains("restore again"), "{rec}");
    wait_gone(app.pid);
    assert_ok(&c.restore(&m, &images, &[], &[]), &images, "restore.log");
    m.adopt(app.pid);
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}

#[test]
fn a_machine_whose_gpus_do_not_fit_is_refused_and_the_retry_works() {
    let mut m = AmdSim::new(&two_gpus());
    let c = Criu::new(&m);
    let app = m.app("rocm", &[]);
    let images = m.dir.join("img");
    assert_ok(&c.dump(&m, app.pid, &images, &[], &[]), &images, "dump.log");
    wait_gone(app.pid);
    // Another machine: a single GPU of another model.
    m.swap_topology(&fixture::machine(1, &[fixture::MI300X], &[], 4));
    let out = c.restore(&m, &images, &[], &[]);
    assert!(!out.status.success());
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("the checkpoint used 2 GPU(s) but 1"),
        "{}",
        criu::tail(&log, 20)
    );
    assert!(!std::path::Path::new(&format!("/proc/{}", app.pid)).exists());
    // The same model on another machine (other gpu_ids) takes it.
    m.swap_topology(&fixture::machine(1, &[fixture::MI210; 2], &[], 9));
    assert_ok(&c.restore(&m, &images, &[], &[]), &images, "restore.log");
    m.adopt(app.pid);
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}

#[test]
fn a_corrupt_kfd_image_is_refused_and_the_fixed_one_restores() {
    let mut m = AmdSim::new(&fixture::single_gpu());
    let c = Criu::new(&m);
    let app = m.app("rocm", &[]);
    let images = m.dir.join("img");
    assert_ok(&c.dump(&m, app.pid, &images, &[], &[]), &images, "dump.log");
    wait_gone(app.pid);
    let image = AmdSim::image_of(&images).unwrap();
    let good = std::fs::read(&image).unwrap();
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 5] ^= 0x40; // the metadata
    std::fs::write(&image, &bad).unwrap();
    let out = c.restore(&m, &images, &[], &[]);
    assert!(!out.status.success());
    assert!(criu::log(&images, "restore.log").contains("metadata checksum mismatch"));
    std::fs::write(&image, &good).unwrap();
    assert_ok(&c.restore(&m, &images, &[], &[]), &images, "restore.log");
    m.adopt(app.pid);
    assert!(app.advances(3));
    app.assert_healthy();
}

/// Both backends in one CRIU run: a tree holding a CUDA process and a ROCm process.
struct Both<'a>(&'a Sim, &'a AmdSim);

impl Machine for Both<'_> {
    fn env(&self) -> Vec<(String, String)> {
        let mut e = self.0.env();
        e.extend(self.1.env());
        e
    }
    fn scratch(&self) -> &std::path::Path {
        &self.0.dir
    }
}

#[test]
fn a_tree_with_cuda_and_rocm_processes_is_dumped_and_restored() {
    let mut cuda = Sim::start();
    let mut amd = AmdSim::new(&fixture::single_gpu());
    let both = Both(&cuda, &amd);
    let c = Criu::new(&both);
    let (cuda_log, amd_log) = (cuda.dir.join("cuda.log"), amd.dir.join("rocm.log"));
    let script = format!(
        "{} --mib 8 --log {} & {} --root {} --log {} & wait",
        artifact("cuda-sim-app").display(),
        cuda_log.display(),
        artifact("amd-kfd-sim-app").display(),
        amd.root.display(),
        amd_log.display()
    );
    let child = setsid_command(std::path::Path::new("sh"))
        .args(["-c", &script])
        .envs(both.env())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let root = reap_in_background(child);
    let apps = [
        App {
            pid: 0,
            log: cuda_log,
        },
        App {
            pid: 0,
            log: amd_log,
        },
    ];
    assert!(wait_until(std::time::Duration::from_secs(20), || apps
        .iter()
        .all(|a| a.steps() > 0)));
    let tree = process_facts::process::tree(root);
    assert_eq!(tree.len(), 3);
    let images = cuda.dir.join("img");
    assert_ok(&c.dump(&both, root, &images, &[], &[]), &images, "dump.log");
    let log = plugin_lines(&images, "dump.log").join("\n");
    assert!(
        log.contains("checkpointed 1 CUDA process") && log.contains("dumped KFD state"),
        "{log}"
    );
    tree.iter().for_each(|p| wait_gone(*p));
    assert_ok(&c.restore(&both, &images, &[], &[]), &images, "restore.log");
    cuda.adopt(root);
    tree.iter().for_each(|p| amd.adopt(*p));
    for a in &apps {
        assert!(a.advances(3), "{}", a.tail());
        a.assert_healthy();
    }
}
