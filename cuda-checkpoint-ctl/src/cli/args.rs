//! The command line.

use std::path::PathBuf;

use clap::{ArgGroup, Parser, ValueEnum};
use cuda_checkpoint_ctl::ops::rounds::Rounds;

use cuda_checkpoint_ctl::driver::Call;

const AFTER_HELP: &str = "\
Compatible with NVIDIA's cuda-checkpoint: with --pid, the operations print the same words and
exit with the same status (0, or the CUDA error code modulo 256). --tree, --cgroup and --all act
on every CUDA process found there, concurrently; a --suspend or --toggle that fails for one of
them puts the others back (unless --no-rollback).

Every command is bounded (NVIDIA's tool can wait for ever). The driver needs a process's CUDA
driver thread to run and waits for it without limit, so a process that is stopped (SIGSTOP,
Ctrl-Z), held in a ptrace stop by a debugger, or in a frozen cgroup is refused before the driver
is called, with the way to free it; with --pid the exit status is then CUDA_ERROR_NOT_READY (600,
status 88: nothing was done). A driver call that does not return within --wait seconds (default
600; 2 per process for --list), or whose process stays held for 2 s meanwhile, is given up on:
with --pid the status is CUDA_ERROR_TIMEOUT (909, status 141), and an action given up on may
still take effect; cuda-checkpoint-ctl --recover --pid P then brings the process back to running.

--device-map takes OLD=NEW pairs of GPU UUIDs, partial or complete, or 'auto': the driver needs
every GPU it saw at checkpoint placed on a GPU of its own, so the map is completed with this
machine's GPUs (unnamed GPUs stay where they are, or take a free GPU of the same model).

Environment: CUDA_CKPT_LIBCUDA and CUDA_CKPT_LIBNVML name the driver and NVML libraries
(defaults libcuda.so.1 and libnvidia-ml.so.1); CUDA_CKPT_LOG sets the log filter.";

/// Seconds any one driver call may take (--wait). Long enough for the largest legitimate action
/// (a checkpoint of a full 141 GB H200 at the slowest rate measured, 0.56 GB/s: about 250 s; the
/// plugin allows 60 s + 2 s per GiB), so that no script sees a working checkpoint cut short,
/// yet a hung GPU does not block its caller for ever. A held process is refused at once and one
/// held during a call is given up on after 2 s, so the common hangs end long before this.
pub const DEFAULT_WAIT_S: u64 = 600;
/// Seconds a listing waits for each process's state.
pub const LIST_WAIT_S: u64 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "cuda-checkpoint-ctl",
    version,
    about = "CUDA checkpoint and restore utility (cuda-checkpoint compatible)",
    after_help = AFTER_HELP
)]
#[command(group(
    ArgGroup::new("operation")
        .required(true)
        .args(["get_state", "action", "toggle", "get_restore_tid", "suspend", "resume", "recover", "list", "gpus"])
))]
#[command(group(ArgGroup::new("target").args(["pid", "tree", "cgroup", "all"])))]
pub struct Args {
    /// Print the checkpoint state (running, locked, checkpointed, failed).
    #[arg(long)]
    pub get_state: bool,
    /// Perform one driver action.
    #[arg(long, value_enum, value_name = "ACTION")]
    pub action: Option<ActionArg>,
    /// Toggle between running and checkpointed.
    #[arg(long)]
    pub toggle: bool,
    /// Print the CUDA restore thread id.
    #[arg(long)]
    pub get_restore_tid: bool,
    /// Lock and checkpoint (running -> checkpointed); undone if the checkpoint fails.
    #[arg(long)]
    pub suspend: bool,
    /// Restore and unlock (checkpointed -> running).
    #[arg(long)]
    pub resume: bool,
    /// Bring locked or checkpointed processes back to running (e.g. after CRIU was killed),
    /// after waiting for an action still in progress.
    #[arg(long)]
    pub recover: bool,
    /// List CUDA processes with state and GPU memory (all processes unless a target is given).
    #[arg(long)]
    pub list: bool,
    /// Show the GPUs of this machine (NVML).
    #[arg(long)]
    pub gpus: bool,

    /// The process to act on.
    #[arg(short, long)]
    pub pid: Option<i32>,
    /// A process and all its descendants.
    #[arg(long, value_name = "PID")]
    pub tree: Option<i32>,
    /// Every process of a cgroup (absolute, or relative to /sys/fs/cgroup).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Every CUDA process on the machine.
    #[arg(long)]
    pub all: bool,

