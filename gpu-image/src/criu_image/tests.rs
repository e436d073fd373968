use std::path::Path;

use super::files::{FD_REG, FILES_MAGIC, REMAP_FPATH_MAGIC};
use super::tasks::{CORE_MAGIC, MM_MAGIC, PSTREE_MAGIC, VMA_FILE_PRIVATE, VMA_FILE_SHARED};
use super::wire::IMG_COMMON_MAGIC;
use super::*;

fn field(tag: u64, bytes: &[u8]) -> Vec<u8> {
    let mut v = vec![(tag << 3 | 2) as u8, bytes.len() as u8];
    v.extend_from_slice(bytes);
    v
}

fn inventory(entry: &[u8]) -> Vec<u8> {
    let mut v = INVENTORY_MAGIC.to_le_bytes().to_vec();
    v.extend_from_slice(&(entry.len() as u32).to_le_bytes());
    v.extend_from_slice(entry);
    v
}

#[test]
fn reads_the_plugin_list_and_its_absence() {
    let d = tempfile::tempdir().unwrap();
    let mut plugins = field(PLUGINS, b"cuda_plugin");
    plugins.extend(field(PLUGINS, b"criu_gpu_amd"));
    // img_version = 2 (varint), then the plugins entry.
    let mut entry = vec![1 << 3, 2];
    entry.extend(field(PLUGINS_ENTRY, &plugins));
    std::fs::write(d.path().join("inventory.img"), inventory(&entry)).unwrap();
    assert_eq!(
        inventory_plugins(d.path()).unwrap(),
        Some(vec!["cuda_plugin".to_owned(), "criu_gpu_amd".to_owned()])
    );
    std::fs::write(d.path().join("inventory.img"), inventory(&[1 << 3, 2])).unwrap();
    assert_eq!(inventory_plugins(d.path()).unwrap(), None);
}

