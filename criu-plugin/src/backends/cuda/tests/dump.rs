//! Dumps: what is locked, checkpointed and undone, and what is refused.

use super::*;
use crate::backends::cuda::error::DumpError;

#[test]
fn a_dump_locks_every_cuda_process_at_the_first_pause_then_checkpoints_all() {
    let w = World::new(&[(10, R), (11, R)], &[99]);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(verdict(&r[0]), &Verdict::Done(()));
    assert_eq!(
        verdict(&r[2]),
        &Verdict::NotMine,
        "a process without CUDA is not ours"
    );
    let calls = w.gpu.m().calls.clone();
    let first_ckpt = calls
        .iter()
        .position(|c| c.starts_with("Checkpoint"))
        .unwrap();
    assert!(
        calls[..first_ckpt].contains(&"Lock 11".to_string()),
        "both locked before any checkpoint: {calls:?}"
    );
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (C, C));
    assert_eq!(*w.host.required.lock().unwrap(), ["criu_gpu_cuda"]);
    assert!(
        *w.host.interrupt_only.lock().unwrap(),
        "ptrace-only seizing for a CUDA tree"
    );
    let log = w.host.threads.log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "release 1010",
            "release 1011",
            "recapture 1010",
            "recapture 1011"
        ]
    );
    c.exit(&w.host, Stage::Dump, true);
    let dir = w.host.image_dir.clone().unwrap();
    let img: CudaImage = record::read(&dir, RECORD, FORMAT, VERSION)
        .unwrap()
        .unwrap();
    assert_eq!(img.processes.len(), 2);
    assert_eq!(img.processes[0].gpus[0].memory, Some(1 << 30));
    assert_eq!(img.gpus.len(), 1, "every GPU the driver saw");
    assert_eq!(
        (w.gpu.state(10), w.gpu.state(11)),
        (C, C),
        "tasks die: nothing undone"
    );
}

#[test]
fn a_tree_without_cuda_is_left_to_criu_alone() {
    let mut w = World::new(&[], &[5, 6]);
    w.host.root = Some(5);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| matches!(x, Ok(Verdict::NotMine))), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
    assert!(
        !*w.host.interrupt_only.lock().unwrap(),
        "CRIU's seize mode untouched"
    );
    assert_eq!(w.guardians.spawned(), 0, "no guardian");
}

#[test]
fn checkpoints_of_several_processes_overlap() {
    let w = World::new(&[(10, R), (11, R), (12, R)], &[]);
    w.gpu.m().delay = Duration::from_millis(300);
    let (_c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    let spans: Vec<_> = w
        .gpu
        .m()
        .spans
        .iter()
        .filter(|s| s.1 == Call::Checkpoint)
        .cloned()
        .collect();
    assert_eq!(spans.len(), 3);
    let latest_start = spans.iter().map(|s| s.2).max().unwrap();
    let earliest_end = spans.iter().map(|s| s.3).min().unwrap();
    assert!(
        latest_start < earliest_end,
        "all three ran at the same time"
    );
}

#[test]
fn a_failed_checkpoint_is_undone_for_every_process() {
    let w = World::new(&[(10, R), (11, R), (12, L)], &[]);
    w.gpu
        .m()
        .fail
        .insert((11, Call::Checkpoint), code::OUT_OF_MEMORY);
    let (mut c, r) = w.dump(Stage::Dump);
    let DumpError::Checkpoints { failures } = first_failure(&r) else {
        panic!("{r:?}");
    };
    assert_eq!(pids(failures), [11]);
    assert!(
        matches!(&failures[0].1, ActionFailure::Driver(d) if d.code == code::OUT_OF_MEMORY),
        "{failures:?}"
    );
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!(w.gpu.state(10), R, "checkpointed: restored and unlocked");
    assert_eq!(w.gpu.state(11), R, "only locked: unlocked");
    assert_eq!(
        w.gpu.state(12),
        L,
        "locked by someone else before: left locked"
    );
}

#[test]
fn leave_running_returns_every_process_to_running() {
    let mut w = World::new(&[(10, R), (11, C)], &[]);
    w.host.final_state = Some(FinalState::Alive);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
    assert_eq!(w.gpu.state(10), R);
    assert_eq!(w.gpu.state(11), C, "checkpointed before the dump: left so");
    assert!(!w.gpu.m().calls.contains(&"Restore 11".to_string()));
}

#[test]
fn a_lock_that_gives_up_names_the_process_and_the_fix() {
    let w = World::new(&[(10, R), (11, R)], &[]);
    w.gpu.m().fail.insert((11, Call::Lock), 600);
    w.tree.0.lock().unwrap().nccl.insert(11);
    let (mut c, r) = w.dump(Stage::Dump);
    let DumpError::Locks { failures, rounds } = failure(&r[0]) else {
        panic!("{r:?}");
    };
    assert_eq!(pids(failures), [11]);
    assert!(
        matches!(failures[0].1, LockFailure::GaveUp { nccl: true, .. }) && rounds.is_none(),
        "{failures:?}"
    );
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (R, R));
}

