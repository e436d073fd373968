//! `amd-kfd-sim-app`: a ROCm-like test application on the simulated KFD. It opens its KFD file,
//! allocates a VRAM buffer per GPU (and a GTT buffer and a doorbell page), maps them as ROCm maps
//! VRAM, fills them with pseudo-random data, and then every step runs a "kernel" that rewrites
//! part of a buffer, checks all buffer memory against what it must be, and logs
//! `step=N pid=P ok`. Its GPU work waits while KFD has its queues paused (a dump) or a restore
//! awaits RESUME. A mismatch logs `MISMATCH` and exits 3.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

use amd_kfd::device::sim::{SimBo, SimGpu, SimKfd, SimProcess};
use amd_kfd::topology::Topology;
use amd_kfd::uapi::alloc;
use anyhow::{Context, Result};
use clap::Parser;

#[derive(Parser)]
#[command(about = "ROCm-like test application on the simulated KFD")]
struct Args {
    /// The simulated KFD's root.
    #[arg(long, env = "AMD_KFD_SIM_ROOT")]
    root: std::path::PathBuf,
    #[arg(long)]
    log: String,
    /// VRAM per GPU, in MiB.
    #[arg(long, default_value_t = 4)]
    mib: u64,
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
}

mod mapping {
    //! Shared mappings of the simulated buffers: the only `unsafe` of this program.
    use std::fs::File;

    pub struct Mapping {
        ptr: *mut u8,
        len: usize,
    }

    impl Mapping {
        pub fn new(file: &File, len: usize) -> std::io::Result<Mapping> {
            // SAFETY: a fresh shared mapping of a file we just sized; nothing aliases it but
            // the file itself, which only this process and the (simulated) kernel touch, and
            // never while this process runs GPU work on it.
            let p = unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    len,
                    rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                    rustix::mm::MapFlags::SHARED,
                    file,
                    0,
                )?
            };
            Ok(Mapping { ptr: p.cast(), len })
        }

        pub fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: the mapping is `len` bytes long and lives as long as `self`.
            unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
        }
    }

    pub fn close_inherited_fds() {
        // SAFETY: only closes descriptors; nothing owns fds >= 3 this early.
        unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    }
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

fn xorshift(s: &mut u64) -> u8 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    (*s >> 24) as u8
}

fn main() -> Result<()> {
    mapping::close_inherited_fds();
    let args = Args::parse();
    let kfd = SimKfd::new(args.root.clone());
    let topo = Topology::parse(&kfd.topology_dir()).context("reading the simulated topology")?;
    let pid = std::process::id();
    let _device = kfd.create_device(pid).context("opening the KFD file")?;
    // Every visible GPU, as the ROCm runtime opens them all.
    let gpus: Vec<SimGpu> = topo
        .gpus()
        .map(|g| SimGpu {
            user_gpu_id: g.gpu_id,
            actual_gpu_id: g.gpu_id,
        })
        .collect();
    let bos = buffers(&gpus, args.mib);
    let mut rng = pid as u64 | 1;
    let (mut maps, mut expect) = fill(&kfd, pid, &bos, &mut rng)?;
    kfd.store(&SimProcess {
        pid,
        gpus,
        bos: bos.clone(),
        queues: (0..64).map(|_| xorshift(&mut rng)).collect(),
        paused: false,
        resume_pending: false,
    })?;
    log_line(
        &args.log,
        &format!(
            "start pid={pid} gpus={} kfd_fd={}",
            topo.gpus().count(),
            _device.as_raw_fd()
        ),
    );
    for step in 1u64.. {
        // The queues: no GPU work while KFD holds them.
        while kfd.load(pid).is_none_or(|p| p.paused || p.resume_pending) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let which = (step as usize) % maps.len();
        if alloc::has_contents(bos[which].alloc_flags) {
            let len = expect[which].len().min(64 << 10);
            let start = (step as usize * 4099) % (expect[which].len() - len + 1);
            let v = xorshift(&mut rng);
            maps[which].bytes()[start..start + len].fill(v);
            expect[which][start..start + len].fill(v);
        }
        check(&args.log, step, &bos, &mut maps, &expect);
        log_line(&args.log, &format!("step={step} pid={pid} ok"));
        std::thread::sleep(Duration::from_millis(args.interval_ms));
    }
    Ok(())
}

/// A buffer of `mib` in each GPU's VRAM, one in system memory, a doorbell page.
fn buffers(gpus: &[SimGpu], mib: u64) -> Vec<SimBo> {
    let mut bos = Vec::new();
    for (i, g) in gpus.iter().enumerate() {
        bos.push(SimBo {
            handle: bos.len() as u32,
            addr: 0x7f00_0000_0000 + ((i as u64) << 32),
            size: mib << 20,
            gpu_id: g.user_gpu_id,
            alloc_flags: alloc::VRAM | alloc::WRITABLE,
        });
    }
    bos.push(SimBo {
        handle: bos.len() as u32,
        addr: 0x7e00_0000_0000,
        size: 1 << 20,
        gpu_id: gpus[0].user_gpu_id,
        alloc_flags: alloc::GTT | alloc::WRITABLE,
    });
    bos.push(SimBo {
        handle: bos.len() as u32,
        addr: 0x7d00_0000_0000,
        size: 4096,
        gpu_id: gpus[0].user_gpu_id,
        alloc_flags: alloc::DOORBELL,
    });
    bos
}

/// Maps each buffer and fills the ones with contents with random bytes; the mappings and what
/// they must hold.
fn fill(
    kfd: &SimKfd,
    pid: u32,
    bos: &[SimBo],
    rng: &mut u64,
) -> Result<(Vec<mapping::Mapping>, Vec<Vec<u8>>)> {
    let mut maps = Vec::new();
    let mut expect: Vec<Vec<u8>> = Vec::new();
    for b in bos {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(kfd.bo_path(pid, b.handle))?;
        f.set_len(b.size)?;
        let mut m = mapping::Mapping::new(&f, b.size as usize)?;
        let data: Vec<u8> = if alloc::has_contents(b.alloc_flags) {
            (0..b.size).map(|_| xorshift(rng)).collect()
        } else {
            vec![0; b.size as usize]
        };
        m.bytes().copy_from_slice(&data);
        maps.push(m);
        expect.push(data);
    }
    Ok((maps, expect))
}

/// Every buffer with contents holds what the app wrote; exits 3 with a MISMATCH line if not.
fn check(log: &str, step: u64, bos: &[SimBo], maps: &mut [mapping::Mapping], expect: &[Vec<u8>]) {
    let pid = std::process::id();
    for (i, (m, e)) in maps.iter_mut().zip(expect).enumerate() {
        if alloc::has_contents(bos[i].alloc_flags) && m.bytes() != e.as_slice() {
            let at = m
                .bytes()
                .iter()
                .zip(e)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            log_line(
                log,
                &format!("MISMATCH step={step} pid={pid} buffer={i} byte={at}"),
            );
            std::process::exit(3);
        }
    }
}
