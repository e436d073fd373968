//! What a dump of a job across machines says between the plugin (in CRIU) and this node's
//! `criu-gpu`, which shares it with the other nodes through etcd: one line of JSON each way per
//! lock round, over the unix socket named by `CRIU_GPU_CLUSTER`. The plugin never talks to etcd:
//! it reports each round's local outcome and does what its `criu-gpu` answers, the same answer
//! on every node.

use std::time::Duration;

use cuda_checkpoint_ctl::ops::rounds::{Next, Outcome};
use serde::{Deserialize, Serialize};

/// The setting naming the socket (in criu's environment, set by `criu-gpu dump --nnodes`).
pub const SETTING: &str = "CRIU_GPU_CLUSTER";

/// The plugin's report: before the first round (`outcome` empty: ready to lock) and after each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The rounds done so far on this node.
    pub round: u32,
    /// What is left of CRIU's seize time for locking, in ms.
    pub left_ms: u64,
    pub outcome: Option<Counted>,
}

/// A round's outcome on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counted {
    pub limit_ms: u64,
    pub locked: usize,
    pub of: usize,
    pub failed: bool,
}

impl From<&Outcome> for Counted {
    fn from(o: &Outcome) -> Counted {
        Counted {
            limit_ms: o.limit.as_millis() as u64,
            locked: o.locked,
            of: o.of,
            failed: o.failed,
        }
    }
}

impl From<&Counted> for Outcome {
    fn from(c: &Counted) -> Outcome {
        Outcome {
            limit: Duration::from_millis(c.limit_ms),
            locked: c.locked,
            of: c.of,
            failed: c.failed,
        }
    }
}

/// `criu-gpu`'s answer: the next step, decided alike on every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "next", rename_all = "snake_case")]
pub enum Answer {
    Lock { pause_ms: u64, limit_ms: u64 },
    Done,
    Stop { why: String },
}

impl From<Answer> for Next {
    fn from(a: Answer) -> Next {
        match a {
            Answer::Lock { pause_ms, limit_ms } => Next::Lock {
                pause: Duration::from_millis(pause_ms),
                limit: Duration::from_millis(limit_ms),
            },
            Answer::Done => Next::Done,
            Answer::Stop { why } => Next::Stop(why),
        }
    }
}

impl From<&Next> for Answer {
    fn from(n: &Next) -> Answer {
        match n {
            Next::Lock { pause, limit } => Answer::Lock {
                pause_ms: pause.as_millis() as u64,
                limit_ms: limit.as_millis() as u64,
            },
            Next::Done => Answer::Done,
            Next::Stop(why) => Answer::Stop { why: why.clone() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_reports_read_back_as_written() {
        for a in [
            Answer::Lock {
                pause_ms: 3,
                limit_ms: 250,
            },
            Answer::Done,
            Answer::Stop {
                why: "node 1 left".into(),
            },
        ] {
            let line = serde_json::to_string(&a).unwrap();
            assert_eq!(serde_json::from_str::<Answer>(&line).unwrap(), a);
            assert_eq!(Answer::from(&Next::from(a.clone())), a);
        }
        let r = Report {
            round: 2,
            left_ms: 900,
            outcome: Some(Counted {
                limit_ms: 250,
                locked: 1,
                of: 2,
                failed: false,
            }),
        };
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&line).unwrap(), r);
    }
}
