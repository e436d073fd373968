//! The restored tree's CUDA processes: found by their pid in the image (or, for an image of
//! CRIU's C plugin, by the driver they map), each asked for the driver's restore thread, and
//! checked to reach its GPUs' device nodes, before anything is asked of the driver.

use std::time::{Duration, Instant};

use criu_gpu_image::cuda::{CudaImage, ProcessRecord};
use criu_gpu_image::placement::Plan;
use criu_gpu_image::restorable::CudaHolds as Holds;
use cuda_checkpoint_ctl::driver::ProcessState;

use super::outcome::Outcomes;
use super::Restore;
use crate::backends::cuda::error::{RestoreError, Who};
use crate::backends::cuda::settings::RestoreSettings;
use crate::core::Host;
use crate::guardian::proto::{Act, Answer, Order};
use crate::guardian::{Guardian, Ticket};

/// How long the driver may take to name a process's restore thread (it answers at once).
const PROBE_WAIT: Duration = Duration::from_secs(30);

/// A CUDA process of the checkpoint, found in the restored tree.
pub(super) struct Found {
    pub pid: i32,
    /// What it was at the dump.
    pub record: ProcessRecord,
}

impl Found {
    pub fn who(&self) -> Who {
        Who {
            pid: self.pid,
            comm: self.record.comm.clone(),
        }
    }
}

/// A found process whose restore thread is known: its GPU state can be restored.
pub(super) struct Restorable<'a> {
    pub found: &'a Found,
    pub thread: i32,
}

impl Restore {
    /// Finds the restored CUDA processes under `root` and restores them at once.
    pub(super) fn restore_tree(
        &self,
        host: &dyn Host,
        root: i32,
        holds: &Holds,
        plan: &Plan,
        settings: &RestoreSettings,
        g: &mut Guardian,
    ) -> Outcomes {
        let mut out = Outcomes::new(root);
        let tree = self.procs.tree(root);
        self.announce(g, &tree);
        let found = self.find(holds, &tree, &mut out);
        let upstream = matches!(holds, Holds::Upstream);
        let ready = self.probe(g, &found, plan, upstream, &mut out);
        let start = Instant::now();
        self.restore_all(host, g, &ready, plan, settings, &mut out);
        self.report(&found, &out, start);
        out
    }

    /// Tells the guardian which processes make the restored tree: it kills them if CRIU dies
    /// before their GPU state is back.
    fn announce(&self, g: &mut Guardian, tree: &[i32]) {
        let procs = &*self.procs;
        let _ = g.order(&Order::Restoring {
            tree: tree
                .iter()
                .filter_map(|p| Some((*p, procs.starttime(*p)?)))
                .collect(),
        });
    }

    /// The CUDA processes of the checkpoint in `tree`.
    fn find(&self, holds: &Holds, tree: &[i32], out: &mut Outcomes) -> Vec<Found> {
        match holds {
            Holds::Record(img) => self.find_recorded(img, tree, out),
            Holds::Upstream => self.find_mapping_cuda(tree),
        }
    }

    /// Each process of the record, by its pid in the image; one that is missing fails the tree.
    fn find_recorded(&self, img: &CudaImage, tree: &[i32], out: &mut Outcomes) -> Vec<Found> {
        let procs = &*self.procs;
        let mut found = Vec::new();
        for p in &img.processes {
            match tree
                .iter()
                .find(|&&pid| procs.ns_pid(pid) == Some(p.ns_pid))
            {
                Some(&pid) => found.push(Found {
                    pid,
                    record: p.clone(),
                }),
                None => out.tree_failed(RestoreError::NotInTree {
                    ns_pid: p.ns_pid,
                    comm: p.comm.clone(),
                }),
            }
        }
        found
    }

    /// An image of CRIU's C plugin names no process: every process that maps the driver (those
    /// without CUDA state say so when probed).
    fn find_mapping_cuda(&self, tree: &[i32]) -> Vec<Found> {
        let procs = &*self.procs;
        tree.iter()
            .filter(|&&pid| procs.libraries(pid).is_ok_and(|l| l.libcuda))
            .map(|&pid| Found {
                pid,
                record: ProcessRecord {
                    ns_pid: procs.ns_pid(pid).unwrap_or(pid),
                    pid,
                    comm: procs.comm(pid),
                    initial_state: ProcessState::Running,
                    gpus: Vec::new(),
                    nccl: false,
                    staging: Vec::new(),
                },
            })
            .collect()
    }

    /// Asks the driver for each found process's restore thread (its id, and that it is ours to
    /// restore) and checks its device nodes: the ones that can be restored.
    fn probe<'a>(
        &self,
        g: &mut Guardian,
        found: &'a [Found],
        plan: &Plan,
        upstream: bool,
        out: &mut Outcomes,
    ) -> Vec<Restorable<'a>> {
        let mut asked = Vec::new();
        for f in found {
            match self.ask_thread(g, f) {
                Ok(seq) => asked.push((f, seq)),
                Err(e) => out.set(f.pid, Err(e)),
            }
        }
        let seqs: Vec<_> = asked.iter().map(|(_, s)| *s).collect();
        if let Err(e) = g.wait_all(&seqs, Instant::now() + PROBE_WAIT, &mut || {}) {
            out.tree_failed(e);
        }
        let mut ready = Vec::new();
        for (f, seq) in asked {
            match self.restore_thread(g, f, seq, plan, upstream) {
                Ok(Some(thread)) => ready.push(Restorable { found: f, thread }),
                // Not a CUDA process after all.
                Ok(None) => {}
                Err(e) => out.set(f.pid, Err(e)),
            }
        }
        ready
    }

    /// Has the guardian track `f` and ask the driver for its restore thread.
    fn ask_thread(&self, g: &mut Guardian, f: &Found) -> Result<Ticket<Answer>, RestoreError> {
        g.order(&Order::Track {
            pid: f.pid,
            starttime: self.procs.starttime(f.pid).unwrap_or(0),
            comm: f.record.comm.clone(),
        })?;
        Ok(g.act(f.pid, Act::Probe)?)
    }

    /// The driver's answer for `f`: its restore thread, `None` for a process without CUDA state
    /// in an image of CRIU's C plugin. (No state query here: it needs the thread to run, and
    /// CRIU holds it.)
    fn restore_thread(
        &self,
        g: &mut Guardian,
        f: &Found,
        seq: Ticket<Answer>,
        plan: &Plan,
        upstream: bool,
    ) -> Result<Option<i32>, RestoreError> {
        match g.take(seq) {
            Some(Ok(Answer::Thread(tid))) => {
                self.device_nodes(f, plan)?;
                Ok(Some(tid))
            }
            Some(Err(e)) if upstream && e.not_cuda() => Ok(None),
            Some(Err(e)) => Err(RestoreError::NoRestoreThread(f.who(), e)),
            _ => Err(RestoreError::Silent {
                who: f.who(),
                waited: PROBE_WAIT,
            }),
        }
    }

    /// The driver opens the GPUs' device nodes inside the process: each must be there.
    fn device_nodes(&self, f: &Found, plan: &Plan) -> Result<(), RestoreError> {
        let missing = plan
            .nodes_for(&f.record)
            .into_iter()
            .find(|(_, minor)| !self.procs.has_gpu_node(f.pid, *minor));
        match missing {
            Some((gpu, minor)) => Err(RestoreError::NoDeviceNode {
                who: f.who(),
                gpu,
                minor,
            }),
            None => Ok(()),
        }
    }
}
