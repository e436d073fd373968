use super::*;

const GIB: u64 = 1 << 30;

fn uuid(machine: u8, n: u8) -> GpuUuid {
    let mut b = [n; 16];
    b[0] = machine;
    GpuUuid(b)
}

/// GPU `n` of machine `m`: a model name and free GiB.
fn gpu(m: u8, n: u8, name: &str, free_gib: u64) -> Gpu {
    Gpu {
        index: n as u32,
        uuid: uuid(m, n),
        name: name.into(),
        memory_total: 80 * GIB,
        memory_used: (80 - free_gib) * GIB,
        memory_free: free_gib * GIB,
        minor: None,
    }
}

fn machine(m: u8, n: u8, free_gib: u64) -> Vec<Gpu> {
    (0..n).map(|i| gpu(m, i, "H100", free_gib)).collect()
}

fn held(pid: i32, m: u8, n: u8, gib: u64) -> GpuUsage {
    GpuUsage {
        pid,
        gpu: uuid(m, n),
        memory: Some(gib * GIB),
    }
}

fn pairs(text: &[(GpuUuid, GpuUuid)]) -> Request {
    Request::Pairs(DeviceMap::new(text.to_vec()).unwrap())
}

/// The map as (old GPU number, new GPU number) on machines `a` and `b`.
fn numbers(p: &Placement) -> Vec<(u8, u8)> {
    p.map
        .pairs()
        .iter()
        .map(|(o, n)| (o.0[1], n.0[1]))
        .collect()
}

fn assert_permutation(p: &Placement, at_checkpoint: &[Gpu], here: &[Gpu]) {
    let pairs = p.map.pairs();
    assert_eq!(
        pairs.len(),
        at_checkpoint.len(),
        "every checkpoint GPU once"
    );
    for g in at_checkpoint {
        assert_eq!(pairs.iter().filter(|(o, _)| *o == g.uuid).count(), 1);
    }
    for (i, (_, n)) in pairs.iter().enumerate() {
        assert!(here.iter().any(|g| g.uuid == *n), "present here");
        assert!(!pairs[..i].iter().any(|(_, m)| m == n), "distinct");
    }
}

#[test]
fn a_partial_swap_on_two_gpus_is_completed() {
    let gpus = machine(1, 2, 80);
    let p = place(
        &gpus,
        &[held(7, 1, 0, 10)],
        &gpus,
        &pairs(&[(uuid(1, 0), uuid(1, 1))]),
    )
    .unwrap();
    assert_eq!(numbers(&p), [(0, 1), (1, 0)]);
    assert_eq!(
        p.processes,
        [Landing {
            pid: 7,
            moves: vec![(uuid(1, 0), uuid(1, 1))]
        }]
    );
    assert_eq!(p.driver_map(), p.map);
}

#[test]
fn complete_maps_are_kept_as_given() {
    let gpus = machine(1, 4, 80);
    let given = [
        (uuid(1, 0), uuid(1, 3)),
        (uuid(1, 1), uuid(1, 2)),
        (uuid(1, 2), uuid(1, 1)),
        (uuid(1, 3), uuid(1, 0)),
    ];
    let p = place(&gpus, &[], &gpus, &pairs(&given)).unwrap();
    assert_eq!(p.map.pairs(), given);
}

#[test]
fn unnamed_gpus_stay_unless_their_gpu_is_taken() {
    let gpus = machine(1, 4, 80);
    let p = place(&gpus, &[], &gpus, &pairs(&[(uuid(1, 0), uuid(1, 2))])).unwrap();
    // 1 and 3 stay; 2 is taken by 0, so it takes the GPU 0 left.
    assert_eq!(numbers(&p), [(0, 2), (1, 1), (2, 0), (3, 3)]);
    assert_permutation(&p, &gpus, &gpus);
}

