//! `cuda-sim-app`: a GPU-like test application. It keeps pseudo-random data in device memory,
//! changes part of it every step with an asynchronous "kernel", reads all of it back and compares
//! it with the copy it expects, and logs one line per step:
//!
//! `step=N pid=P words=W fnv=HASH ok`
//!
//! A mismatch is logged as `MISMATCH ...` and exits 3; a CUDA error is logged and exits 2. So a
//! log that keeps growing with `ok` lines across a checkpoint proves the device data survived.

mod driver;
mod job;
mod sparse;
mod sys;

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;

#[derive(Parser, Clone)]
#[command(about = "GPU-like test application for checkpoint/restore tests")]
struct Args {
    /// Device memory to hold, in MiB.
    #[arg(long, default_value_t = 16)]
    mib: usize,
    /// Seed of the data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Log file (one line per step).
    #[arg(long)]
    log: String,
    /// Pause between steps.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Also launch a kernel that keeps the GPU busy this long each step (simulation only).
    #[arg(long, default_value_t = 0)]
    busy_ms: u32,
    /// Stop after this many steps (0: run until killed).
    #[arg(long, default_value_t = 0)]
    steps: u64,
    /// Device ordinal to use, among the GPUs the process sees (CUDA_VISIBLE_DEVICES): one it
    /// does not see fails, as on a GPU. Children and ranks use ordinal + their index, modulo the
    /// device count.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// This child's or rank's index added to --device (not an option).
    #[arg(skip)]
    spread: i32,
    /// Fork this many children that use the GPU too (logs LOG.gpuN).
    #[arg(long, default_value_t = 0)]
    children: u32,
    /// Fork this many children that never touch CUDA (logs LOG.plainN).
    #[arg(long, default_value_t = 0)]
    plain_children: u32,
    /// The driver library.
    #[arg(long, default_value = "libcuda.so.1")]
    lib: String,
    /// Do not use CUDA in this process (only in --children).
    #[arg(long)]
    plain: bool,
    /// Keep a connection to this unix socket open: a resource CRIU cannot dump, to make a dump
    /// fail after the GPU checkpoint (tests).
    #[arg(long)]
    hold_unix_socket: Option<String>,
    /// Run as a job of this many ranks (forked; logs LOG.rankN) talking over TCP and a shared
    /// unlinked file, as an NCCL job does (see job.rs).
    #[arg(long, default_value_t = 0)]
    ranks: usize,
    /// The job's store port (rank 0 listens on it).
    #[arg(long, default_value_t = 29500)]
    store_port: u16,
    /// The job spans this many nodes, each running `--ranks` of its ranks (one launch per node,
    /// as torchrun's --nnodes); the ranks meet through the store at --master.
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This node's rank (0 to NNODES-1).
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// HOST:PORT of the job's store, on node 0 (with --nnodes above 1).
    #[arg(long)]
    master: Option<String>,
    /// The job's shared file, in MiB.
    #[arg(long, default_value_t = 4)]
    shm_mib: usize,
    /// Each step of a job also launches a collective of all ranks that computes this long on
    /// the GPU before it waits for the others (0: none).
    #[arg(long, default_value_t = 0)]
    collective_ms: u32,
    /// Also write a line per step to this file, held open for the whole run as a training
    /// job's log is (opened as Python's open(path, "w") does; ranks: PATH.rankN).
    #[arg(long)]
    journal: Option<String>,
    /// A rank waits before each step while the file PATH.rankN exists (a slow host-side step:
    /// its peers' collectives wait for it meanwhile).
    #[arg(long)]
    hold: Option<String>,
    /// Also hold this many MiB of host memory of which every other page holds data (a
    /// fragmented heap, as a PyTorch process's), checked every step (see sparse.rs).
    #[arg(long, default_value_t = 0)]
    sparse_mib: usize,
    /// The ranks' parent also runs this many threads that only wait, as a PyTorch launcher's
    /// interpreter runs threads of its own (with --ranks).
    #[arg(long, default_value_t = 0)]
    parent_threads: usize,
}

fn log_line(path: &str, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

fn xorshift(state: &mut u64) -> u32 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state >> 16) as u32
}

fn fnv(words: &[u32]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
        (h ^ *w as u64).wrapping_mul(0x1000_0000_01b3)
    })
}

fn plain_loop(log: &str, interval: Duration) -> ! {
    let pid = std::process::id();
    for tick in 1.. {
        log_line(log, &format!("tick={tick} pid={pid} ok"));
        std::thread::sleep(interval);
    }
    unreachable!()
}

/// `--journal PATH`: the file of step checksums (a rank's: PATH.rankN), opened as Python's
/// open(path, "w") does.
fn open_journal(args: &Args, rank: Option<&job::Rank>) -> Result<Option<std::fs::File>> {
    match (&args.journal, rank) {
        (Some(j), Some(r)) => Some(format!("{j}.rank{}", r.rank)),
        (Some(j), None) => Some(j.clone()),
        (None, _) => None,
    }
    .map(|p| std::fs::File::create(&p).with_context(|| format!("creating {p}")))
    .transpose()
}