/// Two NCCL ranks; the locks of `giving_up` give up that many times each.
fn ranks(giving_up: &[(i32, u32)]) -> World {
    let w = World::new(&[(10, R), (11, R)], &[]).set("CRIU_GPU_NCCL_CHECK", "0");
    w.tree.0.lock().unwrap().nccl.extend([10, 11]);
    w.gpu.m().gives_up.extend(giving_up.iter().copied());
    w
}

#[test]
fn ranks_are_locked_in_rounds_until_one_locks_them_all() {
    let w = ranks(&[(11, 2), (10, 1)]);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    let calls = w.gpu.m().calls.clone();
    // Round 1: 10 and 11 give up; round 2: 10 locks, 11 gives up, 10 is unlocked; round 3.
    assert_eq!(
        calls.iter().filter(|c| *c == "Unlock 10").count(),
        1,
        "{calls:?}"
    );
    assert!(calls.iter().any(|c| c == "Checkpoint 11"), "{calls:?}");
    let t = w.gpu.m().lock_timeouts.clone();
    assert_eq!(t.len(), 6, "three rounds of two locks: {t:?}");
    assert!(
        t[0] < t[2] && t[4] == t[0],
        "nothing locked: longer; skew (one locked): as short as the first again: {t:?}"
    );
    c.exit(&w.host, Stage::Dump, true);
}

#[test]
fn with_rounds_off_ranks_are_locked_once_and_a_rank_that_waits_fails_the_dump() {
    let w = ranks(&[(11, 1)]).set("CRIU_GPU_LOCK_ROUNDS", "0");
    let (mut c, r) = w.dump(Stage::Dump);
    let DumpError::Locks { failures, rounds } = failure(&r[0]) else {
        panic!("{r:?}");
    };
    assert_eq!(pids(failures), [11]);
    assert!(
        matches!(failures[0].1, LockFailure::GaveUp { nccl: true, .. }),
        "{failures:?}"
    );
    assert!(rounds.is_none(), "one round: {rounds:?}");
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (R, R));
}

#[test]
fn rounds_that_never_lock_every_rank_end_within_criu_seize_time() {
    let mut w = ranks(&[(11, u32::MAX)]);
    w.host.seize_left = Some(Duration::from_secs(2));
    let start = Instant::now();
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let DumpError::Locks { failures, rounds } = failure(&r[0]) else {
        panic!("{r:?}");
    };
    assert_eq!(pids(failures), [11], "only the rank that never locked");
    assert!(
        matches!(failures[0].1, LockFailure::GaveUp { .. }),
        "{failures:?}"
    );
    assert!(matches!(rounds, Some((2, _))), "{rounds:?}");
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (R, R));
}

#[test]
fn a_lone_process_has_one_lock_with_all_the_time() {
    let mut w = World::new(&[(10, R)], &[]);
    w.host.seize_left = Some(Duration::from_secs(5));
    w.gpu.m().gives_up.insert(10, 1);
    let (_c, r) = w.dump(Stage::Dump);
    assert!(r.iter().any(|x| x.is_err()));
    let t = w.gpu.m().lock_timeouts.clone();
    assert_eq!(t.len(), 1, "{t:?}");
    assert!(t[0] > Duration::from_secs(3), "{t:?}");
}

