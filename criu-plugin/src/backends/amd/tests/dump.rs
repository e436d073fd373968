//! Dumps: what is paused and restarted, by the plugin or by the guardian once CRIU is gone.

use super::*;

#[test]
fn a_dump_pauses_until_the_end_and_unpauses_when_the_process_lives_on() {
    let mut w = World::new();
    let fd = w.gpu_process();
    let mut a = w.backend();
    a.init(&w.host, Stage::Dump, &Claims::default()).unwrap();
    assert_eq!(
        *w.guardians.watches.lock().unwrap(),
        [Watch::KfdDump],
        "a tree with a KFD file gets its guardian at init"
    );
    let other = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(
        verdict(&a.dump_ext_file(&w.host, other.as_fd(), 1)),
        &Verdict::NotMine
    );
    assert_eq!(
        verdict(&a.dump_ext_file(&w.host, fd.as_fd(), 7)),
        &Verdict::Done(())
    );
    assert!(w.images.join("amdgpu-kfd-7.img").exists());
    assert_eq!(*w.host.required.lock().unwrap(), ["criu_gpu_amd"]);
    assert!(w.paused(), "paused until the dump ends");
    w.host.final_state = Some(FinalState::Alive);
    a.exit(&w.host, Stage::Dump, true);
    assert!(!w.paused(), "--leave-running unpauses");
    // The plugin restarted them itself: the guardian has nothing left to do.
    w.guardians.criu_dies();
    w.guardians.wait_ended();
    assert!(
        !w.guardians.record().contains("restarting"),
        "{}",
        w.guardians.record()
    );
}

#[test]
fn criu_dying_in_the_middle_of_a_dump_has_the_guardian_restart_the_queues() {
    let w = World::new();
    let fd = w.gpu_process();
    let mut a = w.backend();
    a.init(&w.host, Stage::Dump, &Claims::default()).unwrap();
    assert_eq!(
        verdict(&a.dump_ext_file(&w.host, fd.as_fd(), 7)),
        &Verdict::Done(())
    );
    assert!(w.paused());
    // CRIU is SIGKILLed: the plugin's `exit` never runs, CRIU's copy of the file is gone.
    drop(a);
    w.guardians.criu_dies();
    let rec = w.guardians.wait_for("its GPU queues are running again");
    assert!(rec.contains("ended in the middle of a dump"), "{rec}");
    assert!(!w.paused());
}

#[test]
fn the_dumped_processes_left_running_after_a_successful_dump_get_their_queues_back() {
    // CRIU called the dump successful and was to kill the tasks, but died first (or a failed
    // post-dump script resumed them): the guardian finds the process alive.
    let w = World::new();
    let fd = w.gpu_process();
    let mut a = w.backend();
    a.init(&w.host, Stage::Dump, &Claims::default()).unwrap();
    a.dump_ext_file(&w.host, fd.as_fd(), 7).unwrap();
    a.exit(&w.host, Stage::Dump, true);
    assert!(w.paused(), "the tasks die: nothing to restart yet");
    w.guardians.criu_dies();
    let rec = w.guardians.wait_for("its GPU queues are running again");
    assert!(rec.contains("left running"), "{rec}");
    assert!(!w.paused());
}

#[test]
fn a_pause_that_fails_leaves_nothing_for_the_guardian_to_undo() {
    // Someone else paused the queues (a dump in progress?): PROCESS_INFO is refused, and the
    // guardian must not restart what is not this dump's.
    let w = World::new();
    let fd = w.gpu_process();
    let k = w.kfd();
    let mut p = k.load(std::process::id()).unwrap();
    p.paused = true;
    k.store(&p).unwrap();
    let mut a = w.backend();
    a.init(&w.host, Stage::Dump, &Claims::default()).unwrap();
    let e = a.dump_ext_file(&w.host, fd.as_fd(), 7);
    assert!(
        matches!(failure(&e), AmdError::Pause { who, .. } if who.pid == std::process::id() as i32),
        "{e:?}"
    );
    drop(a);
    w.guardians.criu_dies();
    w.guardians.wait_ended();
    assert!(w.paused(), "still the other one's pause");
    assert!(
        !w.guardians.record().contains("restart"),
        "{}",
        w.guardians.record()
    );
}

#[test]
fn a_tree_without_kfd_files_gets_no_guardian_and_a_pre_dump_pauses_nothing() {
    let mut w = World::new();
    let mut a = w.backend();
    a.init(&w.host, Stage::Dump, &Claims::default()).unwrap();
    a.exit(&w.host, Stage::Dump, true);
    let fd = w.gpu_process();
    a.init(&w.host, Stage::PreDump, &Claims::default()).unwrap();
    assert!(w.guardians.watches.lock().unwrap().is_empty());
    // CRIU maps the device files of a pre-dump too: they are the plugin's.
    assert_eq!(
        verdict(&a.handle_device_vma(&w.host, fd.as_fd())),
        &Verdict::Done(())
    );
    a.exit(&w.host, Stage::PreDump, true);
    // No KFD on this machine: the backend stays out of the way.
    w.host.root = None;
    let mut none = Amd::with(
        Box::new(|| None),
        Arc::new(Settings::default()),
        Arc::new(|_| panic!("no guardian without a KFD")),
    );
    none.init(&w.host, Stage::Dump, &Claims::default()).unwrap();
    assert_eq!(
        verdict(&none.dump_ext_file(&w.host, fd.as_fd(), 7)),
        &Verdict::NotMine
    );
}
