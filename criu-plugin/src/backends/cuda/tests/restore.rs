//! Restores: what is restored at once, refused before anything starts, or killed.

use super::*;
use criu_gpu_host::settings::{SettingsError, Source};
use criu_gpu_image::digest::DigestError;
use criu_gpu_image::restorable::CudaCheckError;

/// An image directory holding a dump of `procs`.
fn dumped(procs: &[(i32, ProcessState)]) -> std::path::PathBuf {
    let w = World::new(procs, &[]);
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    std::fs::write(
        w.host.image_dir.clone().unwrap().join("pages-1.img"),
        vec![7u8; 4096],
    )
    .unwrap();
    c.exit(&w.host, Stage::Dump, true);
    w.host.image_dir.clone().unwrap()
}

/// A dump of process 10 whose checkpoint put its device memory at 0x8000..0x9000.
fn dumped_with_staging() -> std::path::PathBuf {
    let w = World::new(&[(10, R)], &[]);
    w.tree.0.lock().unwrap().anon.insert(
        10,
        vec![vec![0x1000..0x2000], vec![0x1000..0x2000, 0x8000..0x9000]],
    );
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
    w.host.image_dir.clone().unwrap()
}

fn ours() -> Claims {
    Claims {
        ours: true,
        listed: true,
        others: vec![],
    }
}

fn restore_world(dir: std::path::PathBuf, procs: &[(i32, ProcessState)]) -> World {
    let mut w = World::new(procs, &[]);
    w.host.image_dir = Some(dir);
    w
}

#[test]
fn a_restore_brings_back_the_whole_tree_at_once() {
    let dir = dumped(&[(10, R), (11, L), (12, C)]);
    // Restored in a new pid namespace: other real pids, the same namespace pids.
    let w = restore_world(dir, &[(500, C), (501, C), (502, C)]);
    {
        let mut t = w.tree.0.lock().unwrap();
        t.ns = [(500, 10), (501, 11), (502, 12), (503, 13)]
            .into_iter()
            .collect();
        t.pids.push(503);
    }
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    for pid in [500, 501, 502] {
        assert_eq!(
            verdict(&c.resume_devices_late(&w.host, pid)),
            &Verdict::Done(())
        );
    }
    assert_eq!(
        verdict(&c.resume_devices_late(&w.host, 503)),
        &Verdict::NotMine
    );
    // Also the ones someone else had locked or checkpointed before the dump: nothing is left
    // paused by a restore that succeeds.
    for pid in [500, 501, 502] {
        assert_eq!(w.gpu.state(pid), R, "process {pid}");
    }
    assert!(w.tree.0.lock().unwrap().killed.is_empty());
}

#[test]
fn a_failed_restore_kills_the_tree_so_criu_fails() {
    let dir = dumped(&[(10, R), (11, R)]);
    let w = restore_world(dir, &[(10, C), (11, C)]);
    w.gpu
        .m()
        .fail
        .insert((11, Call::Restore), code::OUT_OF_MEMORY);
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    assert_eq!(
        verdict(&c.resume_devices_late(&w.host, 10)),
        &Verdict::Done(())
    );
    let e = c.resume_devices_late(&w.host, 11);
    assert!(
        matches!(
            failure(&e),
            RestoreError::Action { who, failure: ActionFailure::Driver(d) }
                if who.pid == 11 && d.code == code::OUT_OF_MEMORY
        ),
        "{e:?}"
    );
    assert_eq!(w.tree.0.lock().unwrap().killed, vec![11, 10]);
}

/// A process of the checkpoint missing from the restored tree fails the tree: the root answers
/// with it even though its own GPU state came back, and the tree is killed.
#[test]
fn a_process_missing_from_the_restored_tree_fails_the_restore_at_the_root() {
    let dir = dumped(&[(10, R), (11, R)]);
    let w = restore_world(dir, &[(10, C)]);
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    let e = c.resume_devices_late(&w.host, 10);
    assert!(
        matches!(failure(&e), RestoreError::NotInTree { ns_pid: 11, .. }),
        "{e:?}"
    );
    assert_eq!(w.tree.0.lock().unwrap().killed, vec![10]);
}

#[test]
fn restore_is_refused_before_anything_starts_when_gpus_lack_room() {
    let dir = dumped(&[(10, R), (11, R)]);
    let w = restore_world(dir, &[]);
    w.gpu.m().free = 1 << 30; // the two processes need 2 GiB
    let e = w.backend().init(&w.host, Stage::Restore, &ours());
    assert!(
        matches!(
            failure(&e),
            RestoreError::Check(CudaCheckError::Placement { .. })
        ),
        "{e:?}"
    );
}

