//! Fault injection for failure tests: `CUDA_SIM_FAULT=OP[/PID]=SPEC[,...]` in the environment of
//! a controller (the tool or CRIU that calls the checkpoint API), never of the application.
//!
//! OP is lock, checkpoint, restore or unlock; PID (optional) is the target as the controller
//! names it, so one process of a group can fail. An entry with a PID wins over one without.
//! SPEC is one of:
//!
//! | SPEC | effect |
//! |---|---|
//! | `ERROR` | answer ERROR (a name such as `OUT_OF_MEMORY`, or a number) before changing anything; a checkpoint so failed leaves the process uncheckpointable (F19) |
//! | `ERROR@after` | do the action (the state changes), then answer ERROR |
//! | `failed` | the GPU state is lost: state `failed`, device data discarded, `CUDA_ERROR_UNKNOWN`; later actions answer `CUDA_ERROR_ILLEGAL_STATE`, CUDA calls of the process block |
//! | `hang` | the helper thread takes the request and never finishes it (a hung GPU); only the process's death ends the call |
//! | `delay:MS` | the action takes MS milliseconds longer (it changes the state at its end) |
//! | `stop` | after a successful lock the process stops itself with SIGSTOP (a Ctrl-Z between a lock and CRIU's seize) |

use crate::errors;
use crate::op::Op;

pub const FAULT_ENV: &str = "CUDA_SIM_FAULT";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    #[default]
    None,
    Error(u32),
    ErrorAfter(u32),
    Failed,
    Hang,
    Delay(u32),
    Stop,
}

impl Fault {
    /// Two words for the control page.
    pub fn encode(self) -> (u32, u32) {
        match self {
            Fault::None => (0, 0),
            Fault::Error(c) => (1, c),
            Fault::ErrorAfter(c) => (2, c),
            Fault::Failed => (3, 0),
            Fault::Hang => (4, 0),
            Fault::Delay(ms) => (5, ms),
            Fault::Stop => (6, 0),
        }
    }

    pub fn decode(kind: u32, arg: u32) -> Fault {
        match kind {
            1 => Fault::Error(arg),
            2 => Fault::ErrorAfter(arg),
            3 => Fault::Failed,
            4 => Fault::Hang,
            5 => Fault::Delay(arg),
            6 => Fault::Stop,
            _ => Fault::None,
        }
    }

    fn parse(spec: &str) -> Option<Fault> {
        let s = spec.trim();
        Some(match s {
            "failed" => Fault::Failed,
            "hang" => Fault::Hang,
            "stop" => Fault::Stop,
            _ => {
                if let Some(ms) = s.strip_prefix("delay:") {
                    Fault::Delay(ms.trim().parse().ok()?)
                } else if let Some(err) = s.strip_suffix("@after") {
                    Fault::ErrorAfter(nonzero(errors::parse(err)?)?)
                } else {
                    Fault::Error(nonzero(errors::parse(s)?)?)
                }
            }
        })
    }
}

fn nonzero(code: u32) -> Option<u32> {
    (code != 0).then_some(code)
}

/// The fault `spec` asks for on `op` against the process the controller names `pid` (or
/// `tgid`, the process that thread belongs to).
pub fn lookup(spec: &str, op: Op, pid: i32, tgid: i32) -> Result<Fault, String> {
    let mut general = Fault::None;
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = || format!("{FAULT_ENV}: bad entry {entry:?} (expected OP[/PID]=SPEC)");
        let (key, value) = entry.split_once('=').ok_or_else(bad)?;
        let (name, target) = match key.split_once('/') {
            Some((n, p)) => (n.trim(), Some(p.trim().parse::<i32>().map_err(|_| bad())?)),
            None => (key.trim(), None),
        };
        if !["lock", "checkpoint", "restore", "unlock"].contains(&name) {
            return Err(bad());
        }
        let fault = Fault::parse(value).ok_or_else(bad)?;
        if name != op.name() {
            continue;
        }
        match target {
            Some(p) if p == pid || p == tgid => return Ok(fault),
            Some(_) => {}
            None => general = fault,
        }
    }
    Ok(general)
}

/// The fault this controller's environment asks for.
pub fn injected(op: Op, pid: i32, tgid: i32) -> Result<Fault, String> {
    match crate::config::var(FAULT_ENV) {
        Some(spec) => lookup(&spec, op, pid, tgid),
        None => Ok(Fault::None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::code;

    #[test]
    fn every_spec_parses_and_survives_the_control_page() {
        let all = [
            ("OUT_OF_MEMORY", Fault::Error(code::OUT_OF_MEMORY)),
            ("999", Fault::Error(999)),
            (
                "ILLEGAL_STATE@after",
                Fault::ErrorAfter(code::ILLEGAL_STATE),
            ),
            ("failed", Fault::Failed),
            ("hang", Fault::Hang),
            ("delay:1500", Fault::Delay(1500)),
            ("stop", Fault::Stop),
        ];
        for (text, fault) in all {
            assert_eq!(lookup(&format!("lock={text}"), Op::Lock, 1, 1), Ok(fault));
            let (k, a) = fault.encode();
            assert_eq!(Fault::decode(k, a), fault);
        }
    }

    #[test]
    fn a_pid_entry_wins_and_others_are_untouched() {
        let spec = "checkpoint=delay:10, checkpoint/42=failed ,restore=OUT_OF_MEMORY";
        assert_eq!(lookup(spec, Op::Checkpoint, 42, 42), Ok(Fault::Failed));
        assert_eq!(
            lookup(spec, Op::Checkpoint, 43, 42),
            Ok(Fault::Failed),
            "by tgid"
        );
        assert_eq!(lookup(spec, Op::Checkpoint, 7, 7), Ok(Fault::Delay(10)));
        assert_eq!(lookup(spec, Op::Unlock, 42, 42), Ok(Fault::None));
        assert_eq!(
            lookup("lock/9=hang", Op::Lock, 8, 8),
            Ok(Fault::None),
            "another process"
        );
    }

    #[test]
    fn bad_entries_are_named() {
        for bad in [
            "lock",
            "lokc=hang",
            "lock/x=hang",
            "lock=NOPE",
            "lock=delay:",
            "lock=0",
        ] {
            let e = lookup(bad, Op::Lock, 1, 1).unwrap_err();
            assert!(e.contains(FAULT_ENV), "{bad}: {e}");
        }
    }
}
