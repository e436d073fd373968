use super::*;

/// A file with `contents`, recorded as the snapshot saw it (open for writing: hashed).
fn snapshot(dir: &Path, name: &str, contents: &[u8]) -> FileState {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    FileState {
        digest: Some(digest_of(&path, contents.len() as u64).unwrap()),
        path,
        size: contents.len() as u64,
        dev: meta.dev(),
        ino: meta.ino(),
        mtime_ns: mtime_ns(&meta),
        mapped: false,
        appended: false,
    }
}

fn append(path: &Path, more: &[u8]) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(more)
        .unwrap();
}

fn write_record(dir: &Path, files: Vec<FileState>) {
    let rec = FilesRecord {
        files,
        ..FilesRecord::default()
    };
    record::write(dir, FILE, FORMAT, VERSION, &rec).unwrap();
}

#[test]
fn a_file_that_only_grew_is_named_and_cut_back_to_its_snapshot() {
    let d = tempfile::tempdir().unwrap();
    let log = snapshot(d.path(), "rank0.log", b"step 0\nstep 10\n");
    append(&log.path, b"step 20\nstep 30\n");
    write_record(d.path(), vec![log.clone()]);
    let c = changes(d.path()).unwrap();
    assert_eq!(
        c,
        vec![(
            log.path.clone(),
            Change::Grew {
                from: 15,
                to: 31,
                appended: false
            }
        )]
    );
    assert!(c[0]
        .1
        .describe(&log.path)
        .contains("grew from 15 to 31 bytes"));
    let cut = cut_back(d.path()).unwrap();
    assert_eq!(cut.len(), 1);
    assert_eq!(std::fs::read(&log.path).unwrap(), b"step 0\nstep 10\n");
    assert!(changes(d.path()).unwrap().is_empty());
}

#[test]
fn anything_else_is_named_and_never_cut() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let rewritten_then_grown = snapshot(dir, "a.log", b"0123456789");
    std::fs::write(&rewritten_then_grown.path, b"X123456789 and more").unwrap();
    let shrunk = snapshot(dir, "b.log", b"0123456789");
    std::fs::write(&shrunk.path, b"0123").unwrap();
    let rewritten = snapshot(dir, "c.log", b"0123456789");
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::write(&rewritten.path, b"9876543210").unwrap();
    // Another file put in its place (made while the first still exists: another inode).
    let replaced = snapshot(dir, "d.log", b"0123456789");
    std::fs::write(dir.join("other"), b"0123456789").unwrap();
    std::fs::rename(dir.join("other"), &replaced.path).unwrap();
    let missing = snapshot(dir, "e.log", b"0123456789");
    std::fs::remove_file(&missing.path).unwrap();
    let unhashed = FileState {
        digest: None,
        ..snapshot(dir, "f.log", b"0123456789")
    };
    append(&unhashed.path, b"more");
    write_record(
        dir,
        vec![
            rewritten_then_grown.clone(),
            shrunk.clone(),
            rewritten.clone(),
            replaced.clone(),
            missing.clone(),
            unhashed.clone(),
        ],
    );
    let c = changes(dir).unwrap();
    assert_eq!(
        c,
        vec![
            (
                rewritten_then_grown.path.clone(),
                Change::GrewChanged {
                    from: 10,
                    to: 19,
                    hashed: true
                }
            ),
            (shrunk.path.clone(), Change::Shrank { from: 10, to: 4 }),
            (rewritten.path.clone(), Change::Rewritten),
            (replaced.path.clone(), Change::Replaced),
            (missing.path.clone(), Change::Missing),
            (
                unhashed.path.clone(),
                Change::GrewChanged {
                    from: 10,
                    to: 14,
                    hashed: false
                }
            ),
        ]
    );
    assert!(c.iter().all(|(_, ch)| !ch.can_cut_back()));
    assert!(cut_back(dir).unwrap().is_empty());
    assert_eq!(
        std::fs::read(&rewritten_then_grown.path).unwrap(),
        b"X123456789 and more",
        "no file is touched but one that only grew"
    );
}

#[test]
fn a_file_only_touched_has_not_changed() {
    let d = tempfile::tempdir().unwrap();
    let f = snapshot(d.path(), "t.log", b"same");
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::write(&f.path, b"same").unwrap();
    write_record(d.path(), vec![f]);
    assert!(changes(d.path()).unwrap().is_empty());
}

/// A file written through a shared mapping may keep its modification time (tmpfs always does):
/// its contents are compared all the same.
#[test]
fn a_mapped_file_rewritten_in_place_is_named_even_with_its_old_time() {
    let d = tempfile::tempdir().unwrap();
    let mapped = FileState {
        mapped: true,
        ..snapshot(d.path(), "ring", b"0123456789")
    };
    let plain = snapshot(d.path(), "plain", b"0123456789");
    for f in [&mapped, &plain] {
        let then = std::fs::metadata(&f.path).unwrap().modified().unwrap();
        std::fs::write(&f.path, b"9876543210").unwrap();
        let file = std::fs::File::options().write(true).open(&f.path).unwrap();
        file.set_modified(then).unwrap();
    }
    write_record(d.path(), vec![mapped.clone(), plain]);
    assert_eq!(
        changes(d.path()).unwrap(),
        vec![(mapped.path.clone(), Change::Rewritten)],
        "an open file whose time stayed is taken as it was; a mapped one is compared"
    );
}
