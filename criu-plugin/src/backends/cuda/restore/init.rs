//! `init` of a restore, before CRIU creates anything: what the image holds for CUDA, its files
//! against their digests, the node (driver, GPUs, free memory) against the checkpoint, the GPU
//! map, and the pages the driver reads asked to arrive while it restores. What cannot succeed is
//! refused here, and nothing is started.

use std::path::Path;
use std::time::{Duration, Instant};

use criu_gpu_image::cuda::CudaImage;
use criu_gpu_image::restorable::{self, CudaHolds as Holds, Listed, NvidiaNode};
use cuda_checkpoint_ctl::driver::DriverInfo;
use cuda_checkpoint_ctl::inventory::Inventory;

use super::{Later, Phase, Ready, Restore};
use crate::backends::cuda::error::RestoreError;
use crate::backends::cuda::procs::Procs;
use crate::backends::cuda::settings::RestoreSettings;
use crate::backends::cuda::{gib, UPSTREAM_PLUGIN};
use crate::core::stats;
use crate::core::{Claims, HookError, Host, Lazy, Settings};
use crate::guardian::proto::{Order, Watch};
use crate::guardian::{Guardian, SpawnGuardian};

/// How long NVML may take to answer for the node's GPUs.
const INVENTORY_WAIT: Duration = Duration::from_secs(30);

fn check(e: restorable::CudaCheckError) -> HookError {
    HookError::gpu(RestoreError::Check(e))
}

impl Restore {
    pub fn init(
        host: &dyn Host,
        claims: &Claims,
        settings: &Settings,
        procs: Box<dyn Procs>,
        spawn: SpawnGuardian,
    ) -> Result<Restore, HookError> {
        let mut r = Restore {
            procs,
            phase: Phase::NoCuda,
        };
        let Some(dir) = host.image_dir() else {
            return Ok(r);
        };
        let Some(holds) = restorable::holds(&dir, listed(claims)).map_err(check)? else {
            return Ok(r);
        };
        match host.lazy() {
            Lazy::PostCopy => return Err(HookError::gpu(RestoreError::LazyPages)),
            Lazy::Complete => tracing::info!(
                "the pages arrive from the lazy-pages daemon while CRIU restores and the driver \
                 reads its data; every one is in place before the tasks resume"
            ),
            Lazy::No => {}
        }
        // Every setting the restore uses, before anything starts.
        let settings = RestoreSettings::read(settings)?;
        // Forked before any thread of the plugin's runs in CRIU (the digests are hashed on some).
        let mut g = spawn(Watch::Restore)?;
        let later = match &holds {
            Holds::Record(img) if settings.digests => verify_digests(img, &dir, &mut g)?,
            Holds::Record(_) => None,
            Holds::Upstream => None,
        };
        let (driver, inventory) = ask_node(&mut g, &holds)?;
        let node = NvidiaNode {
            driver: driver.as_ref().map_err(String::as_str),
            inventory: inventory.as_ref().map_err(String::as_str),
        };
        let checked = restorable::check_node(&holds, node, &settings.device_map).map_err(check)?;
        checked.notes.iter().for_each(|n| tracing::info!("{n}"));
        checked.warnings.iter().for_each(|w| tracing::warn!("{w}"));
        if let (Holds::Record(img), Lazy::No) = (&holds, host.lazy()) {
            overlap(host, settings.overlap, img);
        }
        r.phase = Phase::Ready(Box::new(Ready {
            settings,
            holds,
            plan: checked.plan,
            guardian: g,
            later,
        }));
        Ok(r)
    }
}

/// Checks the image files against the digests the dump recorded (`CRIU_GPU_DIGESTS` on), all
/// but the large pages images, which the guardian checks while CRIU restores (the answer: [`Later`]).
fn verify_digests(
    img: &CudaImage,
    dir: &Path,
    g: &mut Guardian,
) -> Result<Option<Later>, HookError> {
    let start = Instant::now();
    let Some(checked) = restorable::verify_digests(img, dir).map_err(check)? else {
        return Ok(None);
    };
    let bytes: u64 = checked.later.iter().map(|d| d.size).sum();
    stats::phase("verify", start.elapsed(), 0, checked.bytes);
    tracing::info!(
        "image files checked against their digests: {} files, {:.2} GiB, in {:.2} s; {:.2} \
         GiB of pages images are checked while CRIU restores",
        img.digests.len() - checked.later.len(),
        gib(checked.bytes),
        start.elapsed().as_secs_f64(),
        gib(bytes)
    );
    if checked.later.is_empty() {
        return Ok(None);
    }
    let seq = g.verify(checked.later)?;
    Ok(Some(Later { seq, bytes }))
}

/// What the image's inventory says of the CUDA backends.
fn listed(claims: &Claims) -> Listed {
    Listed {
        list: claims.listed,
        ours: claims.ours,
        upstream: claims.others.iter().any(|o| o == UPSTREAM_PLUGIN),
    }
}

type Answer<T> = Result<T, String>;

/// The node as the guardian sees it: its driver and NVML's GPUs (not asked without a driver).
/// The guardian is told meanwhile which pids the restored tree will have.
fn ask_node(
    g: &mut Guardian,
    holds: &Holds,
) -> Result<(Answer<DriverInfo>, Answer<Inventory>), HookError> {
    let driver = g.driver()?.cloned().map_err(str::to_owned);
    if let Holds::Record(img) = holds {
        g.order(&Order::Expect {
            pids: img.tree.clone(),
        })?;
    }
    let inventory = match driver {
        // No driver: the check says so; NVML is not asked.
        Err(_) => Err("no driver".to_owned()),
        Ok(_) => {
            let seq = g.ask_inventory()?;
            g.wait_all(&[seq], Instant::now() + INVENTORY_WAIT, &mut || {})?;
            g.take(seq)
                .unwrap_or_else(|| Err("NVML did not answer within 30 s".into()))
        }
    };
    Ok((driver, inventory))
}

/// Has CRIU let the pages of each process's staging (where its checkpoint put the device memory,
/// which only the driver's restore reads) arrive while the driver already restores: the restore
/// then costs about the longer of CRIU's pages and the driver, not their sum. The project's CRIU
/// only (patch 0007); CRIU puts every page in place before the tasks run either way.
fn overlap(host: &dyn Host, wanted: bool, img: &CudaImage) {
    let bytes = img.staging_bytes();
    if bytes == 0 {
        return;
    }
    if !wanted {
        tracing::info!("CRIU_GPU_OVERLAP=0: CRIU puts every page in place before the GPU restore");
        return;
    }
    let mut asked = 0;
    for p in &img.processes {
        for s in &p.staging {
            match host.defer_pages(p.ns_pid, s.start..s.end) {
                None => {
                    tracing::info!(
                        "this CRIU puts every page in place before the GPU restore (the project's \
                         CRIU overlaps the two)"
                    );
                    return;
                }
                Some(false) => tracing::warn!(
                    "CRIU refused to let the GPU data of process {} arrive during the GPU \
                     restore; it comes first",
                    p.ns_pid
                ),
                Some(true) => asked += 1,
            }
        }
    }
    tracing::info!(
        "the GPU restore overlaps CRIU's pages: {:.2} GiB of GPU data in {asked} range(s) \
         arrive while the driver restores (CRIU_GPU_OVERLAP=0: one after the other)",
        gib(bytes)
    );
}
