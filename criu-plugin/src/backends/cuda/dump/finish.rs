//! The end of a dump: the record and the image digests once CRIU wrote every file, and, unless
//! CRIU kills the tasks after a successful dump, every CUDA process returned to its state before
//! the dump (the guardian does it if CRIU dies first).

use std::time::Instant;

use criu_gpu_image::cuda::{self as image, CudaImage, ProcessRecord};
use criu_gpu_image::{digest, record};

use super::{Dump, Phase};
use crate::backends::cuda::gib;
use crate::backends::cuda::settings::action_limit;
use crate::core::stats;
use crate::core::{FinalState, HookError, Host, ThreadWindow};
use crate::guardian::proto::{Order, Returned};

impl Dump {
    fn record(&self) -> Option<CudaImage> {
        let Phase::Paused(tree) = &self.phase else {
            return None;
        };
        let driver = self.link.guardian.as_ref()?.loaded().ok()?.clone();
        Some(CudaImage {
            driver,
            driver_version: tree.inventory.as_ref().map(|i| i.driver_version.clone()),
            gpus: tree
                .inventory
                .as_ref()
                .map(|i| i.gpus.clone())
                .unwrap_or_default(),
            processes: tree
                .cuda
                .iter()
                .map(|p| ProcessRecord {
                    ns_pid: p.ns_pid,
                    pid: p.who.pid,
                    comm: p.who.comm.clone(),
                    initial_state: p.initial,
                    gpus: p.usage.clone(),
                    nccl: p.nccl,
                    staging: p.staging.clone(),
                })
                .collect(),
            digests: Vec::new(),
            tree: tree
                .scanned
                .iter()
                .filter_map(|p| self.ctx.procs.ns_pid(*p))
                .collect(),
        })
    }

    pub(super) fn write_record(
        &self,
        host: &dyn Host,
        digests: Vec<digest::FileDigest>,
    ) -> Result<(), HookError> {
        let (Some(mut img), Some(dir)) = (self.record(), host.image_dir()) else {
            return Ok(());
        };
        img.digests = digests;
        record::write(&dir, image::RECORD, image::FORMAT, image::VERSION, &img)?;
        Ok(())
    }

    pub fn exit(&mut self, host: &dyn Host, success: bool) {
        let touched = matches!(&self.phase, Phase::Paused(t) if !t.cuda.is_empty());
        if touched {
            if success {
                self.record_digests(host);
            }
            let tasks_die = success && host.final_state() == Some(FinalState::Dead);
            if tasks_die {
                tracing::info!(
                    "dump done; the CUDA processes end with the tree, their state is in the images"
                );
                if let Some(g) = &mut self.link.guardian {
                    let _ = g.order(&Order::Commit);
                }
            } else {
                tracing::info!(
                    "{}: returning the CUDA processes to their state before the dump",
                    if success {
                        "the tasks keep running"
                    } else {
                        "the dump failed"
                    }
                );
                self.roll_back(host);
            }
        }
        if let Some(mut g) = self.link.guardian.take() {
            let _ = g.order(&Order::Bye);
        }
    }

    /// Rewrites the record with digests of the image files, now that CRIU wrote them all.
    fn record_digests(&self, host: &dyn Host) {
        if !self.ctx.settings().is_ok_and(|s| s.digests) {
            return;
        }
        let Some(dir) = host.image_dir() else { return };
        let start = Instant::now();
        let digests = digest::image_files(&dir)
            .map_err(|e| e.to_string())
            .and_then(|names| digest::digest(&dir, &names).map_err(|e| e.to_string()));
        match digests {
            Ok(d) => {
                let bytes: u64 = d.iter().map(|f| f.size).sum();
                let n = d.len();
                stats::phase("digests", start.elapsed(), 0, bytes);
                match self.write_record(host, d) {
                    Ok(()) => tracing::info!(
                        "recorded digests of {n} image files ({:.2} GiB) in {:.2} s",
                        gib(bytes),
                        start.elapsed().as_secs_f64()
                    ),
                    Err(e) => tracing::warn!("image digests not recorded: {e}"),
                }
            }
            Err(e) => tracing::warn!(
                "image digests not recorded ({e}): a restore cannot check the images"
            ),
        }
    }

    fn roll_back(&mut self, host: &dyn Host) {
        let Phase::Paused(tree) = &self.phase else {
            return;
        };
        let Some(g) = self.link.guardian.as_mut() else {
            return;
        };
        let bytes: u64 = tree
            .cuda
            .iter()
            .flat_map(|p| p.usage.iter().filter_map(|u| u.memory))
            .sum();
        // Settings that cannot be read (the dump was refused for them) leave the default.
        let set = self.ctx.settings().ok().and_then(|s| s.action_timeout);
        let limit = action_limit(set, (bytes > 0).then_some(bytes));
        let threads: Vec<(i32, i32)> = tree.cuda.iter().map(|p| (p.who.pid, p.tid)).collect();
        let start = Instant::now();
        let (mut window, failed) = ThreadWindow::open(host.threads(), &threads);
        for e in failed {
            tracing::error!("{e}");
        }
        let settled = g.order(&Order::RollBack).and_then(|()| {
            g.wait_until(start + limit, &mut || window.watch(), &|g| g.has_settled())
        });
        drop(window);
        match (settled, g.take_settled()) {
            (Ok(true), Some(outcomes)) => {
                for o in &outcomes {
                    match &o.result {
                        Ok(Returned::To(_) | Returned::Untouched) => {
                            tracing::info!(pid = o.pid, "{}", o.line())
                        }
                        Ok(Returned::Gone) => tracing::warn!("{}", o.line()),
                        Err(_) => tracing::error!("{}", o.line()),
                    }
                }
                tracing::info!("rollback took {:.2} s", start.elapsed().as_secs_f64());
            }
            (Err(e), _) => tracing::error!("{e}"),
            _ => tracing::error!(
                "the CUDA processes were not all back within {} s; the guardian (pid {}) goes on \
                 returning them once CRIU lets them go, and logs to syslog and {} in the image \
                 directory",
                limit.as_secs(),
                g.pid(),
                crate::guardian::machine::LOG_FILE
            ),
        }
    }
}
