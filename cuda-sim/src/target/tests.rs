//! The helper thread's actions against the measured driver facts (docs/driver-facts.md), on a
//! simulated GPU daemon run in this test process.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use super::*;
use crate::control::{state, Op, Request as CtlRequest};
use crate::fault::Fault;
use crate::gpud::{self, derive_uuid, GpuSpec};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Starts a daemon with `n` GPUs of `mib` MiB each; returns its socket and the GPUs' UUIDs.
fn machine(n: u32, mib: u64) -> (String, Vec<[u8; 16]>) {
    let dir = std::env::temp_dir().join(format!(
        "cuda-sim-target-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    let socket: PathBuf = dir.join("gpud.sock");
    let gpus: Vec<GpuSpec> = (0..n)
        .map(|i| GpuSpec {
            name: "Sim".into(),
            memory: mib << 20,
            uuid: derive_uuid(&dir.display().to_string(), i),
        })
        .collect();
    let uuids = gpus.iter().map(|g| g.uuid).collect();
    let cfg = gpud::Config {
        socket: socket.clone(),
        gpus,
        driver_version: "test".into(),
        device_nodes: false,
    };
    std::thread::spawn(move || gpud::serve(cfg));
    while UnixStream::connect(&socket).is_err() {
        std::thread::sleep(Duration::from_millis(5));
    }
    (socket.display().to_string(), uuids)
}

/// A CUDA "process" holding `mib` MiB of patterned data on GPU `device`.
fn process(socket: &str, device: u32, mib: usize) -> (Runtime, u64) {
    let rt = Runtime::start_on(socket, None).unwrap();
    rt.set_current(Some(device)).unwrap();
    let dptr = rt.mem_alloc((mib << 20) as u64).unwrap();
    let data: Vec<u8> = (0..mib << 20).map(|i| (i % 251) as u8).collect();
    rt.htod(dptr, &data).unwrap();
    (rt, dptr)
}

fn req(op: Op) -> CtlRequest {
    CtlRequest {
        op,
        timeout_ms: 0,
        fault: Fault::None,
        pairs: vec![],
    }
}

fn with(op: Op, fault: Fault) -> CtlRequest {
    CtlRequest { fault, ..req(op) }
}

fn restore_to(pairs: Vec<([u8; 16], [u8; 16])>) -> CtlRequest {
    CtlRequest {
        pairs,
        ..req(Op::Restore)
    }
}

fn suspend(rt: &Runtime) {
    assert_eq!(rt.perform(&req(Op::Lock)), code::SUCCESS);
    assert_eq!(rt.perform(&req(Op::Checkpoint)), code::SUCCESS);
}

fn data_intact(rt: &Runtime, dptr: u64, mib: usize) -> bool {
    let mut back = vec![0u8; mib << 20];
    rt.dtoh(&mut back, dptr).unwrap();
    back.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8)
}

/// Memory in use on GPU `device`, as NVML would say.
fn used(socket: &str, device: u32) -> u64 {
    let mut s = UnixStream::connect(socket).unwrap();
    proto::Request::Hello { app: false }.send(&mut s).unwrap();
    proto::recv_answer(&mut s).unwrap().unwrap();
    proto::Request::MemInfo { device }.send(&mut s).unwrap();
    match proto::recv_answer(&mut s).unwrap().unwrap() {
        Reply::MemInfo { free, total } => total - free,
        other => panic!("{other:?}"),
    }
}

fn wait_used(socket: &str, device: u32, bytes: u64) {
    for _ in 0..200 {
        if used(socket, device) == bytes {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(used(socket, device), bytes);
}

/// F1: a lock that gives up answers NOT_READY and leaves the process running; F6: the
/// state machine answers ILLEGAL_STATE for an action the state does not allow.
#[test]
fn f1_a_lock_that_gives_up_answers_not_ready_and_leaves_the_process_running() {
    let (socket, _) = machine(1, 64);
    let (rt, dptr) = process(&socket, 0, 1);
    rt.busy_kernel(600).unwrap();
    let start = Instant::now();
    let r = rt.perform(&CtlRequest {
        timeout_ms: 200,
        ..req(Op::Lock)
    });
    assert_eq!(r, code::NOT_READY);
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert_eq!(rt.block().state(), state::RUNNING);
    assert_eq!(rt.perform(&req(Op::Unlock)), code::ILLEGAL_STATE, "F6");
    // Without a timeout the lock waits for the kernel.
    assert_eq!(rt.perform(&req(Op::Lock)), code::SUCCESS);
    assert_eq!(rt.block().state(), state::LOCKED);
    assert_eq!(rt.perform(&req(Op::Lock)), code::ILLEGAL_STATE, "F6");
    assert_eq!(rt.perform(&req(Op::Restore)), code::ILLEGAL_STATE, "F6");
    assert_eq!(rt.perform(&req(Op::Unlock)), code::SUCCESS);
    assert!(data_intact(&rt, dptr, 1));
}

/// F1 and F2: the lock's timeout counts from when the helper takes the request, not from
/// when it was posted.
#[test]
fn f2_the_lock_timeout_counts_from_pickup() {
    let (socket, _) = machine(1, 64);
    let (rt, _) = process(&socket, 0, 1);
    let rt = std::sync::Arc::new(rt);
    let caller = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", rt.ctl_fd.as_raw_fd()))
        .unwrap();
    let helper = {
        let rt = rt.clone();
        std::thread::spawn(move || {
            // The process cannot run its helper for 500 ms; then a 150 ms kernel is running.
            std::thread::sleep(Duration::from_millis(450));
            rt.busy_kernel(150).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            rt.serve_one();
        })
    };
    let lock = CtlRequest {
        timeout_ms: 300,
        ..req(Op::Lock)
    };
    let done = rt.block().call(&caller, &lock, &|| false).unwrap();
    helper.join().unwrap();
    assert_eq!(
        done.result,
        code::SUCCESS,
        "300 ms from pickup cover the kernel"
    );
    assert_eq!(rt.block().state(), state::LOCKED);
}

/// F8: restore maps must be complete permutations of the GPUs seen at checkpoint.
#[test]
fn f8_restore_maps_name_every_gpu_seen_at_checkpoint() {
    let (socket, g) = machine(2, 64);
    let (rt, dptr) = process(&socket, 0, 4);
    suspend(&rt);
    let bogus = [0x44; 16];
    for pairs in [
        vec![(g[0], g[1])],                               // only the process's GPU
        vec![(g[0], g[0])],                               // identity, but GPU 1 missing
        vec![(g[0], g[1]), (g[1], g[1])],                 // two onto one
        vec![(g[0], bogus), (g[1], g[0])],                // a GPU not here
        vec![(g[0], g[1]), (g[1], g[0]), (bogus, bogus)], // an extra pair
    ] {
        assert_eq!(rt.perform(&restore_to(pairs)), code::INVALID_VALUE);
        assert_eq!(rt.block().state(), state::CHECKPOINTED, "unharmed");
    }
    assert_eq!(
        rt.perform(&restore_to(vec![(g[1], g[0]), (g[0], g[1])])),
        code::SUCCESS
    );
    wait_used(&socket, 0, 0);
    assert_eq!(used(&socket, 1), 4 << 20);
    assert!(data_intact(&rt, dptr, 4));
}

/// F21: under CUDA_VISIBLE_DEVICES=1 the machine's GPU 1 is ordinal 0 and ordinal 1 is
/// CUDA_ERROR_INVALID_DEVICE; the memory lives on GPU 1, the checkpoint records both GPUs (F8),
/// and a restore map moves ordinal 0 with the memory.
#[test]
fn f21_visible_devices_renumber_the_machines_gpus() {
    let (socket, g) = machine(2, 64);
    let rt = Runtime::start_on(&socket, Some("1")).unwrap();
    assert_eq!(rt.devices().len(), 1);
    assert_eq!(rt.device(0).unwrap().uuid, g[1]);
    assert_eq!(rt.device(1).err(), Some(code::INVALID_DEVICE));
    assert_eq!(rt.set_current(Some(1)), Err(code::INVALID_DEVICE));
    rt.set_current(Some(0)).unwrap();
    let dptr = rt.mem_alloc(4 << 20).unwrap();
    let data: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    rt.htod(dptr, &data).unwrap();
    assert_eq!((used(&socket, 0), used(&socket, 1)), (0, 4 << 20));

    suspend(&rt);
    assert_eq!(
        rt.perform(&restore_to(vec![(g[1], g[1])])),
        code::INVALID_VALUE,
        "F8: the map names every GPU of the machine, not only the visible one"
    );
    assert_eq!(rt.perform(&req(Op::Restore)), code::SUCCESS);
    assert_eq!(used(&socket, 1), 4 << 20);
    assert_eq!(rt.perform(&req(Op::Checkpoint)), code::SUCCESS);
    let swap = vec![(g[0], g[1]), (g[1], g[0])];
    assert_eq!(rt.perform(&restore_to(swap)), code::SUCCESS);
    assert_eq!(rt.perform(&req(Op::Unlock)), code::SUCCESS);
    wait_used(&socket, 1, 0);
    assert_eq!(used(&socket, 0), 4 << 20);
    assert_eq!(
        rt.device(0).unwrap().uuid,
        g[0],
        "ordinal 0 moved with the memory"
    );
    assert!(data_intact(&rt, dptr, 4));
}

#[test]
fn f21_no_visible_gpu_is_no_device() {
    let (socket, g) = machine(2, 64);
    for spec in ["", "2", "-1,0"] {
        assert_eq!(
            Runtime::start_on(&socket, Some(spec)).err(),
            Some(code::NO_DEVICE)
        );
    }
    let text = crate::visible::uuid_text(&g[1]);
    let rt = Runtime::start_on(&socket, Some(&format!("{},0", &text[..12]))).unwrap();
    let seen: Vec<_> = rt.devices().iter().map(|d| d.uuid).collect();
    assert_eq!(seen, [g[1], g[0]]);
}

#[test]
fn f8_the_identity_map_of_one_gpu_is_accepted() {
    let (socket, g) = machine(1, 64);
    let (rt, dptr) = process(&socket, 0, 1);
    suspend(&rt);
    assert_eq!(
        rt.perform(&restore_to(vec![(g[0], [9; 16])])),
        code::INVALID_VALUE
    );
    assert_eq!(rt.perform(&restore_to(vec![(g[0], g[0])])), code::SUCCESS);
    assert!(data_intact(&rt, dptr, 1));
}

#[test]
fn f8_pair_rules() {
    let (a, b, c) = ([1; 16], [2; 16], [3; 16]);
    assert_eq!(check_pairs(&[a, b], &[a, b], &[(a, b), (b, a)]), Ok(()));
    assert_eq!(check_pairs(&[a, b], &[b, c], &[(a, c), (b, b)]), Ok(()));
    let bad = [
        vec![(a, b)],
        vec![(a, a), (a, b)],
        vec![(a, a), (b, a)],
        vec![(a, a), (c, b)],
        vec![(a, a), (b, c)],
    ];
    for pairs in bad {
        assert_eq!(
            check_pairs(&[a, b], &[a, b], &pairs),
            Err(code::INVALID_VALUE),
            "{pairs:?}"
        );
    }
}

/// F10 (E15): a restore without room leaves the process
/// unrestorable: a later restore answers OPERATING_SYSTEM, unlock ILLEGAL_STATE.
#[test]
fn f10_a_restore_without_room_leaves_the_process_unrestorable() {
    let (socket, _) = machine(1, 64);
    let (rt, _) = process(&socket, 0, 40);
    suspend(&rt);
    let (other, _) = process(&socket, 0, 40);
    assert_eq!(rt.perform(&req(Op::Restore)), code::OUT_OF_MEMORY);
    drop(other);
    wait_used(&socket, 0, 0);
    assert_eq!(rt.perform(&req(Op::Restore)), code::OPERATING_SYSTEM);
    assert_eq!(rt.perform(&req(Op::Unlock)), code::ILLEGAL_STATE);
    assert_eq!(rt.block().state(), state::CHECKPOINTED);
}

/// F19 (E13, E14): a failed checkpoint leaves the process locked with its data; unlock brings
/// it back, a restore first is refused, and every later checkpoint answers UNKNOWN.
#[test]
fn f19_a_failed_checkpoint_leaves_the_process_locked_and_uncheckpointable() {
    let (socket, _) = machine(1, 64);
    let (rt, dptr) = process(&socket, 0, 1);
    assert_eq!(rt.perform(&req(Op::Lock)), code::SUCCESS);
    assert_eq!(
        rt.perform(&with(Op::Checkpoint, Fault::Error(code::OUT_OF_MEMORY))),
        code::OUT_OF_MEMORY
    );
    assert_eq!(rt.block().state(), state::LOCKED);
    assert_eq!(rt.perform(&req(Op::Restore)), code::ILLEGAL_STATE);
    assert_eq!(rt.perform(&req(Op::Unlock)), code::SUCCESS);
    assert!(data_intact(&rt, dptr, 1));
    assert_eq!(rt.perform(&req(Op::Lock)), code::SUCCESS);
    assert_eq!(rt.perform(&req(Op::Checkpoint)), code::UNKNOWN);
    assert_eq!(rt.block().state(), state::LOCKED);
    assert_eq!(rt.perform(&req(Op::Unlock)), code::SUCCESS);
    assert!(data_intact(&rt, dptr, 1));
}

#[test]
fn fault_error_fails_before_any_change_and_error_after_changes_the_state() {
    let (socket, _) = machine(1, 64);
    let (rt, _) = process(&socket, 0, 1);
    assert_eq!(rt.perform(&with(Op::Lock, Fault::Error(999))), 999);
    assert_eq!(rt.block().state(), state::RUNNING);
    assert_eq!(rt.perform(&with(Op::Lock, Fault::ErrorAfter(2))), 2);
    assert_eq!(rt.block().state(), state::LOCKED);
    assert_eq!(rt.perform(&with(Op::Checkpoint, Fault::ErrorAfter(2))), 2);
    assert_eq!(rt.block().state(), state::CHECKPOINTED);
    wait_used(&socket, 0, 0);
}

#[test]
fn fault_failed_discards_the_gpu_state_for_good() {
    let (socket, _) = machine(1, 64);
    let (rt, _) = process(&socket, 0, 8);
    assert_eq!(rt.perform(&req(Op::Lock)), code::SUCCESS);
    assert_eq!(
        rt.perform(&with(Op::Checkpoint, Fault::Failed)),
        code::UNKNOWN
    );
    assert_eq!(rt.block().state(), state::FAILED);
    wait_used(&socket, 0, 0); // device data discarded
    for op in [Op::Lock, Op::Checkpoint, Op::Restore, Op::Unlock] {
        assert_eq!(rt.perform(&req(op)), code::ILLEGAL_STATE, "{op:?}");
    }
}

#[test]
fn fault_delay_and_hang() {
    let (socket, _) = machine(1, 64);
    let (rt, _) = process(&socket, 0, 1);
    let start = Instant::now();
    assert_eq!(
        rt.perform(&with(Op::Lock, Fault::Delay(300))),
        code::SUCCESS
    );
    assert!(start.elapsed() >= Duration::from_millis(300));
    let rt = std::sync::Arc::new(rt);
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hung = {
        let (rt, started) = (rt.clone(), started.clone());
        std::thread::spawn(move || {
            started.store(true, Ordering::SeqCst);
            rt.perform(&with(Op::Unlock, Fault::Hang))
        })
    };
    // From the moment it started, the action has as long as a 300 ms delay took above.
    while !started.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(!hung.is_finished(), "a hung action never finishes");
    assert_eq!(rt.block().state(), state::LOCKED);
}
