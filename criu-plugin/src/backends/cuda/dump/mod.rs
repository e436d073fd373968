//! A dump (or pre-dump) of a tree with CUDA processes.
//!
//! The root's PAUSE_DEVICES finds every CUDA process of the tree and locks them all at once,
//! inside what is left of CRIU's seize alarm: ranks of a job wait for each other, so locking one
//! after another can deadlock them. The first CHECKPOINT_DEVICES checks that each process is
//! seized and was not stopped meanwhile, lets the driver threads run and checkpoints all of them
//! at once, with a size-aware limit. `exit` writes the image digests and, unless CRIU kills the
//! tasks after a successful dump, returns every process to its state before the dump. Every
//! driver call goes through the guardian, which does that too if CRIU dies first.

mod checkpoint;
mod cluster;
mod finish;
mod lock;
mod pause;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use criu_gpu_image::cuda::{self as image, Span, Usage};
use cuda_checkpoint_ctl::driver::ProcessState;
use cuda_checkpoint_ctl::inventory::Inventory;
use process_facts::process::Libraries;

use super::error::{DumpError, Who};
use super::procs::Procs;
use super::settings::DumpSettings;
use crate::core::{stats, HookError, HookResult, Host, Settings, Stage, Verdict};
use crate::guardian::proto::Watch;
use crate::guardian::{Guardian, GuardianError, SpawnGuardian};
use criu_gpu_host::settings::SettingsError;

/// CRIU's default --timeout, for a CRIU whose alarm cannot be read.
const DEFAULT_SEIZE: Duration = Duration::from_secs(10);

/// A CUDA process of the dump.
#[derive(Debug, Clone)]
struct Proc {
    who: Who,
    /// The driver's helper thread.
    tid: i32,
    ns_pid: i32,
    /// Its CUDA state before the dump.
    initial: ProcessState,
    nccl: bool,
    usage: Vec<Usage>,
    /// Where its checkpoint put the device memory (`image::ProcessRecord::staging`).
    staging: Vec<Span>,
}

/// The tree as the root's PAUSE_DEVICES found it.
#[derive(Default)]
struct Tree {
    /// Every pid seen then: the others answer "not mine" without another look.
    scanned: BTreeSet<i32>,
    cuda: Vec<Proc>,
    /// The answer of the first CHECKPOINT_DEVICES, for the calls after it.
    checkpoint: Option<Result<(), String>>,
    inventory: Option<Inventory>,
}

enum Phase {
    /// Before the root's PAUSE_DEVICES.
    Start,
    Paused(Tree),
}

pub struct Dump {
    ctx: Ctx,
    link: Link,
    required: bool,
    phase: Phase,
    /// What each process of the tree maps, read once.
    libs: BTreeMap<i32, Libraries>,
    /// The tree as `init` found it (root first); CRIU asks for processes forked since one by
    /// one.
    tree: Vec<i32>,
}

/// What the dump knows of its command and machine.
struct Ctx {
    stage: Stage,
    /// The settings a dump uses, read when it starts; a bad one refuses the dump once the tree
    /// turns out to hold CUDA processes ([`Ctx::settings`]): at `init`, before the guardian
    /// starts, where CRIU names the tree; else at the first PAUSE_DEVICES, before any lock.
    settings: Result<DumpSettings, SettingsError>,
    procs: Box<dyn Procs>,
}

impl Ctx {
    fn settings(&self) -> Result<&DumpSettings, HookError> {
        self.settings
            .as_ref()
            .map_err(|e| HookError::from(e.clone()))
    }
}

/// The guardian, once the tree turned out to hold CUDA processes.
struct Link {
    spawn: SpawnGuardian,
    guardian: Option<Guardian>,
    /// NVML's answer, asked for as the guardian started.
    inventory: Option<crate::guardian::Ticket<Inventory>>,
}

impl Link {
    fn get(&mut self) -> Result<&mut Guardian, HookError> {
        let g = match self.guardian.take() {
            Some(g) => g,
            None => {
                let mut g = (self.spawn)(Watch::Dump)?;
                // NVML's view, asked now: it is ready by the time the checkpoint needs it.
                self.inventory = Some(g.ask_inventory()?);
                g
            }
        };
        Ok(self.guardian.insert(g))
    }

    /// The guardian that probed the tracked processes.
    fn started(&mut self) -> Result<&mut Guardian, HookError> {
        self.guardian
            .as_mut()
            .ok_or(HookError::from(GuardianError::Gone(0)))
    }

    /// Puts NVML's answer into `tree` once it has come, waiting for it until `until`; whether
    /// `tree` has it. An answer that has not come yet is left for a later call.
    fn inventory_into(&mut self, tree: &mut Tree, until: Instant) -> Result<bool, HookError> {
        let Some(seq) = self.inventory else {
            return Ok(tree.inventory.is_some());
        };
        let g = self.started()?;
        g.wait_all(&[seq], until, &mut || {})?;
        match g.take(seq) {
            Some(Ok(inv)) => tree.inventory = Some(inv),
            Some(Err(e)) => tracing::info!(
                "NVML unavailable, the processes' GPU memory is unknown (not recorded, host \
                 memory not checked): {e}"
            ),
            None => return Ok(false),
        }
        self.inventory = None;
        Ok(tree.inventory.is_some())
    }
}

