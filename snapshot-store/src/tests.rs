//! The store's behaviour on both back ends: round trips, dedup across snapshots, damaged and
//! missing chunks refused by name, garbage collection, and the lock between writers and
//! collections. The whole-system tests (tests/tests/store.rs) do the same through criu-gpu
//! with real CRIU.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::backend::object::ObjectStoreObjects;
use super::*;

fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// A tree like an image directory: a large "pages" file, small files, a subdirectory, a link.
fn tree(dir: &Path, pages: &[u8]) {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("pages-1.img"), pages).unwrap();
    std::fs::write(dir.join("inventory.img"), b"inventory").unwrap();
    std::fs::write(dir.join("empty.img"), b"").unwrap();
    std::fs::write(dir.join("sub/config.dump"), vec![b'x'; 100_000]).unwrap();
    std::fs::set_permissions(
        dir.join("sub/config.dump"),
        PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    std::os::unix::fs::symlink("../inventory.img", dir.join("sub/link")).unwrap();
}

fn same_tree(a: &Path, b: &Path) {
    for name in [
        "pages-1.img",
        "inventory.img",
        "empty.img",
        "sub/config.dump",
    ] {
        assert!(
            std::fs::read(a.join(name)).unwrap() == std::fs::read(b.join(name)).unwrap(),
            "{name} differs"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(mode(&a.join(name)), mode(&b.join(name)), "{name}'s mode");
    }
    assert_eq!(
        std::fs::read_link(b.join("sub/link")).unwrap(),
        Path::new("../inventory.img")
    );
}

fn small() -> Chunking {
    Chunking {
        min: 16 << 10,
        avg: 64 << 10,
        max: 256 << 10,
    }
}

fn opts() -> PutOptions {
    PutOptions {
        threads: 4,
        lock_wait: Duration::from_secs(5),
        ..PutOptions::default()
    }
}

fn memory_store() -> Store {
    let objects =
        ObjectStoreObjects::new(Arc::new(object_store::memory::InMemory::new()), "memory://")
            .unwrap()
            .with_lease_ttl(Duration::from_secs(3));
    Store::with_objects(Box::new(objects), Some(small())).unwrap()
}

fn fs_store(root: &Path) -> Store {
    Store::open_or_create(root.to_str().unwrap(), small()).unwrap()
}

fn round_trip(store: &Store, work: &Path) {
    let src = work.join("src");
    let mut pages = noise(3 << 20, 1);
    pages.extend(vec![0u8; 2 << 20]);
    pages.extend((0..(1 << 20)).map(|i| (i / 300) as u8));
    tree(&src, &pages);
    let m = store.put("one", &src, &opts()).unwrap();
    assert_eq!(m.written.bytes, pages.len() as u64 + 9 + 100_000);
    assert!(
        m.written.new_stored_bytes < m.written.new_bytes,
        "zeros and runs compress"
    );
    let out = work.join("out");
    let got = store.get("one", &out, &GetOptions::default()).unwrap();
    assert_eq!(got.bytes, m.written.bytes);
    same_tree(&src, &out);
    assert_eq!(store.names().unwrap(), vec!["one"]);
    assert!(matches!(
        store.put("one", &src, &opts()),
        Err(StoreError::SnapshotExists(_))
    ));
    assert!(matches!(
        store.get("two", &work.join("x"), &GetOptions::default()),
        Err(StoreError::NoSnapshot(_))
    ));
    assert!(matches!(
        store.get("one", &out, &GetOptions::default()),
        Err(StoreError::BadSource { .. })
    ));
}

#[test]
fn a_tree_reads_back_as_it_was_on_a_file_system() {
    let work = tempfile::tempdir().unwrap();
    round_trip(&fs_store(&work.path().join("store")), work.path());
}

#[test]
fn a_tree_reads_back_as_it_was_in_an_object_store() {
    let work = tempfile::tempdir().unwrap();
    round_trip(&memory_store(), work.path());
    let local = object_store::local::LocalFileSystem::new_with_prefix(work.path()).unwrap();
    let objects = ObjectStoreObjects::new(Arc::new(local), "local").unwrap();
    let store = Store::with_objects(Box::new(objects), Some(small())).unwrap();
    let again = work.path().join("again");
    std::fs::create_dir_all(&again).unwrap();
    round_trip(&store, &again);
}

#[test]
fn a_second_snapshot_stores_only_what_changed_even_where_it_moved() {
    let work = tempfile::tempdir().unwrap();
    let store = fs_store(&work.path().join("store"));
    let body = noise(8 << 20, 2);
    tree(&work.path().join("a"), &body);
    let first = store.put("a", &work.path().join("a"), &opts()).unwrap();
    // Pages moved by three pages and one MiB in the middle rewritten.
    let mut moved = noise(3 * 4096, 9);
    moved.extend_from_slice(&body);
    moved[4 << 20..5 << 20].copy_from_slice(&noise(1 << 20, 4));
    tree(&work.path().join("b"), &moved);
    let second = store.put("b", &work.path().join("b"), &opts()).unwrap();
    assert_eq!(first.written.new_bytes, first.written.bytes);
    let share = second.written.new_bytes as f64 / first.written.new_bytes as f64;
    assert!(share < 0.2, "the second wrote {share:.2} of the first");
    let usage = store.usage().unwrap();
    let b = usage.snapshots.iter().find(|s| s.name == "b").unwrap();
    assert!(b.shared_bytes > 6 << 20, "{b:?}");
    assert_eq!(b.own_bytes + b.shared_bytes, b.bytes, "{b:?}");
    assert!(usage.stored_bytes < (first.written.bytes + second.written.new_bytes) + (1 << 20));
    store
        .get("b", &work.path().join("out"), &GetOptions::default())
        .unwrap();
    assert_eq!(
        std::fs::read(work.path().join("out/pages-1.img")).unwrap(),
        moved
    );
}

fn a_chunk_key(store: &Store, name: &str, file: &str) -> (ChunkId, String) {
    let m = store.manifest(name).unwrap();
    let r = m
        .chunk_refs()
        .find(|r| r.file == file && r.offset > 0)
        .unwrap();
    (r.id, chunk_key(&r.id))
}

#[test]
fn a_damaged_or_missing_chunk_is_refused_by_name() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("store");
    let store = fs_store(&root);
    tree(&work.path().join("src"), &noise(2 << 20, 3));
    store.put("s", &work.path().join("src"), &opts()).unwrap();
    let (id, key) = a_chunk_key(&store, "s", "pages-1.img");
    let mut bytes = std::fs::read(root.join(&key)).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(root.join(&key), &bytes).unwrap();
    let err = store
        .get("s", &work.path().join("out"), &GetOptions::default())
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::DamagedChunk { .. }), "{text}");
    assert!(
        text.contains(&id.hex()) && text.contains("pages-1.img") && text.contains("hashes to"),
        "{text}"
    );
    let report = store.verify(&[], &GetOptions::default()).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    std::fs::remove_file(root.join(&key)).unwrap();
    let err = store
        .get("s", &work.path().join("out2"), &GetOptions::default())
        .unwrap_err();
    assert!(matches!(err, StoreError::MissingChunk { .. }), "{err}");
    assert!(err.to_string().contains(&id.hex()));
}