    /// Lock timeout in milliseconds: how long locking may take (a group locked in rounds: all
    /// the rounds; default 30 s then).
    #[arg(short, long, value_name = "MS")]
    pub timeout: Option<u64>,
    /// A group is locked in rounds until one round locks every process at once: auto (NCCL
    /// ranks, which wait for each other on the GPU), on (any group), off (one lock each); on and
    /// off as any switch is written (1 or 0, yes or no, true or false, in any case).
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    pub lock_rounds: Rounds,
    /// Restore onto other GPUs: OLD_UUID=NEW_UUID[,...] (completed with this machine's GPUs),
    /// or 'auto'.
    #[arg(short, long, value_name = "MAP")]
    pub device_map: Option<String>,
    /// The longest one driver call may take, in seconds; an action given up on may still take
    /// effect (then --recover) [default: 600; 2 per process for listings].
    #[arg(long, value_name = "SECONDS")]
    pub wait: Option<u64>,
    /// Print JSON (errors too, on stdout).
    #[arg(long)]
    pub json: bool,
    /// Do not put other processes back when one of a group fails to suspend.
    #[arg(long)]
    pub no_rollback: bool,
    /// Suspend NCCL ranks of this node even if their transports (P2P, SHM, cuMem) cannot be
    /// restored by the driver (for processes that do not talk to each other through NCCL).
    #[arg(long)]
    pub no_nccl_check: bool,
    /// The driver library (default: $CUDA_CKPT_LIBCUDA or libcuda.so.1).
    #[arg(long, value_name = "PATH")]
    pub driver: Option<String>,
    /// The NVML library (default: $CUDA_CKPT_LIBNVML or libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml: Option<String>,
    /// More log output (repeat for more).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ActionArg {
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

impl ActionArg {
    pub fn call(self) -> Call {
        match self {
            ActionArg::Lock => Call::Lock,
            ActionArg::Checkpoint => Call::Checkpoint,
            ActionArg::Restore => Call::Restore,
            ActionArg::Unlock => Call::Unlock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("cuda-checkpoint-ctl").chain(args.iter().copied()))
    }

    #[test]
    fn accepts_the_cuda_checkpoint_command_line() {
        let a = parse(&["--toggle", "--pid", "42"]).unwrap();
        assert!(a.toggle && a.pid == Some(42));
        let a = parse(&["--action", "lock", "-p", "42", "-t", "500"]).unwrap();
        assert!(matches!(a.action, Some(ActionArg::Lock)) && a.timeout == Some(500));
        let a = parse(&["--action", "restore", "--pid", "1", "-d", "GPU-a=GPU-b"]).unwrap();
        assert_eq!(a.device_map.as_deref(), Some("GPU-a=GPU-b"));
        assert!(
            parse(&["--get-restore-tid", "--pid", "7"])
                .unwrap()
                .get_restore_tid
        );
        assert!(parse(&["--get-state", "--pid", "7"]).unwrap().get_state);
        let a = parse(&["--recover", "--all", "--wait", "30"]).unwrap();
        assert_eq!(a.wait, Some(30));
    }

    #[test]
    fn refuses_two_operations_or_two_targets() {
        assert!(parse(&["--toggle", "--get-state", "--pid", "1"]).is_err());
        assert!(parse(&["--toggle", "--pid", "1", "--tree", "1"]).is_err());
        assert!(parse(&["--pid", "1"]).is_err());
        assert!(parse(&["--action", "explode", "--pid", "1"]).is_err());
    }

    /// `--lock-rounds` takes what `CRIU_GPU_LOCK_ROUNDS` takes: auto, or any switch's words.
    #[test]
    fn lock_rounds_takes_auto_and_the_words_of_every_switch() {
        let rounds = |w| parse(&["--suspend", "--tree", "1", "--lock-rounds", w]);
        for (words, want) in [
            (&["auto", "AUTO"][..], Rounds::Auto),
            (&["on", "1", "yes", "TRUE"][..], Rounds::On),
            (&["off", "0", "no", "False", "OFF"][..], Rounds::Off),
        ] {
            for w in words {
                assert_eq!(rounds(w).unwrap().lock_rounds, want, "{w}");
            }
        }
        assert_eq!(
            parse(&["--suspend", "--tree", "1"]).unwrap().lock_rounds,
            Rounds::Auto
        );
        let e = rounds("sometimes").unwrap_err().to_string();
        assert!(e.contains("auto, or 1 or 0"), "{e}");
    }
}