#[test]
fn locks_fit_in_what_is_left_of_criu_seize_time() {
    let mut w = World::new(&[(10, R)], &[]).set("CRIU_GPU_LOCK_TIMEOUT_MS", "9000");
    w.host.seize_left = Some(Duration::from_secs(2));
    let (_c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    let t = w.gpu.m().lock_timeouts[0];
    assert!(t <= Duration::from_secs(2), "{t:?}");
}

#[test]
fn a_held_process_is_refused_before_anything_is_locked() {
    for held in [
        Held::Stopped,
        Held::Traced { by: 77 },
        Held::Thread { tid: 1010, by: 0 },
    ] {
        let w = World::new(&[(10, R), (11, R)], &[]);
        w.tree.0.lock().unwrap().held.insert(11, held.clone());
        let (mut c, r) = w.dump(Stage::Dump);
        let e: &DumpError = failure(&r[0]);
        assert!(
            matches!(e, DumpError::Held { who, held: h } if who.pid == 11 && *h == held),
            "{e:?}"
        );
        assert!(
            w.gpu.m().calls.iter().all(|c| !c.starts_with("Lock")),
            "{held:?}"
        );
        c.exit(&w.host, Stage::Dump, false);
    }
}

#[test]
fn pre_dumps_are_refused_before_any_lock() {
    let w = World::new(&[(10, R)], &[]);
    let (_c, r) = w.dump(Stage::PreDump);
    let e: &DumpError = failure(&r[0]);
    assert!(matches!(e, DumpError::PreDump(w) if w.pid == 10), "{e:?}");
    assert_eq!(w.gpu.state(10), R);
    assert!(w.gpu.m().calls.is_empty(), "nothing was locked");
}

#[test]
fn a_process_stopped_between_its_lock_and_the_seize_fails_the_dump() {
    let w = World::new(&[(10, R)], &[]);
    w.host.threads.seized_stopped.lock().unwrap().push((10, 19));
    let (mut c, r) = w.dump(Stage::Dump);
    let e: &DumpError = failure(&r[1]);
    assert!(
        matches!(e, DumpError::StoppedDuringDump { who, signal: 19 } if who.pid == 10),
        "{e:?}"
    );
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!(w.gpu.state(10), R);
}

#[test]
fn a_process_that_ends_after_its_lock_fails_the_dump_and_the_rest_is_put_back() {
    let w = World::new(&[(10, R), (11, R)], &[]);
    w.tree.0.lock().unwrap().dying.insert(11);
    let (mut c, r) = w.dump(Stage::Dump);
    let e: &DumpError = first_failure(&r);
    assert!(
        matches!(e, DumpError::EndedDuringDump(who) if who.pid == 11),
        "{e:?}"
    );
    assert!(
        w.gpu.m().calls.iter().all(|c| !c.starts_with("Checkpoint")),
        "nothing checkpointed"
    );
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!(w.gpu.state(10), R);
}

#[test]
fn a_checkpoint_that_does_not_return_fails_in_time_and_is_undone_once_it_lands() {
    let w = World::new(&[(10, R), (11, R)], &[]).set("CRIU_GPU_ACTION_TIMEOUT_S", "1");
    w.gpu.m().hang.insert((11, Call::Checkpoint));
    let start = Instant::now();
    let (mut c, r) = w.dump(Stage::Dump);
    let DumpError::Checkpoints { failures } = first_failure(&r) else {
        panic!("{r:?}");
    };
    assert_eq!(pids(failures), [11]);
    assert!(
        matches!(failures[0].1, ActionFailure::Stuck { limit } if limit == Duration::from_secs(1)),
        "{failures:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    // The GPU answers again while `exit` rolls back: the rollback waits behind the checkpoint.
    let gpu = w.gpu.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        gpu.release();
    });
    c.exit(&w.host, Stage::Dump, false);
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (R, R));
}

