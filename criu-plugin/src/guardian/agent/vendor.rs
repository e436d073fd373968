//! What one GPU vendor's dump changes and the guardian puts back if CRIU ends first, behind one
//! interface: the agent keeps a list of vendors ([`all`]) and asks each the same questions, so a
//! new vendor is a [`VendorUndo`] implementation and one line in [`all`].

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::cuda::CudaUndo;
use super::kfd::KfdUndo;
use super::Outbox;
use crate::guardian::machine::Machine;
use crate::guardian::proto::Order;

/// When the guardian puts back a vendor's change on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Moment {
    /// The plugin said goodbye in the middle of a dump without settling it; CRIU still runs.
    Bye,
    /// CRIU ended while the rollback the plugin asked for was under way.
    RollingBack,
    /// CRIU ended after a dump it called successful, and dumped processes live on (a failed
    /// post-dump script makes CRIU resume them).
    Committed,
    /// CRIU ended in the middle of a dump.
    Midway,
}

impl Moment {
    /// How the record says when CRIU ended ("CRIU (pid N) ended ...").
    pub(super) fn when(self) -> &'static str {
        match self {
            Moment::Bye => "without settling the processes it paused",
            Moment::RollingBack => "after the dump failed or the tasks were to keep running",
            Moment::Committed => {
                "after a dump CRIU called successful, the dumped processes were left running (a \
                 failed post-dump script makes CRIU resume them)"
            }
            Moment::Midway => "in the middle of a dump",
        }
    }
}

/// What the vendors' undos need of the agent: the machine, where messages go, and whose CRIU.
#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) machine: Arc<dyn Machine>,
    pub(super) out: Arc<Outbox>,
    pub(super) criu_pid: i32,
}

/// One vendor's change to the dumped processes, as the guardian holds it.
pub(super) trait VendorUndo: Send {
    /// Takes an order of this vendor's (and the files that came with it); hands back any other.
    fn take(&mut self, order: Order, files: Vec<OwnedFd>) -> Option<(Order, Vec<OwnedFd>)>;
    /// The processes it watches.
    fn pids(&self) -> Vec<i32>;
    /// Nothing it holds needs putting back.
    fn is_empty(&self) -> bool;
    /// A process it holds a change of is still alive.
    fn alive(&self) -> bool;
    /// The rollback the plugin asked for is seen through (or nothing is held).
    fn settled(&self) -> bool;
    /// Whether it puts something back alone at `moment`.
    fn undoes_at(&self, moment: Moment) -> bool;
    /// Puts back alone what it holds, and records what happened.
    fn undo(&mut self, moment: Moment);
}

/// Every vendor the guardian can undo a dump of, in the order it puts them back.
pub(super) fn all(ctx: &Ctx) -> Vec<Box<dyn VendorUndo>> {
    vec![
        Box::new(CudaUndo::new(ctx.clone())),
        Box::new(KfdUndo::new(ctx.clone())),
    ]
}