/// `--hold PATH`: a rank waits before its next step while PATH.rankN exists.
fn wait_while_held(args: &Args, rank: Option<&job::Rank>) {
    if let (Some(hold), Some(r)) = (&args.hold, rank) {
        let file = format!("{hold}.rank{}", r.rank);
        while std::path::Path::new(&file).exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The step's device data read back against what it must be, and the sparse heap's: a mismatch
/// is logged and ends the process (exit 3).
fn check_step(log: &str, step: u64, seen: &[u32], expect: &[u32], heap: &sparse::SparseHeap) {
    let pid = std::process::id();
    if let Some(i) = (0..seen.len()).find(|&i| seen[i] != expect[i]) {
        log_line(
            log,
            &format!(
                "MISMATCH step={step} pid={pid} word={i} expected={:#x} got={:#x}",
                expect[i], seen[i]
            ),
        );
        std::process::exit(3);
    }
    if let Some((i, got)) = heap.first_bad() {
        log_line(
            log,
            &format!("MISMATCH step={step} pid={pid} host word={i} got={got:#x}"),
        );
        std::process::exit(3);
    }
}

fn gpu_loop(args: &Args, mut rank: Option<job::Rank>) -> Result<()> {
    let _held = match &args.hold_unix_socket {
        Some(p) => Some(
            std::os::unix::net::UnixStream::connect(p)
                .with_context(|| format!("connecting {p}"))?,
        ),
        None => None,
    };
    let mut journal = open_journal(args, rank.as_ref())?;
    let cuda = driver::Cuda::load(&args.lib)?;
    cuda.init()?;
    let count = cuda.device_count()?;
    let ordinal = match args.spread {
        0 => args.device,
        n => (args.device + n).rem_euclid(count.max(1)),
    };
    cuda.use_device(ordinal)?;
    let words = args.mib * (1 << 20) / 4;
    let dptr = cuda.alloc(words * 4)?;
    let mut rng = args.seed.max(1);
    let mut expect: Vec<u32> = (0..words).map(|_| xorshift(&mut rng)).collect();
    cuda.htod(dptr, &expect)?;
    let mut seen = vec![0u32; words];
    let heap = sparse::SparseHeap::new(args.sparse_mib, rng);
    let region = words.clamp(1, 1 << 16);
    let regions = words.div_ceil(region);
    let pid = std::process::id();
    log_line(
        &args.log,
        &format!("start pid={pid} device={ordinal} words={words} dptr={dptr:#x}"),
    );
    let mut step = 0u64;
    loop {
        step += 1;
        wait_while_held(args, rank.as_ref());
        let r = (step as usize) % regions;
        let (lo, hi) = (r * region, ((r + 1) * region).min(words));
        let value = xorshift(&mut rng);
        cuda.memset_async(dptr + (lo * 4) as u64, value, hi - lo)?;
        expect[lo..hi].fill(value);
        if args.busy_ms > 0 {
            cuda.busy(args.busy_ms)?;
        }
        if let (Some(r), true) = (&rank, args.collective_ms > 0) {
            cuda.collective(r.group, step, r.total as u32, args.collective_ms)?;
        }
        cuda.synchronize()?;
        cuda.dtoh(&mut seen, dptr)?;
        if let Some(r) = &mut rank {
            if let Err(e) = r.step(step) {
                log_line(
                    &args.log,
                    &format!("ERROR job step={step} pid={pid}: {e:#}"),
                );
                std::process::exit(4);
            }
        }
        check_step(&args.log, step, &seen, &expect, &heap);
        log_line(
            &args.log,
            &format!(
                "step={step} pid={pid} words={words} fnv={:016x} ok",
                fnv(&seen)
            ),
        );
        if let Some(j) = &mut journal {
            writeln!(j, "step {step} fnv {:016x}", fnv(&seen)).context("journal")?;
        }
        if args.steps > 0 && step >= args.steps {
            log_line(&args.log, &format!("done pid={pid}"));
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(args.interval_ms));
    }
}

fn main() -> Result<()> {
    sys::close_inherited_fds();
    sys::reap_children_automatically();
    let args = Args::parse();
    let interval = Duration::from_millis(args.interval_ms);
    for i in 0..args.plain_children {
        if sys::fork()? {
            plain_loop(&format!("{}.plain{i}", args.log), interval);
        }
    }
    let mut me = args.clone();
    let mut rank = None;
    if args.ranks > 0 {
        // The parent maps the driver without a context, as torch.multiprocessing's does after
        // torch.cuda.device_count(): not a CUDA process to the driver, nor a rank.
        let _driver = driver::Cuda::load(&args.lib)?;
        let mut plan = job::Plan::new(args.ranks, args.store_port, args.shm_mib)?;
        if let (true, Some(master)) = (args.nnodes > 1, &args.master) {
            plan = plan.across(job::Nodes {
                nnodes: args.nnodes,
                node_rank: args.node_rank,
                master: master.clone(),
            });
        }
        let mut mine = None;
        for r in 0..args.ranks {
            if sys::fork()? {
                mine = Some(r);
                break;
            }
        }
        let Some(r) = mine else {
            // The parent waits, as torch.multiprocessing's does.
            for _ in 0..args.parent_threads {
                std::thread::spawn(|| loop {
                    std::thread::sleep(Duration::from_secs(3600));
                });
            }
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        };
        me.log = format!("{}.rank{r}", args.log);
        me.seed = args.seed.wrapping_add(r as u64 + 1);
        me.spread = r as i32;
        rank = Some(plan.join(r).context("joining the job")?);
    }
    for i in 0..args.children {
        if sys::fork()? {
            me.log = format!("{}.gpu{i}", args.log);
            me.seed = args.seed.wrapping_add(i as u64 + 1);
            me.spread = i as i32 + 1;
            me.children = 0;
            me.plain = false;
            break;
        }
    }
    if me.plain {
        plain_loop(&me.log, interval);
    }
    if let Err(e) = gpu_loop(&me, rank).context("GPU loop") {
        log_line(&me.log, &format!("ERROR pid={} {e:#}", std::process::id()));
        std::process::exit(2);
    }
    Ok(())
}