#[test]
fn auto_on_the_same_machine_moves_nothing() {
    let gpus = machine(1, 2, 60);
    let p = place(
        &gpus,
        &[held(1, 1, 0, 10), held(2, 1, 1, 10)],
        &gpus,
        &Request::Auto,
    )
    .unwrap();
    assert!(p.is_identity());
    assert!(
        p.driver_map().is_empty(),
        "drivers before r580 get no pairs"
    );
    assert_eq!(p.notes.len(), 2, "{:?}", p.notes);
}

#[test]
fn auto_moves_off_a_gpu_that_has_no_room_now() {
    let at_ckpt = machine(1, 2, 80);
    let here = vec![gpu(1, 0, "H100", 5), gpu(1, 1, "H100", 80)];
    let p = place(&at_ckpt, &[held(1, 1, 0, 10)], &here, &Request::Auto).unwrap();
    // GPU 1 held nothing, so it can go onto the full GPU 0.
    assert_eq!(numbers(&p), [(0, 1), (1, 0)]);
}

#[test]
fn auto_prefers_free_gpus_to_displacing_others() {
    let at_ckpt = machine(1, 2, 80);
    let mut here = vec![gpu(1, 0, "H100", 5), gpu(1, 1, "H100", 80)];
    here.push(gpu(1, 2, "H100", 80));
    let usage = [held(1, 1, 0, 10), held(2, 1, 1, 10)];
    let p = place(&at_ckpt, &usage, &here, &Request::Auto).unwrap();
    assert_eq!(numbers(&p), [(0, 2), (1, 1)]);
}

#[test]
fn across_machines_gpus_keep_their_order_and_processes_stay_spread() {
    for n in [2u8, 4, 8] {
        let at_ckpt = machine(1, n, 80);
        let here = machine(2, n, 80);
        let usage: Vec<GpuUsage> = (0..n).map(|i| held(100 + i as i32, 1, i, 20)).collect();
        let p = place(&at_ckpt, &usage, &here, &Request::Auto).unwrap();
        assert_permutation(&p, &at_ckpt, &here);
        assert_eq!(numbers(&p), (0..n).map(|i| (i, i)).collect::<Vec<_>>());
        let targets: Vec<GpuUuid> = p.processes.iter().map(|l| l.moves[0].1).collect();
        for (i, t) in targets.iter().enumerate() {
            assert!(!targets[..i].contains(t), "processes stay on distinct GPUs");
        }
    }
}

#[test]
fn across_machines_a_busy_gpu_is_avoided() {
    let at_ckpt = machine(1, 8, 80);
    let mut here = machine(2, 8, 80);
    here[0].memory_free = 30 * GIB;
    let mut usage: Vec<GpuUsage> = (0..8).map(|i| held(10 + i as i32, 1, i, 40)).collect();
    usage[7].memory = Some(10 * GIB); // GPU 7's process fits in 30 GiB
    let p = place(&at_ckpt, &usage, &here, &Request::Auto).unwrap();
    assert_permutation(&p, &at_ckpt, &here);
    let to_zero = p
        .map
        .pairs()
        .iter()
        .find(|(_, n)| *n == uuid(2, 0))
        .unwrap();
    assert_eq!(
        to_zero.0,
        uuid(1, 7),
        "only the small one fits on the busy GPU"
    );
}

#[test]
fn eight_gpus_with_partial_pairs() {
    let gpus = machine(1, 8, 80);
    let given = [(uuid(1, 0), uuid(1, 5)), (uuid(1, 3), uuid(1, 0))];
    let p = place(&gpus, &[], &gpus, &pairs(&given)).unwrap();
    assert_permutation(&p, &gpus, &gpus);
    for g in given {
        assert!(p.map.pairs().contains(&g), "operator pairs kept");
    }
    for i in [1u8, 2, 4, 6, 7] {
        assert_eq!(p.map.target(uuid(1, i)), uuid(1, i), "GPU {i} stays");
    }
    assert_eq!(
        p.map.target(uuid(1, 5)),
        uuid(1, 3),
        "5 takes the GPU 3 left"
    );
}

