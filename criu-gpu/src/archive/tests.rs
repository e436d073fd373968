use super::tar::safe_relative;
use super::*;

#[test]
fn entries_that_climb_out_are_never_extracted() {
    assert_eq!(
        safe_relative(Path::new("./checkpoint/inventory.img")).as_deref(),
        Some("checkpoint/inventory.img")
    );
    assert_eq!(safe_relative(Path::new("../etc/passwd")), None);
    assert_eq!(safe_relative(Path::new("/etc/passwd")), None);
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = ::tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = ::tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

#[test]
fn a_container_archive_lists_images_and_extracts_only_metadata() {
    let d = tempfile::tempdir().unwrap();
    let archive = d.path().join("ckpt.tar");
    std::fs::write(
        &archive,
        tar_of(&[
            ("config.dump", b"{\"name\":\"trainer\"}"),
            ("checkpoint/inventory.img", b"inv"),
            ("checkpoint/pages-1.img", &[7u8; 5000]),
            (
                "checkpoint/dump.log",
                b"(00.000000) Version: 4.2.1 (gitid 0)\n",
            ),
            ("rootfs-diff.tar", b"x"),
        ]),
    )
    .unwrap();
    let c = Checkpoint::open(&archive).unwrap();
    assert_eq!(c.format, Format::ContainerArchive);
    assert_eq!(c.image_bytes(), (3 + 5000 + 37, 5000));
    assert!(c.images.join("inventory.img").exists());
    assert!(
        !c.images.join("pages-1.img").exists(),
        "memory pages are not copied"
    );
    assert_eq!(c.criu_version().as_deref(), Some("4.2.1"));
    assert!(c.other_files.iter().any(|f| f.name == "rootfs-diff.tar"));
}

#[test]
fn an_archive_without_images_says_so() {
    let d = tempfile::tempdir().unwrap();
    let archive = d.path().join("x.tar");
    std::fs::write(&archive, tar_of(&[("hello.txt", b"hi")])).unwrap();
    let e = Checkpoint::open(&archive).unwrap_err();
    assert!(e.to_string().contains("no CRIU images"), "{e}");
    std::fs::write(&archive, b"not a tar at all, just words").unwrap();
    assert!(Checkpoint::open(&archive).is_err());
}

#[test]
fn compressed_archives_are_read_in_this_process_and_a_damaged_one_says_so() {
    let d = tempfile::tempdir().unwrap();
    let tar = tar_of(&[
        ("checkpoint/inventory.img", b"inv"),
        ("checkpoint/pages-1.img", &[7u8; 5000]),
    ]);
    let zst = d.path().join("ckpt.tar.zst");
    std::fs::write(&zst, zstd::stream::encode_all(&tar[..], 3).unwrap()).unwrap();
    let gz = d.path().join("ckpt.tar.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &tar).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    for archive in [&zst, &gz] {
        let c = Checkpoint::open(archive).unwrap();
        assert_eq!(c.image_bytes(), (3 + 5000, 5000), "{}", archive.display());
        assert!(c.images.join("inventory.img").exists());
    }
    let bytes = std::fs::read(&zst).unwrap();
    std::fs::write(&zst, &bytes[..bytes.len() / 2]).unwrap();
    let e = Checkpoint::open(&zst).unwrap_err().to_string();
    assert!(
        e.contains("ckpt.tar.zst") && e.contains("not a readable"),
        "{e}"
    );
}
