//! Where checkpointed GPU state goes on restore: turns what the operator asks (OLD=NEW pairs,
//! partial or complete, or `auto`) into the map the driver needs.
//!
//! The driver (r580) takes a map only if it names every GPU it saw at checkpoint time exactly
//! once, each onto a distinct GPU of this machine (docs/driver-facts.md, F8), so the map is a
//! complete placement of those GPUs. The rules:
//! * an operator pair is kept as given (even onto another model: the operator named it);
//! * other GPUs stay where they are when that GPU is here, free of operator pairs and has room
//!   for what the processes held on it; else they take a free GPU of the same model with room,
//!   preferring one no other checkpoint GPU wants to stay on, then the same index, then the
//!   most free memory. A swap is completed by itself: `U0=U1` on two GPUs gives `U0=U1,U1=U0`;
//! * the GPUs stay distinct, so processes stay spread as they were;
//! * anything impossible is refused before anything is restored, with the reason and the fix.
//!
//! `auto` is the same with no operator pairs. Pure functions over [`Gpu`] lists, so the CLI
//! (this machine's GPUs at both ends) and the CRIU plugin (the GPUs recorded at dump) share it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::driver::{DeviceMap, GpuUuid, ParseError};
use crate::inventory::{Gpu, GpuUsage};

#[cfg(test)]
mod tests;

/// What the operator asked for: the one model of a device map (`cuda-checkpoint-ctl
/// --device-map`, `CRIU_GPU_DEVICE_MAP`, `criu-gpu restore --device-map`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Request {
    /// Every GPU where it was, by UUID (nothing asked).
    #[default]
    Same,
    /// Place every GPU automatically.
    Auto,
    /// These pairs, completed with the GPUs they do not name.
    Pairs(DeviceMap),
}

impl FromStr for Request {
    type Err = ParseError;

    /// `auto`, `same` (or nothing), or `OLD=NEW[,...]` as `cuda-checkpoint --device-map` takes
    /// it: the one parser of a device map.
    fn from_str(s: &str) -> Result<Request, ParseError> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("auto") {
            Ok(Request::Auto)
        } else if t.is_empty() || t.eq_ignore_ascii_case("same") {
            Ok(Request::Same)
        } else {
            t.parse().map(Request::Pairs)
        }
    }
}

/// Where one process's GPU state lands (for the logs).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Landing {
    pub pid: i32,
    /// (GPU at checkpoint, GPU here); empty when it is not known which GPUs it used.
    pub moves: Vec<(GpuUuid, GpuUuid)>,
}

/// A complete placement.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// Every checkpoint-time GPU onto a distinct GPU here.
    pub map: DeviceMap,
    pub processes: Vec<Landing>,
    /// One line per GPU receiving state, for the logs.
    pub notes: Vec<String>,
}

impl Placement {
    /// Nothing moves.
    pub fn is_identity(&self) -> bool {
        self.map.pairs().iter().all(|(o, n)| o == n)
    }

    /// The pairs to hand the driver: none when nothing moves, so drivers without restore maps
    /// (before r580) work as well.
    pub fn driver_map(&self) -> DeviceMap {
        if self.is_identity() {
            DeviceMap::default()
        } else {
            self.map.clone()
        }
    }
}

/// Why the GPU state cannot be placed here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error(
        "the checkpoint saw {} GPU(s) ({}) and the driver needs a GPU here for each; this \
         machine has {} ({}): restore on a machine with at least {} GPUs",
        at_checkpoint.len(), list(at_checkpoint), here.len(), list(here), at_checkpoint.len()
    )]
    FewerGpus {
        at_checkpoint: Vec<Gpu>,
        here: Vec<Gpu>,
    },
    #[error(
        "the device map names {gpu} as a GPU of the checkpoint, which saw only {}: name those",
        list(at_checkpoint)
    )]
    NotAtCheckpoint {
        gpu: GpuUuid,
        at_checkpoint: Vec<Gpu>,
    },
    #[error(
        "the device map sends {old} to {new}, which is not a GPU of this machine ({}): name \
         one of these",
        list(here)
    )]
    NotHere {
        old: GpuUuid,
        new: GpuUuid,
        here: Vec<Gpu>,
    },
    #[error(
        "GPU {} ({}) has {} free, but the processes held {} on {old}: free memory there (see \
         nvidia-smi) or map {old} to another GPU with {old}=NEW",
        to.uuid, to.name, gib(to.memory_free), gib(*need)
    )]
    NoRoom { old: GpuUuid, to: Gpu, need: u64 },
    #[error(
        "the checkpoint's GPU(s) {} of model {model} need a GPU of that model each, and this \
         machine has {available} of them to spare (GPUs here: {}): name GPUs of another model \
         explicitly with OLD=NEW if their state should go there",
        uuids(olds),
        list(here)
    )]
    ModelMismatch {
        olds: Vec<GpuUuid>,
        model: String,
        available: usize,
        here: Vec<Gpu>,
    },
    #[error(
        "the GPUs here ({}) cannot take {} each on a GPU of its own of the same model with \
         enough free memory: free GPU memory, or give the whole device map explicitly",
        list(here), unplaced.join(", ")
    )]
    NoPlacement {
        unplaced: Vec<String>,
        here: Vec<Gpu>,
    },
    /// The search gave two GPUs of the checkpoint one GPU here: a defect of the search.
    #[error(
        "the placement found is not one GPU here for each of the checkpoint ({0}): give the \
         whole device map explicitly with OLD=NEW"
    )]
    NotOneToOne(crate::driver::ParseError),
}

