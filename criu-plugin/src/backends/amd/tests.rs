//! The AMD backend against the simulated KFD, with this test process as the GPU application.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use amd_kfd::device::sim::{SimBo, SimGpu, SimKfd, SimProcess};
use amd_kfd::device::Kfd;
use amd_kfd::topology::fixture;
use amd_kfd::uapi::alloc;

use super::*;
use crate::core::testing::FakeHost;

struct Machine {
    _dir: tempfile::TempDir,
    root: PathBuf,
    images: PathBuf,
}

fn machine() -> Machine {
    let d = tempfile::tempdir().unwrap();
    fixture::single_gpu()
        .write(&d.path().join("topology"))
        .unwrap();
    let images = d.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    Machine {
        root: d.path().to_path_buf(),
        images,
        _dir: d,
    }
}

fn backend(m: &Machine) -> Amd {
    let root = m.root.clone();
    Amd::with_detect(Box::new(move || {
        Some(Box::new(SimKfd::new(root.clone())) as Box<dyn Kfd>)
    }))
}

/// Makes this process a KFD process; returns its KFD file.
fn gpu_process(m: &Machine) -> OwnedFd {
    let k = SimKfd::new(m.root.clone());
    let me = std::process::id();
    let _ = std::fs::remove_dir_all(k.proc_dir(me));
    let fd = k.create_device(me).unwrap();
    let gpu = fixture::single_gpu().gpus().next().unwrap().gpu_id;
    let bo = SimBo {
        handle: 0,
        addr: 0x7f00_0000_0000,
        size: 1 << 20,
        gpu_id: gpu,
        alloc_flags: alloc::VRAM,
    };
    std::fs::write(k.bo_path(me, 0), vec![0x5a; 1 << 20]).unwrap();
    k.store(&SimProcess {
        pid: me,
        gpus: vec![SimGpu {
            user_gpu_id: gpu,
            actual_gpu_id: gpu,
        }],
        bos: vec![bo],
        queues: vec![1, 2, 3],
        paused: false,
        resume_pending: false,
    })
    .unwrap();
    fd
}

#[test]
fn dump_pauses_until_the_end_and_unpauses_when_the_process_lives_on() {
    let m = machine();
    let mut host = FakeHost::new(Some(m.images.clone()));
    let fd = gpu_process(&m);
    let mut a = backend(&m);
    a.init(&host, Stage::Dump, &Claims::default()).unwrap();
    let other = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(
        a.dump_ext_file(&host, other.as_fd(), 1),
        Ok(Verdict::NotMine)
    );
    assert_eq!(a.dump_ext_file(&host, fd.as_fd(), 7), Ok(Verdict::Done(())));
    assert!(m.images.join("amdgpu-kfd-7.img").exists());
    assert_eq!(*host.required.lock().unwrap(), ["criu_gpu_amd"]);
    let k = SimKfd::new(m.root.clone());
    assert!(k.load(std::process::id()).unwrap().paused);
    host.final_state = Some(crate::core::FinalState::Alive);
    a.exit(&host, Stage::Dump, true);
    assert!(
        !k.load(std::process::id()).unwrap().paused,
        "--leave-running unpauses"
    );
}

#[test]
fn restore_checks_images_up_front_then_restores_in_the_task() {
    let m = machine();
    let host = FakeHost::new(Some(m.images.clone()));
    let fd = gpu_process(&m);
    let mut a = backend(&m);
    a.init(&host, Stage::Dump, &Claims::default()).unwrap();
    a.dump_ext_file(&host, fd.as_fd(), 3).unwrap();
    a.exit(&host, Stage::Dump, true);
    drop(fd);
    let claims = Claims {
        ours: true,
        listed: true,
        others: vec![],
    };
    // A machine with two GPUs cannot take a one-GPU process: refused in init.
    let two = machine();
    std::fs::remove_dir_all(two.root.join("topology")).unwrap();
    fixture::machine(1, &[fixture::MI210; 2], &[], 0)
        .write(&two.root.join("topology"))
        .unwrap();
    let e = backend(&two)
        .init(&host, Stage::Restore, &claims)
        .unwrap_err();
    assert!(
        e.to_string().contains("the checkpoint used 1 GPU(s) but 2"),
        "{e}"
    );

    // On the right machine: the restored process (this one, after "dying") gets its state back.
    let me = std::process::id();
    std::fs::remove_dir_all(SimKfd::new(m.root.clone()).proc_dir(me)).unwrap();
    let mut a = backend(&m);
    a.init(&host, Stage::Restore, &claims).unwrap();
    let raw = match a.restore_ext_file(&host, 3).unwrap() {
        Verdict::Done(fd) => fd,
        other => panic!("{other:?}"),
    };
    // SAFETY: the hook handed over a new fd, as it does to CRIU.
    drop(unsafe { OwnedFd::from_raw_fd(raw) });
    let k = SimKfd::new(m.root.clone());
    assert_eq!(
        std::fs::read(k.bo_path(me, 0)).unwrap(),
        vec![0x5a; 1 << 20]
    );
    assert_eq!(
        a.restore_ext_file(&host, 4),
        Ok(Verdict::NotMine),
        "no image: not ours"
    );
    // The VRAM mapping moved; CRIU gets the new offset and a render fd to map it through.
    let img = ImageReader::open(&m.images.join("amdgpu-kfd-3.img")).unwrap();
    let b = &img.meta.bos[0];
    match a
        .update_vma_map(&host, "/dev/dri/renderD128", b.addr, b.offset)
        .unwrap()
    {
        Verdict::Done((_, fd)) => {
            assert!(fd >= 0);
            // SAFETY: a duplicate handed over to the caller.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        a.update_vma_map(&host, "/lib/libc.so.6", b.addr, 0),
        Ok(Verdict::NotMine)
    );
    assert_eq!(a.resume_devices_late(&host, 999_999), Ok(Verdict::NotMine));
}

#[test]
fn broken_or_missing_images_are_refused_before_restoring() {
    let m = machine();
    let host = FakeHost::new(Some(m.images.clone()));
    let claims = Claims {
        ours: true,
        listed: true,
        others: vec![],
    };
    let e = backend(&m)
        .init(&host, Stage::Restore, &claims)
        .unwrap_err();
    assert!(e.to_string().contains("no amdgpu-kfd-*.img"), "{e}");
    std::fs::write(m.images.join("amdgpu-kfd-1.img"), [b'x'; 64]).unwrap();
    let e = backend(&m)
        .init(&host, Stage::Restore, &claims)
        .unwrap_err();
    assert!(e.to_string().contains("bad magic"), "{e}");
    let e = Amd::with_detect(Box::new(|| None))
        .init(&host, Stage::Restore, &Claims::default())
        .unwrap_err();
    assert!(e.to_string().contains("no /dev/kfd"), "{e}");
}
