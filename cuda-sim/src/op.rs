//! The actions a controller asks of a target's helper thread (the driver's restore thread).

/// Requested actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    Lock = 1,
    Checkpoint = 2,
    Restore = 3,
    Unlock = 4,
    /// GetState: the driver's helper thread answers it too (F11).
    State = 5,
}

impl Op {
    pub fn from_raw(v: u32) -> Option<Op> {
        Some(match v {
            1 => Op::Lock,
            2 => Op::Checkpoint,
            3 => Op::Restore,
            4 => Op::Unlock,
            5 => Op::State,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Lock => "lock",
            Op::Checkpoint => "checkpoint",
            Op::Restore => "restore",
            Op::Unlock => "unlock",
            Op::State => "state",
        }
    }
}
