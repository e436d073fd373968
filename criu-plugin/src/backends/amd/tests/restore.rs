//! Restores: checked up front, restored in the task, refused when they cannot work.

use super::*;

use amd_kfd::image::ImageReader;
use criu_gpu_host::settings::SettingsError;
use criu_gpu_image::amd::AmdCheckError;

#[test]
fn a_restore_checks_images_up_front_then_restores_in_the_task() {
    let w = World::new();
    w.dumped(3);
    // A machine with two GPUs cannot take a one-GPU process: refused in init.
    let two = World::new();
    std::fs::remove_dir_all(two.root.join("topology")).unwrap();
    fixture::machine(1, &[fixture::MI210; 2], &[], 0)
        .write(&two.root.join("topology"))
        .unwrap();
    let e = two
        .backend()
        .init(&w.host, Stage::Restore, &restore_claims());
    assert!(
        matches!(
            failure(&e),
            AmdError::Check(AmdCheckError::Image { image, .. }) if image.ends_with("amdgpu-kfd-3.img")
        ),
        "{e:?}"
    );

    // On the right machine: the restored process (this one, after "dying") gets its state back.
    let me = std::process::id();
    std::fs::remove_dir_all(w.kfd().proc_dir(me)).unwrap();
    let mut a = w.backend();
    a.init(&w.host, Stage::Restore, &restore_claims()).unwrap();
    assert_eq!(
        w.guardians.watches.lock().unwrap().last(),
        Some(&Watch::KfdRestore),
        "a restore's guardian kills a half-restored tree"
    );
    let raw = match a.restore_ext_file(&w.host, 3).unwrap() {
        Verdict::Done(fd) => fd,
        other => panic!("{other:?}"),
    };
    close_handed_over(raw);
    assert_eq!(
        std::fs::read(w.kfd().bo_path(me, 0)).unwrap(),
        vec![0x5a; 1 << 20]
    );
    assert_eq!(
        verdict(&a.restore_ext_file(&w.host, 4)),
        &Verdict::NotMine,
        "no image: not ours"
    );
    // The VRAM mapping moved; CRIU gets the new offset and a render fd to map it through.
    let img = ImageReader::open(&w.images.join("amdgpu-kfd-3.img")).unwrap();
    let b = &img.meta.bos[0];
    match a
        .update_vma_map(&w.host, "/dev/dri/renderD128", b.addr, b.offset)
        .unwrap()
    {
        Verdict::Done((_, fd)) => close_handed_over(fd),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        verdict(&a.update_vma_map(&w.host, "/lib/libc.so.6", b.addr, 0)),
        &Verdict::NotMine
    );
    assert_eq!(
        verdict(&a.resume_devices_late(&w.host, 999_999)),
        &Verdict::NotMine
    );
    a.exit(&w.host, Stage::Restore, true);
}

#[test]
fn broken_or_missing_images_are_refused_before_restoring() {
    let w = World::new();
    let e = w.backend().init(&w.host, Stage::Restore, &restore_claims());
    assert!(
        matches!(failure(&e), AmdError::Check(AmdCheckError::ImagesMissing)),
        "{e:?}"
    );
    std::fs::write(w.images.join("amdgpu-kfd-1.img"), [b'x'; 64]).unwrap();
    let e = w.backend().init(&w.host, Stage::Restore, &restore_claims());
    assert!(
        matches!(
            failure(&e),
            AmdError::Check(AmdCheckError::Image { image, .. }) if image.ends_with("amdgpu-kfd-1.img")
        ),
        "{e:?}"
    );
    let e = Amd::with(
        Box::new(|| None),
        Arc::new(Settings::default()),
        Arc::new(|_| panic!("no guardian for a restore that cannot be")),
    )
    .init(&w.host, Stage::Restore, &Claims::default());
    assert!(
        matches!(failure(&e), AmdError::Check(AmdCheckError::NoKfd)),
        "{e:?}"
    );
    assert!(w.guardians.watches.lock().unwrap().is_empty());
}

#[test]
fn bad_settings_are_refused_by_name_before_restoring() {
    let w = World::new();
    w.dumped(3);
    let e = w.backend_with("CRIU_GPU_AMD_FD_BASE=lots\n").init(
        &w.host,
        Stage::Restore,
        &restore_claims(),
    );
    assert!(
        matches!(
            failure(&e),
            AmdError::Settings(SettingsError { key: "CRIU_GPU_AMD_FD_BASE", value, .. }) if value == "lots"
        ),
        "{e:?}"
    );
    let e =
        w.backend_with("KFD_FW_VER_CHECK=maybe\n")
            .init(&w.host, Stage::Restore, &restore_claims());
    assert!(
        matches!(
            failure(&e),
            AmdError::Settings(SettingsError {
                key: "KFD_FW_VER_CHECK",
                ..
            })
        ),
        "{e:?}"
    );
    // A relaxed check is read through the settings too (here it changes nothing).
    w.backend_with("KFD_FW_VER_CHECK=NO\nCRIU_GPU_AMD_FD_BASE=600\n")
        .init(&w.host, Stage::Restore, &restore_claims())
        .unwrap();
}