#[test]
fn criu_dying_mid_dump_leaves_the_guardian_to_undo_everything() {
    let w = World::new(&[(10, R), (11, R)], &[]);
    let (c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()));
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (C, C));
    // SIGKILL: no `exit`.
    std::mem::forget(c);
    w.guardians.criu_dies();
    wait_for("the guardian restores both", || {
        w.gpu.state(10) == R && w.gpu.state(11) == R
    });
    let rec = w.gpu.m().record.join("\n");
    assert!(rec.contains("ended in the middle of a dump"), "{rec}");
    assert!(
        rec.contains("returned to its state before the dump (running)"),
        "{rec}"
    );
}

#[test]
fn tasks_left_alive_after_a_successful_dump_are_undone() {
    // A failed post-dump script: CRIU tells plugins the dump succeeded, then resumes the tasks.
    let w = World::new(&[(10, R)], &[]);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()));
    c.exit(&w.host, Stage::Dump, true);
    assert_eq!(w.gpu.state(10), C);
    w.guardians.criu_dies();
    wait_for("rolled back", || w.gpu.state(10) == R);
    let rec = w.gpu.m().record.join("\n");
    assert!(rec.contains("post-dump script"), "{rec}");
}

#[test]
fn no_driver_is_an_error_naming_the_library_setting() {
    let w = World::new(&[(10, R)], &[]);
    w.guardians.set_machine(Arc::new(NoDriver));
    let (_c, r) = w.dump(Stage::Dump);
    let DumpError::NoDriver { processes, reason } = failure(&r[0]) else {
        panic!("{r:?}");
    };
    assert_eq!(processes.iter().map(|w| w.pid).collect::<Vec<_>>(), [10]);
    assert!(
        reason.contains("libcuda.so.1"),
        "the loader's words: {reason}"
    );
}

/// Two ranks of one node: with NCCL's defaults (measured: P2P, SHM and cuMem are checkpointed but
/// cannot be restored) the dump is refused before anything is locked; with sockets only, or when
/// the operator says the processes do not talk through NCCL, it goes ahead.
#[test]
fn nccl_ranks_whose_transports_cannot_be_restored_are_refused_before_any_lock() {
    let w = World::new(&[(10, R), (11, R), (12, R)], &[]);
    w.tree.0.lock().unwrap().nccl.extend([10, 11]);
    let (mut c, r) = w.dump(Stage::Dump);
    let e: &DumpError = failure(&r[0]);
    let DumpError::Refused(Refusal::NcclTransports { ranks }) = e else {
        panic!("{e:?}");
    };
    let refused: Vec<i32> = ranks.iter().map(|(pid, _, _)| *pid).collect();
    assert_eq!(refused, [10, 11], "only the NCCL ranks: {e:?}");
    assert_eq!(
        ranks[0].2,
        [
            nccl::Transport::P2p,
            nccl::Transport::Shm,
            nccl::Transport::CuMem
        ]
    );
    assert!(
        !w.gpu.m().calls.iter().any(|c| c.starts_with("Lock")),
        "{:?}",
        w.gpu.m().calls
    );
    c.exit(&w.host, Stage::Dump, false);

    let sockets: Vec<(String, String)> = nccl::SOCKETS_ONLY
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let w = World::new(&[(10, R), (11, R)], &[]);
    {
        let mut t = w.tree.0.lock().unwrap();
        t.nccl.extend([10, 11]);
        for p in [10, 11] {
            t.nccl_config
                .insert(p, nccl::Config::from_sources(&sockets, &[]));
        }
    }
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);

    let w = World::new(&[(10, R), (11, R)], &[]).set("CRIU_GPU_NCCL_CHECK", "0");
    w.tree.0.lock().unwrap().nccl.extend([10, 11]);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
}

/// The refusal a hook answered with, if it is the rule set's.
fn refusal_of(r: &HookResult) -> Option<&Refusal> {
    match r.as_ref().err()?.gpu_error::<DumpError>()? {
        DumpError::Refused(refusal) => Some(refusal),
        _ => None,
    }
}

