//! What CRIU leaves behind when it dies half-way, put right by the guardian: its network lock
//! (an nftables table named by its run), the dumped tree's sockets in TCP repair mode
//! (`repair.rs`), a killed restore's ghost files, and the huge page policy raised for the
//! dump. None of it depends on the GPUs' vendor.

use std::path::PathBuf;
use std::time::SystemTime;

use criu_gpu_host::netlock::{self, Released};
use criu_gpu_host::thp::Thp;
use process_facts::process;

use super::Leftovers;

/// The real leftovers of one watched CRIU command.
pub struct CriuLeftovers {
    /// The image directory (a path through the guardian's own descriptor of it).
    pub image_dir: Option<PathBuf>,
    /// The watched CRIU's run id (its network lock on dump).
    pub run_id: Option<String>,
    /// Dump: the root of the dumped tree, as CRIU has it.
    pub dump_root: Option<i32>,
    /// When the guardian started: ghost files older than that are not this restore's.
    pub started: SystemTime,
}

impl Leftovers for CriuLeftovers {
    fn unlock_network(&self, restore: bool) -> Option<String> {
        // A restore's lock is named by the run that dumped the image.
        let released = match restore {
            true => netlock::release_dumped(self.image_dir.as_ref()?),
            false => netlock::release(self.run_id.as_ref()?),
        };
        // A restore of images no CRIU run named has no lock to look for.
        let said = released.worth_saying() && !matches!(released, Released::NoRun(_));
        said.then(|| released.to_string())
    }

    fn release_repair(&self, tracked: &[i32]) -> Option<String> {
        // The dumped tree; without its root, the GPU processes and theirs.
        let roots = self.dump_root.map_or_else(|| tracked.to_vec(), |r| vec![r]);
        let mut tree: Vec<i32> = roots.into_iter().flat_map(process::tree).collect();
        tree.sort_unstable();
        tree.dedup();
        let n = super::repair::release(&tree);
        (n > 0).then(|| {
            format!(
                "took {n} TCP socket(s) of the job out of the repair mode CRIU had put them in: \
                 the connections work again (a process that used one before this saw an error)"
            )
        })
    }

    fn remove_ghosts(&self) -> Vec<String> {
        let Some(dir) = &self.image_dir else {
            return Vec::new();
        };
        let left = criu_gpu_image::criu_image::leftover_ghosts(dir, self.started);
        left.unwrap_or_default()
            .into_iter()
            .filter(|p| std::fs::remove_file(p).is_ok())
            .map(|p| {
                format!(
                    "removed {}, an unlinked file of the image that the killed restore had made \
                     for a moment (the next restore makes it again)",
                    p.display()
                )
            })
            .collect()
    }

    fn thp(&self) -> Option<Thp> {
        Some(Thp::default())
    }
}
