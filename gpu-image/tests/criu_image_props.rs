//! Property tests of the reader of CRIU's own images (`criu_image`), which reads files of an
//! image directory from disk: what CRIU writes reads back the same; a file cut anywhere is
//! refused, or, cut exactly between two entries, reads as those before the cut (CRIU's images
//! carry no checksum or count: CRIU itself reads such a file the same way); a flipped byte never
//! makes the reader panic (no checksum tells it from another value, here as in CRIU).

use std::path::Path;

use criu_gpu_image::criu_image::{
    cuda_mappers, dump_run_id, inventory_plugins, regular_files, RegFile,
};
use proptest::prelude::*;

// criu/include/magic.h
const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
const INVENTORY_MAGIC: u32 = 0x5831_3116;
const FILES_MAGIC: u32 = 0x5630_3138;
const REMAP_FPATH_MAGIC: u32 = 0x5913_3954;
const PSTREE_MAGIC: u32 = 0x5027_3030;
const CORE_MAGIC: u32 = 0x5505_3847;
const MM_MAGIC: u32 = 0x5749_2820;

/// Protobuf as CRIU writes it: varints and length-delimited fields.
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn uint(tag: u64, v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(tag << 3, &mut out);
    varint(v, &mut out);
    out
}

fn bytes(tag: u64, b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(tag << 3 | 2, &mut out);
    varint(b.len() as u64, &mut out);
    out.extend_from_slice(b);
    out
}

/// An image file: its magics, then each entry behind its 32-bit length. Also returns where each
/// entry ends (the cuts that leave a well-formed file).
fn image(magics: &[u32], entries: &[Vec<u8>]) -> (Vec<u8>, Vec<usize>) {
    let mut v: Vec<u8> = magics.iter().flat_map(|m| m.to_le_bytes()).collect();
    let mut ends = vec![v.len()];
    for e in entries {
        v.extend_from_slice(&(e.len() as u32).to_le_bytes());
        v.extend_from_slice(e);
        ends.push(v.len());
    }
    (v, ends)
}

/// files.img: file_entry { type = 1 (REG); id = 2; reg = 3 { id = 1; flags = 2; name = 6;
/// size = 8 } }
fn file_entry(f: &RegFile) -> Vec<u8> {
    let mut reg = [uint(1, f.id), uint(2, f.flags), bytes(6, f.name.as_bytes())].concat();
    if let Some(size) = f.size {
        reg.extend(uint(8, size));
    }
    [uint(1, 1), uint(2, f.id), bytes(3, &reg)].concat()
}

fn reg_files() -> impl Strategy<Value = Vec<RegFile>> {
    let file = (
        any::<u64>(),
        any::<u64>(),
        "[^\0]{0,40}",
        any::<Option<u64>>(),
    );
    proptest::collection::vec(file, 0..6).prop_map(|v| {
        v.into_iter()
            .enumerate()
            // Distinct ids, as CRIU gives them.
            .map(|(i, (id, flags, name, size))| RegFile {
                id: id.wrapping_mul(8).wrapping_add(i as u64),
                name,
                flags,
                size,
                remapped: false,
                ghost: None,
            })
            .collect()
    })
}

fn files_img(files: &[RegFile]) -> (Vec<u8>, Vec<usize>) {
    let entries: Vec<Vec<u8>> = files.iter().map(file_entry).collect();
    image(&[IMG_COMMON_MAGIC, FILES_MAGIC], &entries)
}

/// inventory.img: inventory_entry { img_version = 1; plugins_entry = 12 { plugins = 12 };
/// dump_criu_run_id = 13 }
fn inventory(plugins: &[String], run_id: &str) -> Vec<u8> {
    let list: Vec<u8> = plugins
        .iter()
        .flat_map(|p| bytes(12, p.as_bytes()))
        .collect();
    let entry = [uint(1, 2), bytes(12, &list), bytes(13, run_id.as_bytes())].concat();
    image(&[INVENTORY_MAGIC], &[entry]).0
}

fn write(dir: &Path, name: &str, b: &[u8]) {
    std::fs::write(dir.join(name), b).unwrap();
}