/// Host memory that cannot take the device memory of every CUDA process at once (each holds
/// 1 GiB here), on the node or under a container's memory limit, refuses the dump before any
/// lock; a process already checkpointed by someone else needs nothing more.
#[test]
fn device_memory_that_host_memory_cannot_hold_is_refused_before_any_lock() {
    let gib = 1u64 << 30;
    let node = Room {
        available: Some(gib + gib / 2),
        limits: Vec::new(),
    };
    let pod = Room {
        available: Some(64 * gib),
        limits: vec![Limit {
            cgroup: "/sys/fs/cgroup/pod".into(),
            max: 4 * gib,
            current: 3 * gib + gib / 2,
            pids: vec![11],
        }],
    };
    for room in [node, pod] {
        let w = World::new(&[(10, R), (11, R)], &[]);
        w.tree.0.lock().unwrap().room = room;
        let (mut c, r) = w.dump(Stage::Dump);
        assert!(
            matches!(refusal_of(&r[0]), Some(Refusal::HostMemory { .. })),
            "{r:?}"
        );
        assert!(
            !w.gpu.m().calls.iter().any(|c| c.starts_with("Lock")),
            "{:?}",
            w.gpu.m().calls
        );
        c.exit(&w.host, Stage::Dump, false);
        assert_eq!((w.gpu.state(10), w.gpu.state(11)), (R, R));
    }
    let w = World::new(&[(10, R), (11, C)], &[]);
    w.tree.0.lock().unwrap().room = Room {
        available: Some(gib + gib / 2),
        limits: Vec::new(),
    };
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
}

/// The checkpoint runs with huge pages at `always`, and the node's policy is back afterwards,
/// also when CRIU dies in the middle of it (the guardian puts it back when it ends).
#[test]
fn huge_pages_are_raised_for_the_checkpoint_and_put_back_whatever_happens() {
    let w = World::new(&[(10, R), (11, R)], &[]);
    let thp = fake_thp("always [madvise] never");
    w.gpu.m().thp = Some(thp.clone());
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(w.gpu.m().thp_seen, vec!["always", "always"]);
    wait_for("put back", || thp_shown(&thp) == "madvise");
    c.exit(&w.host, Stage::Dump, true);

    let w = World::new(&[(10, R)], &[]).set("CRIU_GPU_THP", "off");
    let thp = fake_thp("always [madvise] never");
    w.gpu.m().thp = Some(thp.clone());
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(w.gpu.m().thp_seen, vec!["always [madvise] never"]);
    c.exit(&w.host, Stage::Dump, true);

    // CRIU killed while the checkpoint hangs: the policy stays raised while the driver works,
    // and is put back once the guardian has returned the process.
    let w = World::new(&[(10, R)], &[]);
    let thp = fake_thp("always [madvise] never");
    w.gpu.m().thp = Some(thp.clone());
    w.gpu.m().hang.insert((10, Call::Checkpoint));
    let mut c = w.backend();
    c.init(&w.host, Stage::Dump, &Claims::default()).unwrap();
    assert!(c.pause_devices(&w.host, 10).is_ok());
    let host = &w.host;
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = c.checkpoint_devices(host, 10);
        });
        wait_for("raised", || thp_shown(&thp) == "always");
        // The policy is raised before the checkpoint is asked for: CRIU dies once it runs.
        wait_for("checkpoint running", || {
            w.gpu.m().calls.iter().any(|c| c == "Checkpoint 10")
        });
        w.guardians.criu_dies();
        // Alone, the guardian queues the rollback behind the hung checkpoint and says so.
        wait_for("the guardian is alone", || {
            w.gpu
                .m()
                .record
                .join("\n")
                .contains("ended in the middle of a dump")
        });
        assert_eq!(
            thp_shown(&thp),
            "always",
            "not lowered under a running checkpoint"
        );
        w.gpu.release();
        wait_for("put back", || thp_shown(&thp) == "madvise");
    });
    wait_for("returned", || w.gpu.state(10) == R);
}

