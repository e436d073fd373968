//! The dump and restore sequences against the simulated KFD, within this test process (which
//! plays the GPU application), and the simulated kernel's refusals.

use std::os::fd::AsFd;
use std::process::Command;

use crate::device::sim::{SimBo, SimGpu, SimKfd, SimProcess};
use crate::device::Kfd;
use crate::image::{self, ImageReader};
use crate::topology::{fixture, Checks};
use crate::uapi::alloc;

fn sim_machine(topo: &crate::topology::Topology) -> (tempfile::TempDir, SimKfd) {
    let d = tempfile::tempdir().unwrap();
    topo.write(&d.path().join("topology")).unwrap();
    let k = SimKfd::new(d.path().to_path_buf());
    (d, k)
}

/// Makes `pid` a KFD process with one VRAM buffer per GPU, filled with `seed`-derived bytes.
fn kfd_process(k: &SimKfd, pid: u32, topo: &crate::topology::Topology, seed: u8) -> SimProcess {
    std::fs::create_dir_all(k.proc_dir(pid)).unwrap();
    let gpus: Vec<SimGpu> = topo
        .gpus()
        .map(|g| SimGpu {
            user_gpu_id: g.gpu_id,
            actual_gpu_id: g.gpu_id,
        })
        .collect();
    let bos: Vec<SimBo> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| SimBo {
            handle: i as u32,
            addr: 0x7000_0000_0000 + ((i as u64) << 24),
            size: 3 << 20,
            gpu_id: g.user_gpu_id,
            alloc_flags: alloc::VRAM | alloc::WRITABLE,
        })
        .collect();
    for b in &bos {
        let data: Vec<u8> = (0..b.size)
            .map(|j| (j as u8).wrapping_mul(seed).wrapping_add(b.handle as u8))
            .collect();
        std::fs::write(k.bo_path(pid, b.handle), data).unwrap();
    }
    let p = SimProcess {
        pid,
        gpus,
        bos,
        queues: vec![seed; 64],
        paused: false,
        resume_pending: false,
    };
    k.store(&p).unwrap();
    p
}

#[test]
fn dump_then_restore_brings_back_buffers_and_state() {
    let topo = fixture::two_hives_of_four();
    let (_d, k) = sim_machine(&topo);
    let me = std::process::id();
    let before = kfd_process(&k, me, &topo, 7);
    let dev = k.create_device(me).unwrap();
    let images = tempfile::tempdir().unwrap();
    let dumped = crate::dump::dump(&k, dev.as_fd(), 12, images.path(), &topo).unwrap();
    assert_eq!(
        (dumped.gpus, dumped.bos, dumped.bytes),
        (8, 8, 8 * (3 << 20))
    );
    assert!(
        k.load(me).unwrap().paused,
        "queues stay paused until the caller unpauses"
    );
    k.unpause(dev.as_fd()).unwrap();
    let originals: Vec<Vec<u8>> = before
        .bos
        .iter()
        .map(|b| std::fs::read(k.bo_path(me, b.handle)).unwrap())
        .collect();

    // The process "dies"; its restored self comes back on another machine of the same shape.
    drop(dev);
    std::fs::remove_dir_all(k.proc_dir(me)).unwrap();
    let other = crate::topology::fixture::machine(
        2,
        &[fixture::MI300X; 8],
        &[&[0, 1, 2, 3], &[4, 5, 6, 7]],
        77,
    );
    other.write(&k.root().join("topology.new")).unwrap();
    std::fs::remove_dir_all(k.topology_dir()).unwrap();
    std::fs::rename(k.root().join("topology.new"), k.topology_dir()).unwrap();
    let img = ImageReader::open(&images.path().join(image::file_name(12))).unwrap();
    let r = crate::restore::restore(&k, &img, &other, &Checks::default(), 100).unwrap();
    assert!(std::os::fd::AsRawFd::as_raw_fd(&r.fd) >= 100);
    assert_eq!(r.gpus.len(), 8);
    let after = k.load(me).unwrap();
    assert!(after.resume_pending && after.paused);
    assert_eq!(
        after.queues, before.queues,
        "queue state comes back through the private data"
    );
    for (g, u) in after.gpus.iter().zip(&before.gpus) {
        assert_eq!(
            g.user_gpu_id, u.user_gpu_id,
            "the application keeps its gpu_ids"
        );
        assert_ne!(
            g.actual_gpu_id, g.user_gpu_id,
            "on the other machine's GPUs"
        );
    }
    for (b, data) in before.bos.iter().zip(&originals) {
        assert_eq!(&std::fs::read(k.bo_path(me, b.handle)).unwrap(), data);
    }
    assert_eq!(r.remaps.0.len(), 8);
    // RESUME comes from CRIU, never from the restored process.
    assert_eq!(k.resume(me).unwrap_err().errno, Some(libc::EPERM));
}

