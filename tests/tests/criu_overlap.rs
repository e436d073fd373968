//! The overlapped restore with the real CRIU (the project's, patch 0007) and the simulated CUDA
//! driver: the driver's checkpoint data arrives while the driver already restores, the image
//! digests of large pages images are checked meanwhile, and every failure on the way fails the
//! restore with the images left for a retry.

use std::path::{Path, PathBuf};

use criu_gpu_host::thp::{Thp, Want};
use gpu_ckpt_tests::criu::{self, assert_ok, plugin_lines, Criu};
use gpu_ckpt_tests::*;

/// An application of `mib` MiB dumped (and gone).
fn dumped(sim: &mut Sim, c: &Criu, mib: &str) -> (App, PathBuf) {
    let app = sim.app("app", &["--mib", mib]);
    let images = sim.dir.join("img");
    assert_ok(
        &c.dump(sim, app.pid, &images, &[], &[]),
        &images,
        "dump.log",
    );
    wait_gone(app.pid);
    (app, images)
}

fn restored(sim: &mut Sim, c: &Criu, app: &App, images: &Path, env: &[(&str, &str)]) {
    assert_ok(&c.restore(sim, images, &[], env), images, "restore.log");
    sim.adopt(app.pid);
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}

/// CRIU's summary of the deferred pages: (seconds until the last one arrived, faults served
/// first, seconds into the fill at which the late hooks started).
fn summary(images: &Path) -> (f64, u64, f64) {
    let log = criu::log(images, "restore.log");
    let line = log
        .lines()
        .find(|l| l.contains("deferred-pages: ") && l.contains(" in place "))
        .unwrap_or_else(|| panic!("no summary: {}", criu::tail(&log, 30)))
        .to_owned();
    let after = |key: &str| -> f64 {
        let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key}: {line}")) + key.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let faults = line
        .split("; ")
        .find(|p| p.contains("fault(s) served first"))
        .and_then(|p| p.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    (
        after(" task(s) in place "),
        faults,
        after("the late hooks started "),
    )
}

#[test]
fn the_gpu_restore_starts_while_its_data_still_arrives() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let (app, images) = dumped(&mut sim, &c, "64");
    // The fill waits for the first fault (at most 60 s): the driver's restore reads the pages
    // before the fill gets there, however loaded the machine.
    restored(&mut sim, &c, &app, &images, &[("CRIU_FAULT", "139")]);
    let (filled, faults, hooks) = summary(&images);
    assert!(faults > 0, "the driver's reads came through faults");
    assert!(
        hooks < filled,
        "the GPU restore ran {hooks} s into the fill, which ended at {filled} s"
    );
    let plugin = plugin_lines(&images, "restore.log").join("\n");
    assert!(
        plugin.contains("the GPU restore overlaps CRIU's pages: 0.06 GiB"),
        "{plugin}"
    );
}

#[test]
fn with_overlap_off_every_page_is_in_place_before_the_gpu_restore() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let (app, images) = dumped(&mut sim, &c, "32");
    restored(&mut sim, &c, &app, &images, &[("CRIU_GPU_OVERLAP", "0")]);
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("CRIU_GPU_OVERLAP=0"),
        "{}",
        criu::tail(&log, 30)
    );
    assert!(!log.contains("nr_deferred"), "nothing was left out");
}

#[test]
fn a_page_that_cannot_be_put_in_place_fails_the_restore_and_a_retry_works() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let (app, images) = dumped(&mut sim, &c, "32");
    let out = c.restore(&sim, &images, &[], &[("CRIU_FAULT", "140")]);
    assert!(!out.status.success(), "the restore must fail");
    let log = criu::log(&images, "restore.log");
    assert!(
        log.contains("can't put page") && log.contains("Input/output error"),
        "{}",
        criu::tail(&log, 30)
    );
    wait_gone(app.pid);
    restored(&mut sim, &c, &app, &images, &[]);
}

/// The largest pages image of `dir`.
fn pages_image(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("pages-")
        })
        .max_by_key(|p| p.metadata().unwrap().len())
        .unwrap()
}

fn flip(file: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
}

#[test]
fn a_damaged_large_pages_image_is_found_while_restoring_and_the_tree_never_runs() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    // Over criu_gpu_image::digest::LATER: checked by the guardian while CRIU restores.
    let (app, images) = dumped(&mut sim, &c, "288");
    let pages = pages_image(&images);
    let at = pages.metadata().unwrap().len() / 2;
    flip(&pages, at);
    let out = c.restore(&sim, &images, &[], &[]);
    assert!(!out.status.success(), "the restore must fail");
    let plugin = plugin_lines(&images, "restore.log").join("\n");
    let name = pages.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        plugin.contains("checked while CRIU restores")
            && plugin.contains(&format!("{name} is damaged"))
            && plugin.contains("killing the restored process tree"),
        "{plugin}"
    );
    wait_gone(app.pid);
    flip(&pages, at);
    restored(&mut sim, &c, &app, &images, &[]);
    let plugin = plugin_lines(&images, "restore.log").join("\n");
    assert!(
        plugin.contains("pages images checked against their digests while CRIU restored"),
        "{plugin}"
    );
}

/// The node's transparent huge page policy at `always` until dropped, held the way the plugin's
/// guardians hold it (`criu_gpu_host::thp`), so that dumps of other tests share it: the last
/// holder out puts the node's policy back.
struct ThpAlways(Thp);

impl ThpAlways {
    fn set() -> ThpAlways {
        let thp = Thp::default();
        thp.raise(Want::Always, std::process::id() as i32).unwrap();
        ThpAlways(thp)
    }
}

impl Drop for ThpAlways {
    fn drop(&mut self) {
        let _ = self.0.lower(std::process::id() as i32);
    }
}

#[test]
fn huge_pages_never_stand_in_for_data_that_has_not_arrived() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let (app, images) = dumped(&mut sim, &c, "32");
    // At `always`, CRIU's reads into the VMA premapped next to the deferred one take huge pages
    // over the aligned 2 MiB around them, zero-filling deferred pages that were not there yet;
    // the fill would keep those zeros. (The plugin raises the node to `always` for its
    // checkpoints, so a restore beside a dump meets this.)
    let thp = ThpAlways::set();
    assert_ok(&c.restore(&sim, &images, &[], &[]), &images, "restore.log");
    drop(thp);
    sim.adopt(app.pid);
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}