#[test]
fn damaged_images_are_refused_with_the_file_name() {
    let dir = dumped(&[(10, R)]);
    let w = restore_world(dir.clone(), &[(10, C)]);
    let mut pages = std::fs::read(dir.join("pages-1.img")).unwrap();
    pages[100] ^= 0xff;
    std::fs::write(dir.join("pages-1.img"), &pages).unwrap();
    let e = w.backend().init(&w.host, Stage::Restore, &ours());
    assert!(
        matches!(
            failure(&e),
            RestoreError::Check(CudaCheckError::Digest(DigestError::Damaged { name }))
                if name == "pages-1.img"
        ),
        "{e:?}"
    );
    std::fs::write(dir.join("pages-1.img"), &pages[..1000]).unwrap();
    let e = w.backend().init(&w.host, Stage::Restore, &ours());
    assert!(
        matches!(
            failure(&e),
            RestoreError::Check(CudaCheckError::Digest(DigestError::Size { name, found: 1000, .. }))
                if name == "pages-1.img"
        ),
        "{e:?}"
    );
}

#[test]
fn restore_without_a_driver_names_the_cause() {
    let dir = dumped(&[(10, R)]);
    let w = restore_world(dir, &[]);
    w.guardians.set_machine(Arc::new(NoDriver));
    let e = w.backend().init(&w.host, Stage::Restore, &ours());
    assert!(
        matches!(
            failure(&e),
            RestoreError::Check(CudaCheckError::NoDriver { reason, .. })
                if reason.contains("cannot open")
        ),
        "{e:?}"
    );
}

#[test]
fn what_the_inventory_says_decides_whether_the_record_counts() {
    // A record left over in a reused directory, the image listing plugins but not this one.
    let dir = dumped(&[(10, R)]);
    let w = restore_world(dir.clone(), &[]);
    let stale = Claims {
        ours: false,
        listed: true,
        others: vec![],
    };
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &stale).unwrap();
    assert_eq!(
        verdict(&c.resume_devices_late(&w.host, 1)),
        &Verdict::NotMine
    );
    assert_eq!(w.guardians.spawned(), 0, "no driver needed");
    // An image of CRIU < 4.1 (no list) without a record holds no CUDA state.
    let empty = restore_world(tempfile::tempdir().unwrap().keep(), &[]);
    let old = Claims {
        ours: true,
        listed: false,
        others: vec![],
    };
    let mut c = empty.backend();
    c.init(&empty.host, Stage::Restore, &old).unwrap();
    assert_eq!(
        verdict(&c.resume_devices_late(&empty.host, 1)),
        &Verdict::NotMine
    );
    // The image lists this plugin but the record is gone.
    let e = empty.backend().init(&empty.host, Stage::Restore, &ours());
    assert!(
        matches!(
            failure(&e),
            RestoreError::Check(CudaCheckError::RecordMissing)
        ),
        "{e:?}"
    );
}

