//! `--sparse-mib N`: host memory of which every other page holds data, as a PyTorch process's
//! heap is left by its allocators: as many separate runs of pages as pages written (a dump's
//! pagemap has an entry for each, a lazy move a request for each). Every step checks them.

/// Words in a page, and the stride between written words: every other page.
const PAGE_WORDS: usize = 4096 / 8;
const STRIDE: usize = 2 * PAGE_WORDS;

pub struct SparseHeap {
    /// Zeroed by the allocator without being touched (calloc of a fresh mapping): the pages
    /// never written stay holes.
    words: Vec<u64>,
    seed: u64,
}

impl SparseHeap {
    pub fn new(mib: usize, seed: u64) -> SparseHeap {
        let mut heap = SparseHeap {
            words: vec![0u64; mib * (1 << 20) / 8],
            seed,
        };
        for i in (0..heap.words.len()).step_by(STRIDE) {
            heap.words[i] = heap.value(i);
        }
        heap
    }

    fn value(&self, i: usize) -> u64 {
        (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ self.seed
    }

    /// The first written word that does not hold its value: (index, what it holds).
    pub fn first_bad(&self) -> Option<(usize, u64)> {
        (0..self.words.len())
            .step_by(STRIDE)
            .find(|&i| self.words[i] != self.value(i))
            .map(|i| (i, self.words[i]))
    }
}