#[test]
fn garbage_collection_frees_only_what_no_snapshot_names() {
    let work = tempfile::tempdir().unwrap();
    let store = fs_store(&work.path().join("store"));
    let shared = noise(2 << 20, 5);
    let mut a = shared.clone();
    a.extend(noise(2 << 20, 6));
    let mut b = shared.clone();
    b.extend(noise(2 << 20, 7));
    tree(&work.path().join("a"), &a);
    tree(&work.path().join("b"), &b);
    store.put("a", &work.path().join("a"), &opts()).unwrap();
    let mb = store.put("b", &work.path().join("b"), &opts()).unwrap();
    store.delete("a", Duration::from_secs(5)).unwrap();
    let young = store.gc(&GcOptions::default()).unwrap();
    assert_eq!(
        young.deleted_chunks, 0,
        "within the grace period: {young:?}"
    );
    assert!(young.young_chunks > 0);
    let gc = GcOptions {
        grace: Duration::ZERO,
        ..GcOptions::default()
    };
    let dry = store
        .gc(&GcOptions {
            dry_run: true,
            ..gc.clone()
        })
        .unwrap();
    let done = store.gc(&gc).unwrap();
    assert_eq!(dry.deleted_chunks, done.deleted_chunks);
    assert!(done.deleted_bytes >= 2 << 20, "{done:?}");
    assert_eq!(done.kept_chunks, store.usage().unwrap().chunks);
    assert_eq!(store.gc(&gc).unwrap().deleted_chunks, 0);
    let out = work.path().join("out");
    store.get("b", &out, &GetOptions::default()).unwrap();
    assert_eq!(std::fs::read(out.join("pages-1.img")).unwrap(), b);
    assert_eq!(mb.written.bytes, store.usage().unwrap().logical_bytes);
}

