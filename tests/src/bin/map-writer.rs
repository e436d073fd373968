//! `map-writer FILE INTERVAL_MS`: writes `count N` over the first bytes of FILE (4096 bytes,
//! made if missing) through a shared writable mapping every INTERVAL_MS, as a job's memory-mapped
//! state or ring file is written: the file never changes size, and its modification time need not
//! change either.

use std::num::NonZeroUsize;
use std::time::Duration;

use nix::sys::mman::{mmap, MapFlags, ProtFlags};

const SIZE: usize = 4096;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(interval)) = (args.first(), args.get(1).and_then(|a| a.parse().ok()))
    else {
        panic!("usage: map-writer FILE INTERVAL_MS");
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    file.set_len(SIZE as u64).expect("set_len");
    let len = NonZeroUsize::new(SIZE).unwrap();
    let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    // SAFETY: a new shared mapping of SIZE bytes of a file this process holds open at that size;
    // nothing else in this process refers to that range.
    let map = unsafe { mmap(None, len, prot, MapFlags::MAP_SHARED, &file, 0) }.expect("mmap");
    drop(file);
    for n in 0u64.. {
        let line = format!("count {n:>12}\n");
        // SAFETY: `line` is shorter than the SIZE bytes mapped at `map`, which stay mapped for
        // the life of the process; only this thread writes them.
        unsafe { std::ptr::copy_nonoverlapping(line.as_ptr(), map.as_ptr().cast(), line.len()) };
        std::thread::sleep(Duration::from_millis(interval));
    }
}
