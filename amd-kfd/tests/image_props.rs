//! Property tests of the KFD image reader, which reads files from disk at restore: whatever is
//! written reads back the same, and any truncation, extension or flipped byte is refused (every
//! byte is covered by a checksum or a length the reader checks), never a panic, never a wrong
//! value.

use std::path::Path;

use amd_kfd::image::{BoRecord, DeviceRecord, ImageReader, ImageWriter, KfdImage, Section};
use amd_kfd::topology::fixture;
use proptest::prelude::*;

/// What an image holds: the private data and each buffer's contents.
#[derive(Debug, Clone)]
struct Content {
    pid: u32,
    priv_data: Vec<u8>,
    buffers: Vec<Vec<u8>>,
}

fn content() -> impl Strategy<Value = Content> {
    (
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..4),
    )
        .prop_map(|(pid, priv_data, buffers)| Content {
            pid,
            priv_data,
            buffers,
        })
}

fn section(w: &mut ImageWriter, bytes: &[u8]) -> Section {
    w.section(bytes.len() as u64, |b, off| {
        b.copy_from_slice(&bytes[off as usize..off as usize + b.len()]);
        Ok(())
    })
    .unwrap()
}

fn write(path: &Path, c: &Content) -> KfdImage {
    let mut w = ImageWriter::create(path).unwrap();
    let priv_data = section(&mut w, &c.priv_data);
    let bos = c
        .buffers
        .iter()
        .enumerate()
        .map(|(i, b)| BoRecord {
            addr: 0x7000_0000 + (i as u64) * 0x1000,
            size: b.len() as u64,
            offset: 0,
            gpu_id: 7,
            alloc_flags: amd_kfd::uapi::alloc::VRAM,
            contents: Some(section(&mut w, b)),
        })
        .collect();
    let meta = KfdImage {
        pid: c.pid,
        kfd_version: (1, 16),
        topology: fixture::single_gpu(),
        devices: vec![DeviceRecord {
            user_gpu_id: 7,
            actual_gpu_id: 7,
        }],
        bos,
        num_objects: c.buffers.len() as u32,
        priv_data,
    };
    w.finish(&meta).unwrap();
    meta
}

/// Opens the image and reads every section: what a restore does with it.
fn read(path: &Path) -> Result<(KfdImage, Vec<Vec<u8>>), amd_kfd::image::ImageError> {
    let r = ImageReader::open(path)?;
    let mut sections = vec![r.read_all(&r.meta.priv_data)?];
    for b in &r.meta.bos {
        if let Some(s) = &b.contents {
            sections.push(r.read_all(s)?);
        }
    }
    Ok((r.meta.clone(), sections))
}

/// A written image, its bytes, and where to put damaged copies.
fn written(c: &Content) -> (tempfile::TempDir, KfdImage, Vec<u8>) {
    let d = tempfile::tempdir().unwrap();
    let meta = write(&d.path().join("good.img"), c);
    let bytes = std::fs::read(d.path().join("good.img")).unwrap();
    (d, meta, bytes)
}

proptest! {
    // No regression files: a failure prints its minimal input, to be made a plain test.
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn what_is_written_reads_back_the_same(c in content()) {
        let (d, meta, _) = written(&c);
        let (got, sections) = read(&d.path().join("good.img")).unwrap();
        prop_assert_eq!(got, meta);
        let mut want = vec![c.priv_data.clone()];
        want.extend(c.buffers.iter().cloned());
        prop_assert_eq!(sections, want);
    }

    #[test]
    fn a_truncated_or_extended_image_is_refused(c in content(), cut in any::<prop::sample::Index>(), extra in 1usize..64) {
        let (d, _, bytes) = written(&c);
        let p = d.path().join("bad.img");
        std::fs::write(&p, &bytes[..cut.index(bytes.len())]).unwrap();
        prop_assert!(read(&p).is_err(), "cut at {}", cut.index(bytes.len()));
        let mut longer = bytes.clone();
        longer.extend(std::iter::repeat_n(0u8, extra));
        std::fs::write(&p, &longer).unwrap();
        prop_assert!(read(&p).is_err(), "{extra} bytes added");
    }

    #[test]
    fn a_flipped_byte_is_refused(c in content(), at in any::<prop::sample::Index>(), mask in 1u8..=255) {
        let (d, _, mut bytes) = written(&c);
        let at = at.index(bytes.len());
        bytes[at] ^= mask;
        let p = d.path().join("bad.img");
        std::fs::write(&p, &bytes).unwrap();
        prop_assert!(read(&p).is_err(), "byte {at} ^ {mask:#x} went unnoticed");
    }
}

/// Every byte of one image, flipped in turn: no byte of the file goes unchecked.
#[test]
fn no_byte_of_an_image_goes_unchecked() {
    let c = Content {
        pid: 42,
        priv_data: b"queue".to_vec(),
        buffers: vec![vec![0x5a; 16], vec![]],
    };
    let (d, _, bytes) = written(&c);
    let p = d.path().join("bad.img");
    let unnoticed: Vec<usize> = (0..bytes.len())
        .filter(|&at| {
            let mut b = bytes.clone();
            b[at] ^= 0x01;
            std::fs::write(&p, &b).unwrap();
            read(&p).is_ok()
        })
        .collect();
    assert!(
        unnoticed.is_empty(),
        "flips went unnoticed at {unnoticed:?}"
    );
}