fn gc_waits_for_writers(store: &Store) {
    let held = store
        .objects()
        .lock(Lock::Shared, Duration::from_secs(5))
        .unwrap();
    let second = store.objects().lock(Lock::Shared, Duration::from_secs(5));
    assert!(second.is_ok(), "writers share the store");
    drop(second);
    let gc = GcOptions {
        grace: Duration::ZERO,
        lock_wait: Duration::from_millis(300),
        ..GcOptions::default()
    };
    let err = store.gc(&gc).unwrap_err();
    assert!(matches!(err, StoreError::Busy { .. }), "{err}");
    drop(held);
    let collecting = store
        .objects()
        .lock(Lock::Exclusive, Duration::from_secs(5))
        .unwrap();
    let err = store
        .objects()
        .lock(Lock::Shared, Duration::from_millis(300))
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("garbage collection") || err.to_string().contains("gc-"),
        "{err}"
    );
    drop(collecting);
    store.gc(&gc).unwrap();
}

#[test]
fn a_collection_waits_for_writers_and_writers_for_it_on_a_file_system() {
    let work = tempfile::tempdir().unwrap();
    gc_waits_for_writers(&fs_store(&work.path().join("store")));
}

#[test]
fn a_collection_waits_for_writers_and_writers_for_it_in_an_object_store() {
    gc_waits_for_writers(&memory_store());
}

#[test]
fn an_expired_lease_holds_nothing() {
    let store = memory_store();
    let lease = |ms_from_now: i64| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        format!(
            r#"{{"expires_ms":{},"host":"h","pid":1}}"#,
            now + ms_from_now
        )
        .into_bytes()
    };
    let gc = GcOptions {
        grace: Duration::ZERO,
        lock_wait: Duration::from_millis(500),
        ..GcOptions::default()
    };
    // A writer at work, then the same writer dead: its lease left behind, no longer renewed.
    store
        .objects()
        .put("locks/use-h-1-1-0", &lease(60_000), false)
        .unwrap();
    assert!(matches!(store.gc(&gc), Err(StoreError::Busy { .. })));
    store
        .objects()
        .put("locks/use-h-1-1-0", &lease(-1), false)
        .unwrap();
    store.gc(&gc).unwrap();
}

fn two_writers_at_once(store: &Store, work: &Path) {
    let (a, b) = (noise(4 << 20, 8), noise(4 << 20, 9));
    tree(&work.join("a"), &a);
    tree(&work.join("b"), &b);
    std::thread::scope(|s| {
        let ta = s.spawn(|| store.put("a", &work.join("a"), &opts()));
        let tb = s.spawn(|| store.put("b", &work.join("b"), &opts()));
        ta.join().unwrap().unwrap();
        tb.join().unwrap().unwrap();
        let r1 = s.spawn(|| store.put("same", &work.join("a"), &opts()));
        let r2 = s.spawn(|| store.put("same", &work.join("b"), &opts()));
        let won = [r1.join().unwrap(), r2.join().unwrap()];
        assert_eq!(
            won.iter().filter(|r| r.is_ok()).count(),
            1,
            "one writer of a name wins"
        );
        assert!(won
            .iter()
            .any(|r| matches!(r, Err(StoreError::SnapshotExists(_)))));
    });
    for (name, data) in [("a", &a), ("b", &b)] {
        let out = work.join(format!("out-{name}"));
        store.get(name, &out, &GetOptions::default()).unwrap();
        assert_eq!(&std::fs::read(out.join("pages-1.img")).unwrap(), data);
    }
}

#[test]
fn two_writers_at_once_lose_nothing() {
    let work = tempfile::tempdir().unwrap();
    two_writers_at_once(&fs_store(&work.path().join("store")), work.path());
    let mem = tempfile::tempdir().unwrap();
    two_writers_at_once(&memory_store(), mem.path());
}

#[test]
fn a_store_is_made_once_and_its_settings_kept() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("store");
    let loc = root.to_str().unwrap();
    assert!(matches!(
        Store::open(loc),
        Err(StoreError::NotAStore { .. })
    ));
    Store::open_or_create(loc, small()).unwrap();
    let again = Store::open_or_create(loc, Chunking::default()).unwrap();
    assert_eq!(again.config().chunking, small(), "the first settings stay");
    std::fs::write(root.join("store.json"), b"{").unwrap();
    assert!(matches!(
        Store::open(loc),
        Err(StoreError::BadConfig { .. })
    ));
    assert!(matches!(
        fs_store(&work.path().join("s2")).manifest("a/b"),
        Err(StoreError::BadName(_))
    ));
}
