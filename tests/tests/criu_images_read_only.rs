//! A restore leaves the images as they were: whatever it writes (CRIU's log and stats, the pid
//! file, the plugin's GPU timings, the guardian's log) goes to CRIU's work directory. Shown with
//! the images on a read-only bind mount, as an OCI checkpoint image mounted by CRI-O or a shared
//! store presents them: `criu restore --work-dir` and `criu-gpu restore` restore from it, a
//! restore killed half-way leaves it as it was and the next one works, and each says where its
//! timings went.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_ckpt_tests::criu::{self, assert_ok, Criu};
use gpu_ckpt_tests::job::{criu_gpu, text};
use gpu_ckpt_tests::*;

/// `dir` mounted again, read-only, at `at`; unmounted when dropped.
struct ReadOnly {
    at: PathBuf,
}

impl ReadOnly {
    fn mount(dir: &Path, at: &Path) -> ReadOnly {
        std::fs::create_dir_all(at).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("mount").args(args).output().unwrap();
            assert!(out.status.success(), "mount {args:?}: {}", stderr(&out));
        };
        run(&["--bind", dir.to_str().unwrap(), at.to_str().unwrap()]);
        let ro = ReadOnly { at: at.to_owned() };
        run(&["-o", "remount,bind,ro", at.to_str().unwrap()]);
        ro
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.at).status();
    }
}

/// Every file of `dir` with its bytes and mode.
fn contents(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let mode = e.metadata().unwrap().permissions().mode();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, (std::fs::read(e.path()).unwrap_or_default(), mode))
        })
        .collect()
}

fn runs_with_its_data(app: &App) {
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}

#[test]
fn restores_from_read_only_images_write_only_into_their_work_directory() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("app", &["--mib", "16", "--interval-ms", "20"]);
    let images = sim.dir.join("img");
    let root = app.pid.to_string();
    let out = criu_gpu(&sim, &c, &["dump", &root, images.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    wait_gone(app.pid);
    let before = contents(&images);
    let ro = ReadOnly::mount(&images, &sim.dir.join("ro"));
    let ro_dir = ro.at.to_str().unwrap();

    // CRIU itself, told where to write.
    let work = sim.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let work_s = work.to_str().unwrap();
    let out = c.restore(&sim, &ro.at, &["--work-dir", work_s], &[]);
    assert_ok(&out, &work, "restore.log");
    sim.adopt(app.pid);
    runs_with_its_data(&app);
    let log = criu::log(&work, "restore.log");
    let timings = work.join("gpu-timings-restore.json");
    assert!(
        log.contains(&format!("GPU phase timings in {}", timings.display())),
        "{}",
        criu::tail(&log, 20)
    );
    assert!(timings.exists());
    signal(app.pid, nix::sys::signal::Signal::SIGKILL);
    wait_gone(app.pid);

    // Killed half-way: nothing left, and criu-gpu restores from the same images.
    let kill = [("CRIU_KILL_AT", "Forking task#1+0")];
    let out = criu_gpu(&sim, &c, &["restore", ro_dir], &kill);
    assert!(!out.status.success(), "criu was killed: {}", text(&out));
    wait_gone(app.pid);
    let out = criu_gpu(&sim, &c, &["restore", ro_dir], &[]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("the restore writes into"), "{said}");
    runs_with_its_data(&app);

    drop(ro);
    assert_eq!(contents(&images), before, "the images are as they were");
}
