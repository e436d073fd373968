//! Two restores of the same images at once, with the real CRIU and the simulated GPU: the pids of
//! the images can be made only once, so one restore wins and the other fails
//! (`Can't fork for P: File exists`); the one that failed must leave the winner's processes
//! alone. Its guardian once killed the winner's process, taking it for its own half-restored
//! task (same pid, started after the guardian); it now kills only what its own CRIU created.

use std::path::Path;
use std::process::Output;

use gpu_ckpt_tests::criu::Criu;
use gpu_ckpt_tests::*;

/// How many pairs of restores are raced: a loser that kills the winner shows in any of them.
const ROUNDS: usize = 20;

fn restore(sim: &Sim, c: &Criu, images: &Path, log: &str) -> Output {
    let dir = images.to_str().unwrap();
    c.command(sim, &["restore", "-D", dir, "-d", "-v4", "-o", log], &[])
        .output()
        .expect("run criu")
}

#[test]
fn of_two_restores_of_the_same_images_at_once_one_wins_and_the_other_leaves_it_alone() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("twice", &["--mib", "16", "--interval-ms", "20"]);
    let images = sim.dir.join("img");
    let out = c.dump(&sim, app.pid, &images, &[], &[]);
    criu::assert_ok(&out, &images, "dump.log");
    wait_gone(app.pid);
    for round in 0..ROUNDS {
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| restore(&sim, &c, &images, "restore-a.log"));
            let b = s.spawn(|| restore(&sim, &c, &images, "restore-b.log"));
            (a.join().unwrap(), b.join().unwrap())
        });
        let won: Vec<&str> = [("a", &a), ("b", &b)]
            .iter()
            .filter(|(_, o)| o.status.success())
            .map(|(n, _)| *n)
            .collect();
        let logs = || {
            format!(
                "restore a:\n{}\nrestore b:\n{}",
                criu::tail(&criu::log(&images, "restore-a.log"), 15),
                criu::tail(&criu::log(&images, "restore-b.log"), 15)
            )
        };
        assert_eq!(won.len(), 1, "round {round}: winners {won:?}\n{}", logs());
        // Once the loser's guardian has ended, the winner must still live.
        criu::wait_guardians_gone(&sim);
        assert!(
            pid_alive(app.pid) && app.advances(3),
            "round {round}: the process restored by {} was killed: {}\n{}",
            won[0],
            app.tail(),
            logs()
        );
        app.assert_healthy();
        signal(app.pid, nix::sys::signal::Signal::SIGKILL);
        wait_gone(app.pid);
    }
}

/// The same, made certain: restore B has loaded the plugin (its guardian runs) and waits in its
/// pre-restore script while restore A makes the images' process; then B's CRIU is SIGKILLed. B's
/// guardian must kill what B's CRIU created (nothing), not A's process, which has a pid of the
/// images and started after that guardian.
#[test]
fn a_restore_killed_half_way_leaves_another_restores_process_alone() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let app = sim.app("killed", &["--mib", "16", "--interval-ms", "20"]);
    let images = sim.dir.join("img");
    let out = c.dump(&sim, app.pid, &images, &[], &[]);
    criu::assert_ok(&out, &images, "dump.log");
    wait_gone(app.pid);
    let waiting = sim.dir.join("b-waiting");
    let a_done = sim.dir.join("a-done");
    let script = sim.dir.join("pre-restore.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = pre-restore ] || exit 0\ntouch {w}\n\
             while [ ! -e {a} ]; do sleep 0.05; done\nkill -9 $PPID\nsleep 5\n",
            w = waiting.display(),
            a = a_done.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dir = images.to_str().unwrap();
    let b = c
        .command(
            &sim,
            &[
                "restore",
                "-D",
                dir,
                "-d",
                "-v4",
                "-o",
                "restore-b.log",
                "--action-script",
                script.to_str().unwrap(),
            ],
            &[],
        )
        .spawn()
        .unwrap();
    assert!(
        wait_until(std::time::Duration::from_secs(20), || waiting.exists()),
        "restore B never reached its pre-restore script"
    );
    let a = restore(&sim, &c, &images, "restore-a.log");
    criu::assert_ok(&a, &images, "restore-a.log");
    std::fs::write(&a_done, "").unwrap();
    let b = finish_within(b, std::time::Duration::from_secs(20)).expect("restore B ended");
    assert!(!b.status.success(), "restore B was killed");
    // B's guardian sees its CRIU gone and acts: A's process must live once it has ended.
    criu::wait_guardians_gone(&sim);
    assert!(
        pid_alive(app.pid) && app.advances(3),
        "restore B's guardian killed restore A's process: {}\n{}",
        app.tail(),
        criu::tail(
            &std::fs::read_to_string(images.join("gpu-guardian.log")).unwrap_or_default(),
            10
        )
    );
    app.assert_healthy();
}