/// An io_uring anywhere in a CUDA tree (torchrun's agent holds one, and it maps no GPU) is
/// refused before any lock, naming the process and the fix; a tree without CUDA is CRIU's alone.
#[test]
fn an_io_uring_in_the_tree_is_refused_before_any_lock() {
    let w = World::new(&[(10, R), (11, R)], &[12]);
    w.tree.0.lock().unwrap().uring.insert(12);
    let (mut c, r) = w.dump(Stage::Dump);
    let e: &DumpError = failure(&r[0]);
    assert!(
        matches!(
            e,
            DumpError::Refused(Refusal::IoUring {
                pid: 12,
                support: RingSupport::None,
                fds: 1,
                mappings: 2,
                ..
            })
        ),
        "{e:?}"
    );
    assert!(w.gpu.m().calls.is_empty(), "{:?}", w.gpu.m().calls);
    c.exit(&w.host, Stage::Dump, false);

    let w = World::new(&[], &[12, 13]);
    w.tree.0.lock().unwrap().uring.insert(12);
    let (_c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| matches!(x, Ok(Verdict::NotMine))), "{r:?}");
}

/// The project's CRIU (patch 0008) dumps rings that are idle: only a ring with work in flight is
/// refused, by the reason the rule set gives.
#[test]
fn with_the_projects_criu_only_rings_that_are_not_idle_are_refused() {
    let mut w = World::new(&[(10, R), (11, R)], &[12, 13]);
    w.host.rings = RingSupport::Idle;
    w.tree.0.lock().unwrap().uring.extend([12, 13]);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "idle rings dump: {r:?}");
    c.exit(&w.host, Stage::Dump, true);

    let mut w = World::new(&[(10, R), (11, R)], &[12, 13]);
    w.host.rings = RingSupport::Idle;
    w.tree.0.lock().unwrap().uring.extend([12, 13]);
    w.tree.0.lock().unwrap().busy_uring.insert(13);
    let (mut c, r) = w.dump(Stage::Dump);
    let e: &DumpError = failure(&r[0]);
    let DumpError::Refused(Refusal::IoUring {
        pid: 13,
        support: RingSupport::Idle,
        rings,
        ..
    }) = e
    else {
        panic!("only the busy ring is refused: {e:?}");
    };
    assert_eq!(
        rings,
        &["fd 7: io_uring with 1 request(s) in flight (opcodes 22)"]
    );
    assert!(w.gpu.m().calls.is_empty(), "{:?}", w.gpu.m().calls);
    c.exit(&w.host, Stage::Dump, false);
}

/// CRIU ends right after a successful dump, while the guardian is still putting the huge page
/// policy back (its report of that fails: CRIU is gone): the Commit the plugin sent before must
/// still count. Here the fake processes outlive the dump, so the guardian treats them as resumed
/// by a failed post-dump script; without the Commit it took the dump for one CRIU died in.
#[test]
fn orders_sent_before_criu_ended_count_even_when_a_report_fails() {
    let w = World::new(&[(10, R)], &[]);
    w.gpu.m().thp = Some(fake_thp("always [madvise] never"));
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()));
    c.exit(&w.host, Stage::Dump, true);
    w.guardians.criu_dies();
    wait_for("settled alone", || {
        w.gpu
            .m()
            .record
            .iter()
            .any(|l| l.contains("returned to its state"))
    });
    let rec = w.gpu.m().record.join("\n");
    assert!(
        rec.contains("post-dump script") && !rec.contains("in the middle of a dump"),
        "{rec}"
    );
}

#[test]
fn the_record_says_where_each_checkpoint_put_the_device_memory() {
    let w = World::new(&[(10, R), (11, R)], &[]);
    {
        let mut t = w.tree.0.lock().unwrap();
        // 10: a new range beside an old one; 11: a mapping that grew
        t.anon.insert(
            10,
            vec![vec![0x1000..0x3000], vec![0x1000..0x3000, 0x8000..0x9000]],
        );
        t.anon
            .insert(11, vec![vec![0x4000..0x5000], vec![0x4000..0x7000]]);
    }
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
    let img: CudaImage = record::read(&w.host.image_dir.clone().unwrap(), RECORD, FORMAT, VERSION)
        .unwrap()
        .unwrap();
    let staging: Vec<Vec<(u64, u64)>> = img
        .processes
        .iter()
        .map(|p| p.staging.iter().map(|s| (s.start, s.end)).collect())
        .collect();
    assert_eq!(staging, [vec![(0x8000, 0x9000)], vec![(0x5000, 0x7000)]]);
    assert_eq!(img.staging_bytes(), 0x3000);
}
