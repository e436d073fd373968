//! Typed tickets for the guardian's replies: each request returns a [`Ticket`] of the kind of
//! reply it waits for, and only a reply of that kind, to that request, is handed back for it.
//! A ticket of one kind cannot be used to take a reply of another (the compiler refuses), and a
//! reply of the wrong kind under a ticket's number (a confused guardian) is never filed.

use std::marker::PhantomData;

use criu_gpu_host::thp::Raised;
use cuda_checkpoint_ctl::inventory::Inventory;

use super::proto::{Answer, DriverFailure};

/// A request sent to the guardian, whose reply is of kind `T` ([`Kind`]).
pub struct Ticket<T> {
    seq: u64,
    kind: PhantomData<fn() -> T>,
}

impl<T> Ticket<T> {
    pub(super) fn new(seq: u64) -> Ticket<T> {
        Ticket {
            seq,
            kind: PhantomData,
        }
    }

    /// The request's sequence number (what the guardian answers to).
    pub fn seq(self) -> u64 {
        self.seq
    }
}

// By hand: derived impls would ask the same of `T`, which a ticket does not hold.
impl<T> Clone for Ticket<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Ticket<T> {}

impl<T> PartialEq for Ticket<T> {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}

impl<T> Eq for Ticket<T> {}

impl<T> std::fmt::Debug for Ticket<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ticket<{}>({})", std::any::type_name::<T>(), self.seq)
    }
}

/// A reply of the guardian to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A driver call's outcome.
    Answer(Result<Answer, DriverFailure>),
    Inventory(Result<Inventory, String>),
    Thp(Result<Raised, String>),
    Verified(Result<(), String>),
}

/// The image files a [`super::Guardian::verify`] named matched their digests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified;

/// A kind of reply: what a ticket of it gives back, and how it is told from the others.
pub trait Kind {
    /// What [`super::Guardian::take`] returns for a ticket of this kind.
    type Result;
    /// Whether `reply` is of this kind.
    fn is(reply: &Reply) -> bool;
    /// The reply's contents, if it is of this kind.
    fn open(reply: Reply) -> Option<Self::Result>;
}

macro_rules! kind {
    ($kind:ty, $variant:ident, $result:ty) => {
        impl Kind for $kind {
            type Result = $result;
            fn is(reply: &Reply) -> bool {
                matches!(reply, Reply::$variant(_))
            }
            fn open(reply: Reply) -> Option<$result> {
                match reply {
                    Reply::$variant(r) => Some(r),
                    _ => None,
                }
            }
        }
    };
}

kind!(Answer, Answer, Result<Answer, DriverFailure>);
kind!(Inventory, Inventory, Result<Inventory, String>);
kind!(Raised, Thp, Result<Raised, String>);
kind!(Verified, Verified, Result<(), String>);

/// One request's place: waiting for a reply of its ticket's kind, or the reply.
#[derive(Debug)]
pub(super) enum Slot {
    Waiting(fn(&Reply) -> bool),
    Came(Reply),
}

impl Slot {
    pub(super) fn waiting<T: Kind>() -> Slot {
        Slot::Waiting(T::is)
    }

    /// Whether this slot waits for `reply` (nothing came yet, and it is of the ticket's kind).
    pub(super) fn waits_for(&self, reply: &Reply) -> bool {
        matches!(self, Slot::Waiting(is) if is(reply))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};

    use super::*;
    use crate::guardian::proto::{self, Act, Report};
    use crate::guardian::Guardian;

    #[test]
    fn a_reply_is_taken_only_by_its_own_ticket_and_only_if_of_its_kind() {
        let (ours, theirs) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let mut g = Guardian::connect(ours, 1);
        let call = g.act(7, Act::Probe).unwrap();
        let nvml = g.ask_inventory().unwrap();
        assert_ne!(call.seq(), nvml.seq());
        // A confused guardian answers the driver call's request with an inventory, and the
        // inventory's with a driver answer: neither is filed.
        let wrong = [
            Report::Inventory {
                seq: call.seq(),
                inventory: Err("not asked".into()),
            },
            Report::Done {
                seq: nvml.seq(),
                pid: 7,
                result: Ok(Answer::Thread(8)),
            },
        ];
        for r in &wrong {
            assert!(proto::send(&theirs, r));
        }
        let soon = Instant::now() + Duration::from_millis(200);
        assert!(!g.wait_all(&[call], soon, &mut || {}).unwrap());
        assert!(!g.has(nvml));
        assert_eq!(g.take(call), None);
        // The right replies are.
        let right = Report::Done {
            seq: call.seq(),
            pid: 7,
            result: Ok(Answer::Thread(8)),
        };
        assert!(proto::send(&theirs, &right));
        let later = Instant::now() + Duration::from_secs(5);
        assert!(g.wait_all(&[call], later, &mut || {}).unwrap());
        assert_eq!(g.take(call), Some(Ok(Answer::Thread(8))));
        assert_eq!(g.take(call), None, "taken once");
    }
}