impl Dump {
    /// Called from `init`: when the tree holds CUDA processes, checks the dump's settings (a bad
    /// one fails `init`, and CRIU the dump, before anything starts), starts the guardian
    /// (loading the driver takes a while, CRIU goes on meanwhile) and asks CRIU to seize
    /// without the freezer (a frozen process cannot be locked). Trees without CUDA are left
    /// exactly as CRIU dumps them.
    pub fn start(
        host: &dyn Host,
        stage: Stage,
        settings: &Settings,
        procs: Box<dyn Procs>,
        spawn: SpawnGuardian,
    ) -> Result<Dump, HookError> {
        let mut d = Dump {
            ctx: Ctx {
                stage,
                settings: DumpSettings::read(settings),
                procs,
            },
            link: Link {
                spawn,
                guardian: None,
                inventory: None,
            },
            required: false,
            phase: Phase::Start,
            libs: BTreeMap::new(),
            tree: Vec::new(),
        };
        // A record left by an earlier dump into the same directory is not this image's.
        if let Some(dir) = host.image_dir() {
            if std::fs::remove_file(dir.join(image::RECORD)).is_ok() {
                tracing::info!("removed {} of an earlier dump", image::RECORD);
            }
        }
        let Some(root) = host.dump_root() else {
            return Ok(d);
        };
        let start = Instant::now();
        d.tree = d.ctx.procs.tree(root);
        stats::scanned(0, start.elapsed());
        let pids = d.tree.clone();
        if d.candidates(&pids).is_empty() {
            return Ok(d);
        }
        // Every setting the dump uses, before anything starts (as the restore's `init`).
        d.ctx.settings()?;
        if stage == Stage::Dump && !host.use_interrupt_only_seizing() {
            tracing::warn!(
                "this CRIU cannot seize without the freezer; CUDA processes in a frozen cgroup \
                 cannot be locked"
            );
        }
        if let Err(e) = d.link.get() {
            // Said again, with the processes, when the tree is paused.
            tracing::debug!("{e}");
        }
        Ok(d)
    }

    /// The processes among `pids` that map the CUDA driver, with whether they map NCCL.
    fn candidates(&mut self, pids: &[i32]) -> Vec<(i32, bool)> {
        let start = Instant::now();
        let mut out = Vec::new();
        let mut read = 0;
        for &pid in pids {
            let libs = match self.libs.get(&pid) {
                Some(l) => *l,
                None => match self.ctx.procs.libraries(pid).inspect(|_| read += 1) {
                    Ok(l) => *self.libs.entry(pid).or_insert(l),
                    Err(_) => continue,
                },
            };
            if libs.libcuda {
                out.push((pid, libs.nccl));
            }
        }
        stats::scanned(read, start.elapsed());
        out
    }

    pub fn pause(&mut self, host: &dyn Host, pid: i32) -> HookResult {
        let tree = match &mut self.phase {
            Phase::Start => {
                // The first call is for the root: the whole tree is paused now.
                let pids = match self.tree.first() {
                    Some(&root) if root == pid => std::mem::take(&mut self.tree),
                    _ => {
                        let start = Instant::now();
                        let pids = self.ctx.procs.tree(pid);
                        stats::scanned(0, start.elapsed());
                        pids
                    }
                };
                let candidates = self.candidates(&pids);
                if !candidates.is_empty() {
                    // Every setting the dump uses, before anything is locked (checked at `init`
                    // already where CRIU named the tree's root then).
                    self.ctx.settings()?;
                    // CRIU would fail on these after the GPU checkpoint: refused before any lock.
                    let support = host.ring_support();
                    if let Some(refusal) = pids
                        .iter()
                        .find_map(|&p| self.ctx.procs.io_uring(p, support))
                    {
                        return Err(HookError::gpu(DumpError::Refused(refusal)));
                    }
                }
                self.phase = Phase::Paused(Tree {
                    scanned: pids.iter().copied().collect(),
                    ..Tree::default()
                });
                let budget = host.seize_time_left().unwrap_or(DEFAULT_SEIZE);
                return self.pause_some(host, candidates, pid, budget);
            }
            Phase::Paused(tree) => tree,
        };
        if tree.cuda.iter().any(|p| p.who.pid == pid) {
            return Ok(Verdict::Done(()));
        }
        if !tree.scanned.insert(pid) {
            return Ok(Verdict::NotMine);
        }
        // Forked after the root was paused: paused alone, with what is left of the budget.
        let budget = host.seize_time_left().unwrap_or(DEFAULT_SEIZE);
        let candidates = self.candidates(&[pid]);
        self.pause_some(host, candidates, pid, budget)
    }
}
