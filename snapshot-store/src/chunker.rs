//! Content-defined chunk boundaries (FastCDC, the `fastcdc` crate), found by several threads at
//! once with the same result as one thread, as desync does: each thread chunks a segment of
//! the file from its start, and the segments are joined where a chain of cut points reaches a
//! cut point of the next segment (from there on the two chains are the same, as each cut
//! depends only on the data after the one before). Since a boundary depends on the content
//! and not on its offset, data that moved in a file (GPU memory at another place of a pages
//! image) is cut into the same chunks after its first boundary.

use fastcdc::v2020::FastCDC;
use serde::{Deserialize, Serialize};

/// Chunk sizes: FastCDC's minimum, average and maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunking {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

impl Default for Chunking {
    /// 1 MiB on average: GPU snapshots are GiBs, and a chunk is a file or an object; an
    /// unchanged weight tensor is far larger than any chunk, so dedup loses little.
    fn default() -> Chunking {
        Chunking {
            min: 256 << 10,
            avg: 1 << 20,
            max: 4 << 20,
        }
    }
}

impl Chunking {
    /// Whether FastCDC takes these sizes.
    pub fn check(&self) -> Result<(), String> {
        use fastcdc::v2020::*;
        let (min, avg, max) = (self.min as usize, self.avg as usize, self.max as usize);
        let ok = (MINIMUM_MIN..=MINIMUM_MAX).contains(&min)
            && (AVERAGE_MIN..=AVERAGE_MAX).contains(&avg)
            && (MAXIMUM_MIN..=MAXIMUM_MAX).contains(&max)
            && min <= avg
            && avg <= max
            && max % 2 == 0;
        if ok {
            Ok(())
        } else {
            Err(format!(
                "chunk sizes {min}/{avg}/{max} are outside FastCDC's limits"
            ))
        }
    }
}

/// A segment shorter than this is not worth a thread of its own.
const SEGMENT_MIN: usize = 16 << 20;
/// Cuts past a segment's end tried before two chains are joined where they are.
const SYNC_TRIES: usize = 16;

/// The ends of `data`'s chunks, in order; the last is `data.len()` (none for empty data).
pub fn cut_points(data: &[u8], c: Chunking, threads: usize) -> Vec<usize> {
    let cdc = FastCDC::new(data, c.min as usize, c.avg as usize, c.max as usize);
    let n = (data.len() / SEGMENT_MIN).clamp(1, threads.max(1) * 4);
    let starts: Vec<usize> = (0..n).map(|i| data.len() / n * i).collect();
    let chains: Vec<Vec<usize>> = if n == 1 {
        vec![chain(&cdc, 0, data.len(), data.len())]
    } else {
        parallel_chains(&cdc, &starts, data.len(), threads)
    };
    join(&cdc, &starts, chains, data.len())
}

/// Cut points from `start` until the first at or past `until`.
fn chain(cdc: &FastCDC<'_>, start: usize, until: usize, len: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut p = start;
    while p < len && (out.is_empty() || p < until) {
        p = cdc.cut(p, len - p).1;
        out.push(p);
    }
    out
}

fn parallel_chains(
    cdc: &FastCDC<'_>,
    starts: &[usize],
    len: usize,
    threads: usize,
) -> Vec<Vec<usize>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut chains = vec![Vec::new(); starts.len()];
    let slots: Vec<std::sync::Mutex<&mut Vec<usize>>> =
        chains.iter_mut().map(std::sync::Mutex::new).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.min(starts.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&start) = starts.get(i) else { return };
                let until = starts.get(i + 1).copied().unwrap_or(len);
                **slots[i].lock().expect("a chain slot") = chain(cdc, start, until, len);
            });
        }
    });
    drop(slots);
    chains
}

/// One chain from the segments' chains: the first as it is, each next from where the chain so
/// far reaches one of its cut points.
fn join(cdc: &FastCDC<'_>, starts: &[usize], chains: Vec<Vec<usize>>, len: usize) -> Vec<usize> {
    let mut chains = chains.into_iter();
    let mut out = chains.next().unwrap_or_default();
    for (i, next) in chains.enumerate() {
        let end = starts.get(i + 2).copied().unwrap_or(len);
        let Some(&p) = out.last() else { break };
        if p >= end || p == len {
            continue;
        }
        extend_to_join(cdc, &mut out, &next, end, len);
    }
    out
}

fn extend_to_join(cdc: &FastCDC<'_>, out: &mut Vec<usize>, next: &[usize], end: usize, len: usize) {
    let mut tries = 0;
    loop {
        let p = *out.last().expect("a cut point");
        if next.binary_search(&p).is_ok() {
            out.extend(next.iter().copied().filter(|&q| q > p));
            return;
        }
        if p >= end || p == len {
            return;
        }
        if tries == SYNC_TRIES {
            // Content without boundaries (zeros cut at the maximum size): join at the next
            // segment's first cut after here, a chunk shorter than the maximum.
            out.extend(next.iter().copied().filter(|&q| q > p));
            return;
        }
        out.push(cdc.cut(p, len - p).1);
        tries += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    fn sequential(data: &[u8], c: Chunking) -> Vec<usize> {
        let cdc = FastCDC::new(data, c.min as usize, c.avg as usize, c.max as usize);
        chain(&cdc, 0, data.len(), data.len())
    }

    #[test]
    fn threads_cut_where_one_thread_cuts() {
        let c = Chunking::default();
        let data = noise(150 << 20, 7);
        let one = sequential(&data, c);
        assert_eq!(*one.last().unwrap(), data.len());
        for threads in [2, 3, 8] {
            assert_eq!(cut_points(&data, c, threads), one, "{threads} threads");
        }
    }

    #[test]
    fn zeros_and_small_files_are_cut_completely() {
        let c = Chunking::default();
        let mut data = vec![0u8; 70 << 20];
        data.extend(noise(30 << 20, 3));
        let cuts = cut_points(&data, c, 4);
        assert_eq!(*cuts.last().unwrap(), data.len());
        assert!(cuts
            .windows(2)
            .all(|w| w[0] < w[1] && w[1] - w[0] <= c.max as usize));
        assert_eq!(cut_points(b"abc", c, 4), vec![3]);
        assert!(cut_points(b"", c, 4).is_empty());
    }

    #[test]
    fn moved_content_is_cut_into_the_same_chunks() {
        let c = Chunking::default();
        let body = noise(64 << 20, 11);
        let mut moved = noise(3 * 4096 + 17, 5);
        moved.extend_from_slice(&body);
        let shift = moved.len() - body.len();
        let chunks = |d: &[u8]| -> std::collections::HashSet<Vec<u8>> {
            let cuts = cut_points(d, c, 4);
            let mut from = 0;
            cuts.iter()
                .map(|&to| {
                    let ch = d[from..to].to_vec();
                    from = to;
                    ch
                })
                .collect()
        };
        let (a, b) = (chunks(&body), chunks(&moved));
        let shared: usize = a.intersection(&b).map(Vec::len).sum();
        assert!(
            shared as f64 > 0.9 * body.len() as f64,
            "shared {shared} of {} after a shift of {shift}",
            body.len()
        );
    }
}
