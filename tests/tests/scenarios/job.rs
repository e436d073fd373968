//! Distributed jobs with `criu-gpu`: dumped and restored, going on; CRIU SIGKILLed once the
//! ranks are locked; a rank that dies while the dump locks and NCCL's own transports refused
//! before anything is frozen (two GPUs: NCCL takes one rank per GPU). On the simulation a
//! `cuda-sim-app --ranks` job, on a GPU the PyTorch DDP job (scripts/gpu/ddp-job.py).

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpu_ckpt_tests::criu::{log, tail, wait_guardians_gone, Criu};
use gpu_ckpt_tests::job::{criu_gpu, text, Job};
use gpu_ckpt_tests::scenario::Host;
use gpu_ckpt_tests::scenario_job::Transports;
use gpu_ckpt_tests::{artifact, finish_within, pid_alive, signal, wait_until, Machine};
use nix::sys::signal::Signal;

/// `criu-gpu dump ROOT IMAGES` in the background with `env` added, its output in `IMAGES.out`.
fn spawn_dump(host: &Host, c: &Criu, job: &Job, images: &Path, env: &[(&str, &str)]) -> Child {
    let out = fs::File::create(images.with_extension("out")).unwrap();
    Command::new(artifact("criu-gpu"))
        .args(["dump", &job.root.to_string(), images.to_str().unwrap()])
        .args(["--criu", c.bin.to_str().unwrap(), "--", "--lib"])
        .arg(&c.plugins)
        .envs(host.env())
        .env_remove("LD_LIBRARY_PATH")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start criu-gpu")
}

/// Waits until the plugin has locked the ranks (its line in CRIU's log: criu-gpu's progress
/// relays it later, by as much as a loaded machine delays it).
fn wait_locked(images: &Path) {
    let log = images.join("dump.log");
    let locked = || fs::read_to_string(&log).is_ok_and(|t| t.contains("criu_gpu: locked"));
    assert!(
        wait_until(Duration::from_secs(120), locked),
        "no lock: {}",
        fs::read_to_string(images.with_extension("out")).unwrap_or_default()
    );
}

/// The CRIU that criu-gpu `parent` runs.
fn criu_of(parent: i32) -> i32 {
    process_facts::process::tree(parent)
        .into_iter()
        .find(|p| {
            fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| matches!(c.trim(), "criu" | "criu.real"))
        })
        .expect("criu under criu-gpu")
}

/// The pid rank `r` logged.
fn rank_pid(job: &Job, r: usize) -> i32 {
    job.ranks[r]
        .lines()
        .iter()
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("pid="))
                .and_then(|p| p.parse().ok())
        })
        .expect("a pid in the rank's log")
}

#[test]
fn a_job_is_dumped_and_restored_and_goes_on() {
    let mut host = Host::start();
    let c = Criu::new(&host);
    let n = host.job_ranks();
    let job = host.job(n, Transports::Sockets);
    let images = host.path("img");
    let out = job.dump(&host, &c, &images, &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!("GPU: checkpointed {n} CUDA process(es)")),
        "{t}"
    );
    job.gone();
    let out = criu_gpu(&host, &c, &["restore", images.to_str().unwrap()], &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!("restored CUDA state of {n} of {n}")),
        "{t}"
    );
    job.advances(5);
}

#[test]
fn criu_killed_once_the_ranks_are_locked_leaves_every_rank_running() {
    let mut host = Host::start();
    let c = Criu::new(&host);
    let n = host.job_ranks();
    let job = host.job(n, Transports::Sockets);
    let images = host.path("img");
    let dump = spawn_dump(&host, &c, &job, &images, &[]);
    wait_locked(&images);
    signal(criu_of(dump.id() as i32), Signal::SIGKILL);
    let out = finish_within(dump, Duration::from_secs(60)).expect("criu-gpu ends");
    assert!(!out.status.success(), "criu was killed");
    let guardian = || fs::read_to_string(images.join("gpu-guardian.log")).unwrap_or_default();
    let settled = || {
        guardian()
            .matches("returned to its state before the dump")
            .count()
            == n
    };
    assert!(
        wait_until(Duration::from_secs(60), settled),
        "{}",
        guardian()
    );
    job.advances(3);
}

/// Two ranks: with one, the rank that dies is the whole job (on the simulation CRIU then
/// dumped the tree without it, once in five runs).
#[test]
fn two_gpus_a_rank_that_dies_while_the_dump_locks_leaves_nothing_locked() {
    let mut host = Host::with_gpus(2);
    let c = Criu::new(&host);
    let n = 2;
    let job = host.job(n, Transports::Sockets);
    let images = host.path("img");
    // The rank dies while the ranks are checkpointed: on the simulation its checkpoint does not
    // end before it dies (a fixed delay lost the race on a loaded machine: the dump was over
    // before the signal landed); a GPU's takes its own time.
    let hang = format!("checkpoint/{}=hang", rank_pid(&job, n - 1));
    let env = match host.is_sim() {
        true => vec![("CUDA_SIM_FAULT", hang.as_str())],
        false => vec![],
    };
    let dump = spawn_dump(&host, &c, &job, &images, &env);
    wait_locked(&images);
    signal(rank_pid(&job, n - 1), Signal::SIGKILL);
    let out = finish_within(dump, Duration::from_secs(120)).expect("criu-gpu ends");
    assert!(
        !out.status.success(),
        "the dump fails: {}\nits dump.log ends:\n{}",
        fs::read_to_string(images.with_extension("out")).unwrap_or_default(),
        tail(&log(&images, "dump.log"), 60)
    );
    wait_guardians_gone(&host);
    // The other ranks may end once a peer is gone (torch.multiprocessing ends them): what
    // matters is that no process is left locked or checkpointed.
    for pid in job.pids.iter().copied().filter(|p| pid_alive(*p)) {
        let state = host.state(pid);
        assert!(
            state != "locked" && state != "checkpointed" && state != "no answer",
            "process {pid} left {state}"
        );
    }
}

#[test]
fn two_gpus_nccl_transports_that_cannot_be_restored_are_refused_before_anything_is_frozen() {
    let mut host = Host::with_gpus(2);
    let c = Criu::new(&host);
    let job = host.job(2, Transports::Defaults);
    let images = host.path("img");
    let out = job.dump(&host, &c, &images, &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("P2P, SHM and cuMem") && t.contains("NCCL_P2P_DISABLE=1"),
        "{t}"
    );
    assert!(!t.contains("GPU: locked"), "nothing was locked: {t}");
    job.advances(3);
}