fn varint_field(tag: u64, v: u64) -> Vec<u8> {
    let mut out = vec![(tag << 3) as u8];
    let mut v = v;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

fn image(magic: u32, entries: &[Vec<u8>]) -> Vec<u8> {
    let mut v = IMG_COMMON_MAGIC.to_le_bytes().to_vec();
    v.extend_from_slice(&magic.to_le_bytes());
    for e in entries {
        v.extend_from_slice(&(e.len() as u32).to_le_bytes());
        v.extend_from_slice(e);
    }
    v
}

fn reg_file(id: u64, name: &str) -> Vec<u8> {
    let mut e = varint_field(1, FD_REG);
    e.extend(varint_field(2, id));
    e.extend(field(3, &field(6, name.as_bytes())));
    e
}

fn mm(vmas: &[(u64, u64)]) -> Vec<u8> {
    let with_prot: Vec<(u64, u64, u64)> = vmas.iter().map(|&(id, st)| (id, st, 1)).collect();
    mm_prot(&with_prot)
}

/// mm_entry of vmas (shmid, status, prot).
fn mm_prot(vmas: &[(u64, u64, u64)]) -> Vec<u8> {
    let mut e = Vec::new();
    for &(shmid, status, prot) in vmas {
        let mut vma = varint_field(1, 0x1000);
        vma.extend(varint_field(4, shmid));
        vma.extend(varint_field(5, prot));
        vma.extend(varint_field(7, status));
        e.extend(field(14, &vma));
    }
    e
}

#[test]
fn files_mapped_shared_and_writable_are_found_whatever_their_flags() {
    let d = tempfile::tempdir().unwrap();
    let w = |name: &str, bytes: Vec<u8>| std::fs::write(d.path().join(name), bytes).unwrap();
    w(
        "pstree.img",
        image(PSTREE_MAGIC, &[varint_field(1, 100), varint_field(1, 101)]),
    );
    // 7: shared, read and write; 8: shared, read only; 9: private and writable (copy on
    // write: the file is never written).
    w(
        "mm-100.img",
        image(
            MM_MAGIC,
            &[mm_prot(&[
                (7, 1 | VMA_FILE_SHARED, 3),
                (8, 1 | VMA_FILE_SHARED, 1),
            ])],
        ),
    );
    w(
        "mm-101.img",
        image(MM_MAGIC, &[mm_prot(&[(9, 1 | VMA_FILE_PRIVATE, 3)])]),
    );
    let ids: Vec<u64> = shared_writable_mappings(d.path())
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(ids, vec![7]);
}

#[test]
fn a_file_opened_write_only_for_appending_is_the_one_criu_records_no_size_for() {
    let f = |flags| RegFile {
        id: 1,
        name: "/job/train.log".into(),
        flags,
        size: None,
        remapped: false,
        ghost: None,
    };
    // O_WRONLY|O_APPEND (|O_CREAT|O_LARGEFILE): Python's mode "a", `>>`, `tee -a`.
    assert!(f(0o0102001).appended());
    assert!(f(0o2001).appended());
    // O_RDWR|O_APPEND ("a+"): CRIU records its size.
    assert!(!f(0o2002).appended());
    assert!(!f(0o1).appended() && !f(0o2000).appended());
}

#[test]
fn lists_the_regular_files_with_their_sizes_flags_and_remaps() {
    let d = tempfile::tempdir().unwrap();
    let reg = |id: u64, flags: u64, name: &str, size: u64| {
        let mut r = varint_field(1, id);
        r.extend(varint_field(2, flags));
        r.extend(field(6, name.as_bytes()));
        r.extend(varint_field(8, size));
        let mut e = varint_field(1, FD_REG);
        e.extend(varint_field(2, id));
        e.extend(field(3, &r));
        e
    };
    let files = image(
        FILES_MAGIC,
        &[
            reg(5, 0o2101, "/job/rank0.log", 200),
            reg(6, 0, "/dev/shm/nccl-x", 4096),
        ],
    );
    std::fs::write(d.path().join("files.img"), files).unwrap();
    std::fs::write(
        d.path().join("remap-fpath.img"),
        image(
            REMAP_FPATH_MAGIC,
            &[[
                varint_field(1, 6),
                varint_field(2, 0x1c),
                varint_field(3, 1),
            ]
            .concat()],
        ),
    )
    .unwrap();
    let got = regular_files(d.path()).unwrap();
    assert_eq!(
        got,
        vec![
            RegFile {
                id: 5,
                name: "/job/rank0.log".into(),
                flags: 0o2101,
                size: Some(200),
                remapped: false,
                ghost: None
            },
            RegFile {
                id: 6,
                name: "/dev/shm/nccl-x".into(),
                flags: 0,
                size: Some(4096),
                remapped: true,
                ghost: Some(0x1c)
            }
        ]
    );
    assert!(got[0].writable() && !got[1].writable());
}

#[test]
fn a_ghost_left_by_a_killed_restore_is_found_and_nothing_older_or_else() {
    let d = tempfile::tempdir().unwrap();
    let name = d.path().join("nccl-left");
    let older_name = d.path().join("nccl-older");
    let kept = d.path().join("job.log");
    // Where a restore makes them: NAME.cr.REMAP_ID.ghost
    let ghost = d.path().join("nccl-left.cr.b.ghost");
    let older = d.path().join("nccl-older.cr.c.ghost");
    let reg = |id: u64, name: &Path, size: u64| {
        let mut r = varint_field(1, id);
        r.extend(field(6, name.to_str().unwrap().as_bytes()));
        r.extend(varint_field(8, size));
        let mut e = varint_field(1, FD_REG);
        e.extend(field(3, &r));
        e
    };
    std::fs::write(
        d.path().join("files.img"),
        image(
            FILES_MAGIC,
            &[
                reg(1, &name, 64),
                reg(2, &older_name, 64),
                reg(3, &kept, 64),
            ],
        ),
    )
    .unwrap();
    let ghost_of = |id, remap| {
        [
            varint_field(1, id),
            varint_field(2, remap),
            varint_field(3, 1),
        ]
        .concat()
    };
    std::fs::write(
        d.path().join("remap-fpath.img"),
        image(REMAP_FPATH_MAGIC, &[ghost_of(1, 0xb), ghost_of(2, 0xc)]),
    )
    .unwrap();
    std::fs::write(&older, [0u8; 64]).unwrap();
    let since = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(&ghost, [0u8; 64]).unwrap();
    std::fs::write(&kept, [0u8; 64]).unwrap();
    assert_eq!(
        leftover_ghosts(d.path(), since).unwrap(),
        vec![ghost.clone()]
    );
    std::fs::write(&ghost, [0u8; 65]).unwrap();
    assert!(
        leftover_ghosts(d.path(), since).unwrap().is_empty(),
        "larger than dumped: not the restore's"
    );
}

#[test]
fn finds_the_processes_that_mapped_the_cuda_driver() {
    let d = tempfile::tempdir().unwrap();
    let w = |name: &str, bytes: Vec<u8>| std::fs::write(d.path().join(name), bytes).unwrap();
    w(
        "files.img",
        image(
            FILES_MAGIC,
            &[
                reg_file(7, "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"),
                reg_file(8, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
                reg_file(9, "/opt/app/libcudart-not-the-driver.so"),
            ],
        ),
    );
    w(
        "pstree.img",
        image(PSTREE_MAGIC, &[varint_field(1, 100), varint_field(1, 101)]),
    );
    // 100 maps libc and the driver; 101 libc, and the driver's id in an anonymous VMA.
    w(
        "mm-100.img",
        image(
            MM_MAGIC,
            &[mm(&[(8, 1 | VMA_FILE_PRIVATE), (7, 1 | VMA_FILE_PRIVATE)])],
        ),
    );
    w(
        "mm-101.img",
        image(MM_MAGIC, &[mm(&[(8, 1 | VMA_FILE_PRIVATE), (7, 1)])]),
    );
    let mut tc = field(6, b"trainer");
    tc.extend(varint_field(1, 1));
    w("core-100.img", image(CORE_MAGIC, &[field(3, &tc)]));
    assert_eq!(
        cuda_mappers(d.path()).unwrap(),
        vec![CudaMapper {
            pid: 100,
            comm: "trainer".into()
        }]
    );
    w("mm-101.img", image(PSTREE_MAGIC, &[]));
    assert!(cuda_mappers(d.path())
        .unwrap_err()
        .to_string()
        .contains("wrong magic"));
    std::fs::remove_file(d.path().join("mm-101.img")).unwrap();
    assert!(cuda_mappers(d.path())
        .unwrap_err()
        .to_string()
        .contains("mm-101.img"));
}

#[test]
fn refuses_what_is_not_an_inventory() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("inventory.img");
    std::fs::write(&p, [0u8; 3]).unwrap();
    assert!(inventory_plugins(d.path()).is_err());
    let mut v = inventory(&field(PLUGINS_ENTRY, b"xx"));
    v[0] ^= 1;
    std::fs::write(&p, &v).unwrap();
    assert!(inventory_plugins(d.path())
        .unwrap_err()
        .to_string()
        .contains("wrong magic"));
    let v = inventory(&field(PLUGINS_ENTRY, b"xx"));
    std::fs::write(&p, &v[..v.len() - 1]).unwrap();
    assert!(inventory_plugins(d.path()).is_err());
}