#[test]
fn a_bad_restore_setting_does_not_fail_a_dump() {
    let w = World::new(&[(10, R)], &[]).set("CRIU_GPU_DEVICE_MAP", "GPU-1=GPU-2");
    let (mut c, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    c.exit(&w.host, Stage::Dump, true);
}

#[test]
fn criu_dying_mid_restore_kills_the_half_restored_tree() {
    let dir = dumped(&[(10, R)]);
    let w = restore_world(dir, &[(10, C)]);
    w.gpu.m().created.insert(10);
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    // The guardian tracks what CRIU forks; here it is told directly, as RESUME_DEVICES_LATE does.
    c.restore_guardian()
        .unwrap()
        .order(&crate::guardian::proto::Order::Restoring {
            tree: vec![(10, 1)],
        })
        .unwrap();
    std::mem::forget(c);
    w.guardians.criu_dies();
    wait_for("the tree is killed", || w.gpu.m().dead.contains(&10));
    let rec = w.gpu.m().record.join("\n");
    assert!(rec.contains("in the middle of a restore"), "{rec}");
}

/// Two restores of the same images at once: the one that lost (its fork of a pid the other had
/// just made failed) kills only what its own CRIU created, never the winner's process with the
/// pid of the images.
#[test]
fn a_failed_restore_kills_only_what_its_criu_created() {
    let dir = dumped(&[(10, R), (11, R)]);
    let w = restore_world(dir, &[(10, C), (11, C)]);
    w.gpu.m().created.insert(11);
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    std::mem::forget(c);
    w.guardians.criu_dies();
    w.guardians.wait_ended();
    assert!(w.gpu.m().dead.contains(&11), "its own process is killed");
    assert!(
        !w.gpu.m().dead.contains(&10),
        "process 10 has a pid of the images but another CRIU made it"
    );
}

#[test]
fn a_restored_container_without_the_gpus_device_node_is_refused_and_killed() {
    let dir = dumped(&[(10, R)]);
    let w = restore_world(dir, &[(10, C)]);
    w.tree.0.lock().unwrap().no_nodes.insert(10);
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    let e = c.resume_devices_late(&w.host, 10);
    assert!(
        matches!(failure(&e), RestoreError::NoDeviceNode { who, minor: 0, .. } if who.pid == 10),
        "{e:?}"
    );
    assert_eq!(w.tree.0.lock().unwrap().killed, vec![10]);
    assert!(
        !w.gpu.m().calls.iter().any(|c| c.starts_with("Restore")),
        "nothing asked of the driver"
    );
}

#[test]
fn the_device_memory_arrives_while_the_driver_restores() {
    let w = restore_world(dumped_with_staging(), &[(500, C)]);
    w.tree.0.lock().unwrap().ns = [(500, 10)].into_iter().collect();
    let mut c = w.backend();
    c.init(&w.host, Stage::Restore, &ours()).unwrap();
    let asked = w.host.deferred.as_ref().unwrap().lock().unwrap().clone();
    assert_eq!(asked, [(10, 0x8000..0x9000)], "by its pid in the image");
    assert_eq!(
        verdict(&c.resume_devices_late(&w.host, 500)),
        &Verdict::Done(())
    );
    assert_eq!(w.gpu.state(500), R);
}

#[test]
fn overlap_off_or_a_criu_that_cannot_restores_every_page_first() {
    let off = restore_world(dumped_with_staging(), &[(10, C)]).set("CRIU_GPU_OVERLAP", "0");
    let mut c = off.backend();
    c.init(&off.host, Stage::Restore, &ours()).unwrap();
    assert!(off
        .host
        .deferred
        .as_ref()
        .unwrap()
        .lock()
        .unwrap()
        .is_empty());
    assert_eq!(
        verdict(&c.resume_devices_late(&off.host, 10)),
        &Verdict::Done(())
    );

    let mut stock = restore_world(dumped_with_staging(), &[(10, C)]);
    stock.host.deferred = None;
    let mut c = stock.backend();
    c.init(&stock.host, Stage::Restore, &ours()).unwrap();
    assert_eq!(
        verdict(&c.resume_devices_late(&stock.host, 10)),
        &Verdict::Done(())
    );
    assert_eq!(stock.gpu.state(10), R);
}

/// A bad `CRIU_GPU_DIGESTS` (once ignored by the dump, fatal to the restore) is refused by both
/// alike, before either locks or starts anything (the dump at `init`, before its guardian, as
/// the restore), naming the key and where it came from (the wording is pinned once, in
/// criu-gpu-host's settings tests); a tree without CUDA processes does not read it.
#[test]
fn a_bad_digests_setting_is_refused_by_dump_and_restore_alike_up_front() {
    let bad = |w: World| w.set("CRIU_GPU_DIGESTS", "maybe");
    let w = bad(World::new(&[(10, R), (11, R)], &[]));
    let r = w.backend().init(&w.host, Stage::Dump, &Claims::default());
    let dump = settings_refusal(&r).clone();
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (R, R), "nothing locked");
    assert_eq!(w.guardians.spawned(), 0, "nothing started");

    let w = bad(restore_world(dumped(&[(10, R)]), &[(10, C)]));
    let r = w.backend().init(&w.host, Stage::Restore, &ours());
    let restore = settings_refusal(&r).clone();
    assert_eq!(w.guardians.spawned(), 0, "nothing started");
    assert_eq!(dump, restore);
    assert!(
        matches!(
            &dump,
            SettingsError { key: "CRIU_GPU_DIGESTS", value, from: Source::Environment, .. }
                if value == "maybe"
        ),
        "{dump:?}"
    );

    // A CRIU that names no root at `init`: refused at the first PAUSE_DEVICES, as early.
    let mut w = bad(World::new(&[(10, R), (11, R)], &[]));
    w.host.root = None;
    let (mut c, r) = w.dump(Stage::Dump);
    assert_eq!(settings_refusal(&r[0]), &dump);
    assert_eq!((w.gpu.state(10), w.gpu.state(11)), (R, R), "nothing locked");
    assert_eq!(w.guardians.spawned(), 0, "nothing started");
    c.exit(&w.host, Stage::Dump, false);

    let mut w = bad(World::new(&[], &[5, 6]));
    w.host.root = Some(5);
    let (_, r) = w.dump(Stage::Dump);
    assert!(r.iter().all(|x| matches!(x, Ok(Verdict::NotMine))), "{r:?}");
}

/// The settings refusal a hook answered (the backend named around it or not).
fn settings_refusal<T: std::fmt::Debug>(r: &Result<T, HookError>) -> &SettingsError {
    fn inner(e: &HookError) -> &SettingsError {
        match e {
            HookError::Settings(s) => s,
            HookError::In { source, .. } => inner(source),
            other => panic!("not a settings refusal: {other}"),
        }
    }
    match r {
        Err(e) => inner(e),
        Ok(v) => panic!("expected a settings refusal, got {v:?}"),
    }
}