#[test]
fn fewer_gpus_here_are_refused() {
    let e = place(&machine(1, 4, 80), &[], &machine(2, 2, 80), &Request::Auto).unwrap_err();
    assert!(matches!(e, PlacementError::FewerGpus { .. }));
    assert!(e.to_string().contains("at least 4 GPUs"), "{e}");
}

#[test]
fn maps_naming_gpus_that_are_not_there_are_refused() {
    let gpus = machine(1, 2, 80);
    let e = place(&gpus, &[], &gpus, &pairs(&[(uuid(1, 0), uuid(9, 9))])).unwrap_err();
    assert!(matches!(e, PlacementError::NotHere { .. }), "{e}");
    assert!(e.to_string().contains(&uuid(9, 9).to_string()), "{e}");
    let e = place(&gpus, &[], &gpus, &pairs(&[(uuid(9, 9), uuid(1, 0))])).unwrap_err();
    assert!(matches!(e, PlacementError::NotAtCheckpoint { .. }), "{e}");
}

#[test]
fn two_old_gpus_onto_one_are_refused() {
    let text = format!(
        "{}={},{}={}",
        uuid(1, 0),
        uuid(1, 1),
        uuid(1, 1),
        uuid(1, 1)
    );
    assert!(matches!(
        text.parse::<Request>(),
        Err(ParseError::DuplicateNew(_))
    ));
    assert_eq!("auto".parse::<Request>(), Ok(Request::Auto));
}

#[test]
fn another_model_only_when_named() {
    let at_ckpt = machine(1, 2, 80);
    let here = vec![gpu(2, 0, "H100", 80), gpu(2, 1, "A100", 80)];
    let e = place(&at_ckpt, &[], &here, &Request::Auto).unwrap_err();
    assert!(matches!(e, PlacementError::ModelMismatch { .. }), "{e}");
    assert!(e.to_string().contains("explicitly"), "{e}");
    let p = place(&at_ckpt, &[], &here, &pairs(&[(uuid(1, 1), uuid(2, 1))])).unwrap();
    assert_eq!(numbers(&p), [(0, 0), (1, 1)]);
}

#[test]
fn too_little_free_memory_is_refused() {
    let at_ckpt = machine(1, 2, 80);
    let here = vec![gpu(2, 0, "H100", 20), gpu(2, 1, "H100", 20)];
    let usage = [held(1, 1, 0, 30)];
    let e = place(&at_ckpt, &usage, &here, &Request::Auto).unwrap_err();
    assert!(matches!(e, PlacementError::NoRoom { .. }), "{e}");
    assert!(
        e.to_string().contains("30.00 GiB") && e.to_string().contains("20.00 GiB free"),
        "{e}"
    );
    let e = place(&at_ckpt, &usage, &here, &pairs(&[(uuid(1, 0), uuid(2, 1))])).unwrap_err();
    assert!(
        matches!(e, PlacementError::NoRoom { .. }),
        "named pairs too: {e}"
    );
}

#[test]
fn when_each_fits_alone_but_not_together_the_placement_is_refused() {
    let at_ckpt = machine(1, 2, 80);
    let here = vec![gpu(2, 0, "H100", 60), gpu(2, 1, "H100", 40)];
    let usage = [held(1, 1, 0, 50), held(2, 1, 1, 50)];
    let e = place(&at_ckpt, &usage, &here, &Request::Auto).unwrap_err();
    assert!(matches!(e, PlacementError::NoPlacement { .. }), "{e}");
}

#[test]
fn unknown_memory_counts_as_none_and_is_noted() {
    let gpus = machine(1, 1, 80);
    let usage = [GpuUsage {
        pid: 5,
        gpu: uuid(1, 0),
        memory: None,
    }];
    let p = place(&gpus, &usage, &gpus, &Request::Auto).unwrap();
    assert!(
        p.notes.iter().any(|n| n.contains("not known")),
        "{:?}",
        p.notes
    );
    assert_eq!(
        p.processes[0].to_string(),
        format!("process 5: stays on {}", uuid(1, 0))
    );
}