#[test]
fn the_simulated_kernel_enforces_the_order() {
    let topo = fixture::single_gpu();
    let (_d, k) = sim_machine(&topo);
    let me = std::process::id();
    kfd_process(&k, me, &topo, 3);
    let dev = k.create_device(me).unwrap();
    let fd = dev.as_fd();
    let info = crate::device::ProcessInfo {
        pid: me,
        num_devices: 1,
        num_bos: 1,
        num_objects: 1,
        priv_data_size: 0,
    };
    assert_eq!(
        k.checkpoint(fd, &info).unwrap_err().errno,
        Some(libc::EINVAL),
        "CHECKPOINT needs PROCESS_INFO"
    );
    assert_eq!(
        k.unpause(fd).unwrap_err().errno,
        Some(libc::EINVAL),
        "UNPAUSE needs a pause"
    );
    let info = k.process_info(fd).unwrap();
    assert_eq!(k.process_info(fd).unwrap_err().errno, Some(libc::EBUSY));
    let wrong = crate::device::ProcessInfo { num_bos: 2, ..info };
    assert_eq!(
        k.checkpoint(fd, &wrong).unwrap_err().errno,
        Some(libc::EINVAL),
        "counts must match"
    );
    let ck = k.checkpoint(fd, &info).unwrap();
    k.unpause(fd).unwrap();
    // RESTORE from a process that does not own the file is refused.
    let mut bos = ck.bos.clone();
    let other = k.create_device(1).unwrap();
    let e = k
        .restore(other.as_fd(), &ck.devices, &mut bos, 1, &ck.priv_data)
        .unwrap_err();
    assert_eq!(e.errno, Some(libc::EPERM));
    // RESTORE into a process that already has KFD state is refused.
    let e = k
        .restore(fd, &ck.devices, &mut bos, 1, &ck.priv_data)
        .unwrap_err();
    assert_eq!(e.errno, Some(libc::EBUSY));
    // RESTORE onto a number of GPUs the process does not see is refused.
    std::fs::remove_dir_all(k.proc_dir(me)).unwrap();
    let dev = k.create_device(me).unwrap();
    let two = [ck.devices[0], ck.devices[0]];
    let e = k
        .restore(dev.as_fd(), &two, &mut bos, 1, &ck.priv_data)
        .unwrap_err();
    assert_eq!(e.errno, Some(libc::EINVAL));
    // RESUME: no KFD state is "no such process"; before the buffers are mapped it is refused.
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    assert_eq!(k.resume(pid).unwrap_err().errno, Some(libc::ESRCH));
    let mut p = kfd_process(&k, pid, &topo, 1);
    p.resume_pending = true;
    k.store(&p).unwrap();
    let e = k.resume(pid).unwrap_err();
    assert!(e.message.contains("not mapped yet"), "{e}");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_corrupt_buffer_image_fails_the_restore() {
    let topo = fixture::single_gpu();
    let (_d, k) = sim_machine(&topo);
    let me = std::process::id();
    kfd_process(&k, me, &topo, 5);
    let dev = k.create_device(me).unwrap();
    let images = tempfile::tempdir().unwrap();
    crate::dump::dump(&k, dev.as_fd(), 1, images.path(), &topo).unwrap();
    drop(dev);
    std::fs::remove_dir_all(k.proc_dir(me)).unwrap();
    let path = images.path().join(image::file_name(1));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4000] ^= 0xff; // inside the buffer contents
    std::fs::write(&path, bytes).unwrap();
    let img = ImageReader::open(&path).unwrap();
    let e = crate::restore::restore(&k, &img, &topo, &Checks::default(), 100)
        .err()
        .unwrap();
    assert!(e.to_string().contains("checksum"), "{e}");
}

#[test]
fn a_failed_dump_unpauses_the_queues() {
    let topo = fixture::single_gpu();
    let (_d, k) = sim_machine(&topo);
    let me = std::process::id();
    let p = kfd_process(&k, me, &topo, 5);
    let dev = k.create_device(me).unwrap();
    // A buffer whose contents are gone: reading it fails half way through the dump.
    std::fs::remove_file(k.bo_path(me, p.bos[0].handle)).unwrap();
    let images = tempfile::tempdir().unwrap();
    assert!(crate::dump::dump(&k, dev.as_fd(), 1, images.path(), &topo).is_err());
    assert!(!k.load(me).unwrap().paused);
}