proptest! {
    // No regression files: a failure prints its minimal input, to be made a plain test.
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn regular_files_read_back_the_same(files in reg_files(), ghost in any::<prop::sample::Index>(), remap_id in any::<u64>()) {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "files.img", &files_img(&files).0);
        let mut want = files.clone();
        if !want.is_empty() {
            // remap_file_path_entry { orig_id = 1; remap_id = 2; remap_type = 3 (GHOST) }
            let g = &mut want[ghost.index(files.len())];
            let entry = [uint(1, g.id), uint(2, remap_id), uint(3, 1)].concat();
            write(d.path(), "remap-fpath.img", &image(&[IMG_COMMON_MAGIC, REMAP_FPATH_MAGIC], &[entry]).0);
            g.remapped = true;
            g.ghost = Some(remap_id);
        }
        prop_assert_eq!(regular_files(d.path()).unwrap(), want);
    }

    #[test]
    fn the_plugin_list_and_run_id_read_back_the_same(plugins in proptest::collection::vec("[a-z_]{1,20}", 0..5), run_id in "[0-9a-f-]{1,36}") {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "inventory.img", &inventory(&plugins, &run_id));
        prop_assert_eq!(inventory_plugins(d.path()).unwrap(), Some(plugins));
        prop_assert_eq!(dump_run_id(d.path()).unwrap(), Some(run_id));
    }

    #[test]
    fn a_cut_file_is_refused_unless_cut_between_entries(files in reg_files(), cut in any::<prop::sample::Index>()) {
        let d = tempfile::tempdir().unwrap();
        let (bytes, ends) = files_img(&files);
        let cut = cut.index(bytes.len());
        write(d.path(), "files.img", &bytes[..cut]);
        match (regular_files(d.path()), ends.iter().position(|e| *e == cut)) {
            (Err(_), None) => {}
            (Ok(read), Some(n)) => prop_assert_eq!(read, files[..n].to_vec()),
            (got, at) => prop_assert!(false, "cut at {} (entry end: {:?}): {:?}", cut, at, got),
        }
    }

    #[test]
    fn a_flipped_byte_never_panics_the_reader(files in reg_files(), at in any::<prop::sample::Index>(), mask in 1u8..=255, which in 0usize..5) {
        let d = tempfile::tempdir().unwrap();
        let names = ["files.img", "inventory.img", "pstree.img", "mm-100.img", "core-100.img"];
        let mut all = vec![files_img(&files).0, inventory(&["cuda_plugin".into()], "1-2-3")];
        all.extend(cuda_tree());
        let b = &mut all[which];
        let at = at.index(b.len());
        b[at] ^= mask;
        for (name, b) in names.iter().zip(&all) {
            write(d.path(), name, b);
        }
        let _ = regular_files(d.path());
        let _ = inventory_plugins(d.path());
        let _ = dump_run_id(d.path());
        let _ = cuda_mappers(d.path());
    }
}

/// pstree.img, mm-100.img and core-100.img of process 100 ("trainer"), which maps file id 7.
fn cuda_tree() -> Vec<Vec<u8>> {
    // vma_entry { start = 1; shmid = 4; status = 7 (VMA_FILE_PRIVATE | VMA_AREA_REGULAR) }
    let vma = [uint(1, 0x1000), uint(4, 7), uint(7, 1 | 1 << 6)].concat();
    let tc = [bytes(6, b"trainer"), uint(1, 1)].concat();
    vec![
        image(&[IMG_COMMON_MAGIC, PSTREE_MAGIC], &[uint(1, 100)]).0,
        image(&[IMG_COMMON_MAGIC, MM_MAGIC], &[bytes(14, &vma)]).0,
        image(&[IMG_COMMON_MAGIC, CORE_MAGIC], &[bytes(3, &tc)]).0,
    ]
}

/// The tree above, with the driver as file 7: one mapper, named from its core image.
#[test]
fn the_cuda_tree_of_the_flip_test_has_one_mapper() {
    let d = tempfile::tempdir().unwrap();
    let driver = RegFile {
        id: 7,
        name: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        flags: 0,
        size: None,
        remapped: false,
        ghost: None,
    };
    write(d.path(), "files.img", &files_img(&[driver]).0);
    for (name, b) in ["pstree.img", "mm-100.img", "core-100.img"]
        .iter()
        .zip(cuda_tree())
    {
        write(d.path(), name, &b);
    }
    let found = cuda_mappers(d.path()).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].pid, found[0].comm.as_str()), (100, "trainer"));
}