use process_facts::units::in_gib as gib;

fn uuids(gpus: &[GpuUuid]) -> String {
    gpus.iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn list(gpus: &[Gpu]) -> String {
    gpus.iter()
        .map(|g| {
            format!(
                "{} {} ({}, {} free)",
                g.index,
                g.uuid,
                g.name,
                gib(g.memory_free)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Places the GPU state of a checkpoint taken on `at_checkpoint` (every GPU the driver saw)
/// onto `here`, the GPUs of this machine with their free memory now. `usage` is what each
/// process held where at checkpoint time (memory `None`: unknown, counted as nothing).
pub fn place(
    at_checkpoint: &[Gpu],
    usage: &[GpuUsage],
    here: &[Gpu],
    request: &Request,
) -> Result<Placement, PlacementError> {
    if here.len() < at_checkpoint.len() {
        return Err(PlacementError::FewerGpus {
            at_checkpoint: at_checkpoint.to_vec(),
            here: here.to_vec(),
        });
    }
    let need = demand(usage);
    let need_of = |u: GpuUuid| need.get(&u).copied().unwrap_or(0);
    let named = match request {
        Request::Auto => Vec::new(),
        Request::Same => at_checkpoint.iter().map(|g| (g.uuid, g.uuid)).collect(),
        Request::Pairs(m) => m.pairs().to_vec(),
    };
    check_named(at_checkpoint, here, &named, &need_of)?;
    let mut free: Vec<&Gpu> = here
        .iter()
        .filter(|g| !named.iter().any(|(_, n)| *n == g.uuid))
        .collect();
    let mut open: Vec<&Gpu> = at_checkpoint
        .iter()
        .filter(|g| !named.iter().any(|(o, _)| *o == g.uuid))
        .collect();
    // The biggest first: they have the fewest choices.
    open.sort_by_key(|g| (std::cmp::Reverse(need_of(g.uuid)), g.index));
    check_models(&open, &free, here, &need_of)?;
    let mut chosen = Vec::new();
    let stayers: Vec<GpuUuid> = open.iter().map(|g| g.uuid).collect();
    if !assign(&open, &mut free, &stayers, &need_of, &mut chosen) {
        return Err(PlacementError::NoPlacement {
            unplaced: open
                .iter()
                .map(|g| format!("{} ({}, {})", g.uuid, g.name, gib(need_of(g.uuid))))
                .collect(),
            here: here.to_vec(),
        });
    }
    let mut pairs: Vec<(GpuUuid, GpuUuid)> = named;
    pairs.extend(open.iter().zip(&chosen).map(|(o, n)| (o.uuid, *n)));
    let order = |u: &GpuUuid| at_checkpoint.iter().position(|g| g.uuid == *u);
    pairs.sort_by_key(|(o, _)| order(o));
    let map = DeviceMap::new(pairs).map_err(PlacementError::NotOneToOne)?;
    Ok(Placement {
        processes: landings(usage, &map),
        notes: notes(&map, here, &need_of, usage),
        map,
    })
}

/// The pairs the operator named: each old GPU was there at checkpoint, each new one is here
/// with room for what the old one held.
fn check_named(
    at_checkpoint: &[Gpu],
    here: &[Gpu],
    named: &[(GpuUuid, GpuUuid)],
    need_of: &dyn Fn(GpuUuid) -> u64,
) -> Result<(), PlacementError> {
    for &(old, new) in named {
        if !at_checkpoint.iter().any(|g| g.uuid == old) {
            return Err(PlacementError::NotAtCheckpoint {
                gpu: old,
                at_checkpoint: at_checkpoint.to_vec(),
            });
        }
        let to = here
            .iter()
            .find(|g| g.uuid == new)
            .ok_or_else(|| PlacementError::NotHere {
                old,
                new,
                here: here.to_vec(),
            })?;
        if need_of(old) > to.memory_free {
            return Err(PlacementError::NoRoom {
                old,
                to: to.clone(),
                need: need_of(old),
            });
        }
    }
    Ok(())
}

/// The GPUs left to place: enough free GPUs of each model, and one with room for each.
fn check_models(
    open: &[&Gpu],
    free: &[&Gpu],
    here: &[Gpu],
    need_of: &dyn Fn(GpuUuid) -> u64,
) -> Result<(), PlacementError> {
    for old in open {
        let model: Vec<&&Gpu> = free.iter().filter(|g| g.name == old.name).collect();
        let olds: Vec<GpuUuid> = open
            .iter()
            .filter(|g| g.name == old.name)
            .map(|g| g.uuid)
            .collect();
        if model.len() < olds.len() {
            return Err(PlacementError::ModelMismatch {
                olds,
                model: old.name.clone(),
                available: model.len(),
                here: here.to_vec(),
            });
        }
        if let Some(best) = model.iter().max_by_key(|g| g.memory_free) {
            if best.memory_free < need_of(old.uuid) {
                return Err(PlacementError::NoRoom {
                    old: old.uuid,
                    to: (**best).clone(),
                    need: need_of(old.uuid),
                });
            }
        }
    }
    Ok(())
}

/// Memory held per checkpoint GPU, over all processes.
fn demand(usage: &[GpuUsage]) -> BTreeMap<GpuUuid, u64> {
    let mut need = BTreeMap::new();
    for u in usage {
        *need.entry(u.gpu).or_default() += u.memory.unwrap_or(0);
    }
    need
}

/// Gives each GPU of `open` a distinct GPU of `free` (same model, room enough), in preference
/// order, backtracking when a choice leaves a later GPU without a place. `stayers` are the
/// GPUs that would rather stay where they are. At most 8! tries.
fn assign(
    open: &[&Gpu],
    free: &mut Vec<&Gpu>,
    stayers: &[GpuUuid],
    need_of: &dyn Fn(GpuUuid) -> u64,
    chosen: &mut Vec<GpuUuid>,
) -> bool {
    let Some((old, rest)) = open.split_first() else {
        return true;
    };
    let wanted_by_other = |u: GpuUuid| u != old.uuid && stayers.contains(&u);
    let mut candidates: Vec<&Gpu> = free
        .iter()
        .copied()
        .filter(|g| g.name == old.name && g.memory_free >= need_of(old.uuid))
        .collect();
    candidates.sort_by_key(|g| {
        (
            g.uuid != old.uuid,
            wanted_by_other(g.uuid),
            g.index != old.index,
            std::cmp::Reverse(g.memory_free),
            g.index,
        )
    });
    for g in candidates {
        free.retain(|f| f.uuid != g.uuid);
        chosen.push(g.uuid);
        if assign(rest, free, stayers, need_of, chosen) {
            return true;
        }
        chosen.pop();
        free.push(g);
    }
    false
}

fn landings(usage: &[GpuUsage], map: &DeviceMap) -> Vec<Landing> {
    let mut by_pid: BTreeMap<i32, Vec<(GpuUuid, GpuUuid)>> = BTreeMap::new();
    for u in usage {
        let moves = by_pid.entry(u.pid).or_default();
        if !moves.iter().any(|(o, _)| *o == u.gpu) {
            moves.push((u.gpu, map.target(u.gpu)));
        }
    }
    by_pid
        .into_iter()
        .map(|(pid, moves)| Landing { pid, moves })
        .collect()
}

fn notes(
    map: &DeviceMap,
    here: &[Gpu],
    need_of: &dyn Fn(GpuUuid) -> u64,
    usage: &[GpuUsage],
) -> Vec<String> {
    let mut out: Vec<String> = map
        .pairs()
        .iter()
        .filter_map(|(old, new)| {
            let g = here.iter().find(|g| g.uuid == *new)?;
            let held = if usage.is_empty() {
                String::new()
            } else {
                format!("{} held there, ", gib(need_of(*old)))
            };
            Some(format!(
                "{old} -> {new} ({}): {held}{} free",
                g.name,
                gib(g.memory_free)
            ))
        })
        .collect();
    let unknown: Vec<String> = usage
        .iter()
        .filter(|u| u.memory.is_none())
        .map(|u| u.pid.to_string())
        .collect();
    if !unknown.is_empty() {
        out.push(format!(
            "GPU memory held by process(es) {} is not known; counted as none",
            unknown.join(", ")
        ));
    }
    out
}

impl fmt::Display for Landing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.moves.is_empty() {
            return write!(f, "process {}: its GPUs follow the map", self.pid);
        }
        write!(f, "process {}:", self.pid)?;
        for (old, new) in &self.moves {
            if old == new {
                write!(f, " stays on {new}")?;
            } else {
                write!(f, " {old} -> {new}")?;
            }
        }
        Ok(())
    }
}
