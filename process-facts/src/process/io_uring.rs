//! io_uring instances of a process. CRIU (4.2.1) cannot dump them: it fails on the ring's mapping
//! ("Unknown shit 600 (anon_inode:[io_uring])") after the GPU state was already checkpointed. In
//! GPU jobs they come from libuv, which PyTorch's TCPStore server runs on (rank 0 of a
//! torch.multiprocessing job, torchrun's agent; docs/driver-facts.md, D1).
//!
//! The project's CRIU (patch 0008, third_party/criu/io-uring.md) dumps rings that are idle at the
//! dump. [`rings`] classifies each ring of a process with the same rules as that patch: handled,
//! or not handled with the reason.

use std::fs;

/// The io_uring instances of a process and who is likely to have made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoUring {
    /// Open io_uring fds.
    pub fds: usize,
    /// Mapped rings.
    pub mappings: usize,
    /// Mapped libraries known to use io_uring (file names), most specific first.
    pub libraries: Vec<String>,
}

const ANON: &str = "anon_inode:[io_uring]";

/// Libraries that make io_uring instances, by a part of their file name.
const USERS: [&str; 4] = ["libuv", "liburing", "libtorch_cpu", "libtorch"];

/// The process's io_uring instances, `None` when it has none.
pub fn io_uring(pid: i32) -> std::io::Result<Option<IoUring>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mappings = maps.lines().filter(|l| l.ends_with(ANON)).count();
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))?
        .flatten()
        .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == ANON))
        .count();
    if fds == 0 && mappings == 0 {
        return Ok(None);
    }
    Ok(Some(IoUring {
        fds,
        mappings,
        libraries: users_in(&maps),
    }))
}

fn users_in(maps: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for user in USERS {
        let file = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter_map(|p| p.rsplit('/').next())
            .find(|name| name.starts_with(user) && name.contains(".so"));
        if let Some(f) = file {
            if !found.iter().any(|x| x == f) {
                found.push(f.to_owned());
            }
        }
    }
    found
}

impl IoUring {
    /// What most likely made the rings, and how to do without them.
    pub fn fix(&self) -> String {
        let torch = self.libraries.iter().any(|l| l.starts_with("libtorch"));
        if torch {
            "PyTorch's TCPStore servers run on libuv, which holds an io_uring: start a job of \
             torch.multiprocessing (or init_process_group with tcp:// or env://) with \
             USE_LIBUV=0; torchrun's agent makes its stores on libuv whatever its settings \
             (PyTorch 2.11: USE_LIBUV=0, --rdzv-conf use_libuv=0, UV_USE_IO_URING=0 and \
             TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 all leave a ring): start a torchrun job with \
             io_uring off on the node (sysctl kernel.io_uring_disabled=2 while it starts; \
             libuv then uses epoll) and USE_LIBUV=0"
                .into()
        } else if self.libraries.iter().any(|l| l.starts_with("libuv")) {
            "libuv uses io_uring: UV_USE_IO_URING=0 in the program's environment turns it off for \
             file operations; a program that still holds a ring must stop using it before a \
             checkpoint"
                .into()
        } else {
            "CRIU cannot dump io_uring instances: switch the program (or the library that uses \
             io_uring) to ordinary I/O before checkpointing it"
                .into()
        }
    }
}

/// A ring of a process and whether the project's CRIU (patch 0008) can dump and restore it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// The ring's fd in the process.
    pub fd: i32,
    /// `Ok(())`: patch 0008 dumps and restores it; `Err(reasons)`: what it refuses, one reason
    /// per problem, each naming the fd (e.g. "fd 12: io_uring with 1 request(s) in flight").
    pub verdict: Result<(), Vec<String>>,
}

/// What /proc/PID/fdinfo/FD shows of a ring (kernel 6.18).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RingInfo {
    pub sq_entries: u32,
    pub cq_entries: u32,
    pub sq_head: u32,
    pub sq_tail: u32,
    pub cached_sq_head: u32,
    pub cq_head: u32,
    pub cq_tail: u32,
    pub cached_cq_tail: u32,
    /// The SQ thread's tid (SQPOLL), if any.
    pub sq_thread: Option<i32>,
    pub user_files: u32,
    pub user_bufs: u32,
    /// Opcodes of the requests in the kernel's poll list (in flight).
    pub polls: Vec<u32>,
    /// Completions waiting in the overflow list.
    pub overflows: u32,
    pub personalities: bool,
    pub napi: bool,
}

/// Parses a ring's fdinfo text; `None` when it lacks the counters (not an io_uring, or a kernel
/// older than the patch reads).
pub fn parse_fdinfo(text: &str) -> Option<RingInfo> {
    #[derive(PartialEq)]
    enum List {
        None,
        Poll,
        Overflow,
    }
    let mut r = RingInfo::default();
    let mut list = List::None;
    let mut seen = 0;
    for line in text.lines() {
        let (key, val) = line.split_once(':').unwrap_or((line, ""));
        let val = val.trim();
        let num = || {
            val.strip_prefix("0x").map_or_else(
                || val.parse::<u32>().ok(),
                |h| u32::from_str_radix(h, 16).ok(),
            )
        };
        let field = match key {
            "SqMask" => Some(&mut r.sq_entries),
            "SqHead" => Some(&mut r.sq_head),
            "SqTail" => Some(&mut r.sq_tail),
            "CachedSqHead" => Some(&mut r.cached_sq_head),
            "CqMask" => Some(&mut r.cq_entries),
            "CqHead" => Some(&mut r.cq_head),
            "CqTail" => Some(&mut r.cq_tail),
            "CachedCqTail" => Some(&mut r.cached_cq_tail),
            "UserFiles" => Some(&mut r.user_files),
            "UserBufs" => Some(&mut r.user_bufs),
            _ => None,
        };
        if let Some(f) = field {
            *f = num()?;
            seen += 1;
            list = List::None;
            continue;
        }
        match key {
            "SqThread" => r.sq_thread = val.parse::<i32>().ok().filter(|t| *t >= 0),
            "Personalities" => r.personalities = true,
            "NAPI" => r.napi = !val.contains("disabled"),
            "PollList" => list = List::Poll,
            "CqOverflowList" => list = List::Overflow,
            _ if list == List::Poll && line.starts_with("  op=") => {
                let op = line[5..].split(',').next().and_then(|o| o.parse().ok());
                r.polls.push(op.unwrap_or(u32::MAX));
                continue;
            }
            _ if list == List::Overflow && line.starts_with("  user_data=") => {
                r.overflows += 1;
                continue;
            }
            _ => {}
        }
        if !matches!(key, "PollList" | "CqOverflowList") && !line.starts_with(' ') {
            list = List::None;
        }
    }
    if seen < 10 {
        return None;
    }
    r.sq_entries += 1;
    r.cq_entries += 1;
    Some(r)
}

/// The patch's rules on what fdinfo shows (criu/io-uring.c, dump_one_io_uring): the reasons a
/// ring is refused, each naming the fd; empty when fdinfo shows nothing against it.
pub fn refusals(fd: i32, r: &RingInfo) -> Vec<String> {
    let mut why = Vec::new();
    if r.sq_tail != r.sq_head || r.cached_sq_head != r.sq_head {
        why.push(format!(
            "fd {fd}: io_uring with {} SQE(s) queued but not yet taken by the kernel",
            r.sq_tail.wrapping_sub(r.cached_sq_head)
        ));
    }
    if !r.polls.is_empty() {
        let ops: Vec<String> = r.polls.iter().map(u32::to_string).collect();
        why.push(format!(
            "fd {fd}: io_uring with {} request(s) in flight (opcodes {})",
            r.polls.len(),
            ops.join(",")
        ));
    }
    if r.overflows > 0 || r.cached_cq_tail != r.cq_tail {
        why.push(format!(
            "fd {fd}: io_uring with completions the kernel has not put in its CQ ({} overflowed)",
            r.overflows
        ));
    }
    if r.user_files > 0 {
        why.push(format!(
            "fd {fd}: io_uring with {} registered file(s)",
            r.user_files
        ));
    }
    if r.user_bufs > 0 {
        why.push(format!(
            "fd {fd}: io_uring with {} registered buffer(s)",
            r.user_bufs
        ));
    }
    if r.personalities {
        why.push(format!("fd {fd}: io_uring with registered personalities"));
    }
    if r.napi {
        why.push(format!("fd {fd}: io_uring with NAPI busy polling"));
    }
    why
}

/// How many times, 2 ms apart, a worker is looked at before it counts as busy: an idle worker is
/// seen awake now and then (its idle timeout every 5 s, the end of a short request).
const WORKER_LOOKS: u32 = 25;

/// io-wq workers of the process that run a request (not idle in `io_wq_worker` in any of
/// [`WORKER_LOOKS`] looks), by tid.
pub fn busy_workers(pid: i32) -> std::io::Result<Vec<i32>> {
    let mut busy = Vec::new();
    for e in fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let dir = e.path();
        let comm = fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("iou-wrk-") {
            continue;
        }
        let idle = || {
            let stat = fs::read_to_string(dir.join("stat")).unwrap_or_default();
            let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
            let wchan = fs::read_to_string(dir.join("wchan")).unwrap_or_default();
            // Gone (no stat) counts as idle.
            state.is_none() || (state != Some('R') && wchan == "io_wq_worker")
        };
        let seen_idle = (0..WORKER_LOOKS).any(|i| {
            if i > 0 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            idle()
        });
        if !seen_idle {
            if let Some(tid) = e.file_name().to_str().and_then(|t| t.parse().ok()) {
                busy.push(tid);
            }
        }
    }
    Ok(busy)
}

/// The lengths of the process's mappings of the SQEs of the ring with inode `ino` (offset
/// 0x10000000 of the ring).
fn sqe_mappings(maps: &str, ino: u64) -> Vec<u64> {
    maps.lines()
        .filter(|l| l.ends_with(ANON))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (start, end) = f.next()?.split_once('-')?;
            let off = f.nth(1)?;
            if f.nth(1)?.parse::<u64>().ok()? != ino || off != "10000000" {
                return None;
            }
            Some(u64::from_str_radix(end, 16).ok()? - u64::from_str_radix(start, 16).ok()?)
        })
        .collect()
}

/// The rings of a process, each with the patch's verdict: fdinfo's rules ([`refusals`]), busy
/// io-wq workers, rings without a mapping (NO_MMAP), SQEs mapped only in part, and, through a
/// copy of the ring's fd (pidfd_getfd: needs ptrace rights over the process), the patch's
/// probes: a registered eventfd (handled when it is the process's only eventfd) and
/// IORING_SETUP_SINGLE_ISSUER (refused). Not seen from one process: the patch also refuses a
/// ring that another process of the dumped tree holds too (a child forked after the ring was
/// made).
pub fn rings(pid: i32) -> std::io::Result<Vec<Ring>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mapped: Vec<u64> = maps
        .lines()
        .filter(|l| l.ends_with(ANON))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect();
    let mut eventfds = 0;
    let mut fds = Vec::new();
    for e in fs::read_dir(format!("/proc/{pid}/fd"))?.flatten() {
        let link = fs::read_link(e.path()).unwrap_or_default();
        let fd: i32 = e
            .file_name()
            .to_str()
            .and_then(|f| f.parse().ok())
            .unwrap_or(-1);
        if link.as_os_str() == "anon_inode:[eventfd]" {
            eventfds += 1;
        } else if link.as_os_str() == ANON {
            fds.push(fd);
        }
    }
    fds.sort_unstable();
    let busy = busy_workers(pid).unwrap_or_default();
    let mut out = Vec::new();
    for fd in fds {
        let text = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))?;
        let info = parse_fdinfo(&text);
        let mut why = match &info {
            Some(info) => refusals(fd, info),
            None => vec![format!(
                "fd {fd}: io_uring whose fdinfo lacks the ring's counters"
            )],
        };
        if !busy.is_empty() {
            why.push(format!(
                "fd {fd}: io_uring with request(s) in flight in {} busy io_uring worker(s) of the process",
                busy.len()
            ));
        }
        let ino = text
            .lines()
            .find_map(|l| l.strip_prefix("ino:"))
            .and_then(|i| i.trim().parse::<u64>().ok());
        if ino.is_some_and(|i| !mapped.contains(&i)) {
            why.push(format!(
                "fd {fd}: io_uring whose rings the process does not map"
            ));
        }
        // 6.18 maps the SQEs only whole (EFAULT): a mapping of part of them cannot be made again.
        if let (Some(i), Some(info)) = (ino, &info) {
            let whole = (u64::from(info.sq_entries) * 64).div_ceil(PAGE) * PAGE;
            if sqe_mappings(&maps, i).iter().any(|&len| len < whole) {
                why.push(format!(
                    "fd {fd}: io_uring whose SQEs the process maps only in part"
                ));
            }
        }
        match probe_eventfd(pid, fd) {
            Ok(false) => {}
            Ok(true) if eventfds == 1 => {}
            Ok(true) => why.push(format!(
                "fd {fd}: io_uring with a registered eventfd while the process holds {eventfds} \
                 eventfds (the kernel does not show which one)"
            )),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => why.push(format!(
                "fd {fd}: io_uring made with IORING_SETUP_SINGLE_ISSUER"
            )),
            Err(e) => why.push(format!("fd {fd}: io_uring that cannot be probed: {e}")),
        }
        out.push(Ring {
            fd,
            verdict: if why.is_empty() { Ok(()) } else { Err(why) },
        });
    }
    Ok(out)
}

const PAGE: u64 = 4096;

const IORING_REGISTER_EVENTFD: libc::c_long = 4;
const IORING_UNREGISTER_EVENTFD: libc::c_long = 5;

/// Whether the ring at `fd` of `pid` has an eventfd registered: registering one more fails with
/// EBUSY (EEXIST from a single-issuer ring); one accepted is unregistered at once.
fn probe_eventfd(pid: i32, fd: i32) -> std::io::Result<bool> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let last = std::io::Error::last_os_error;
    // SAFETY: plain syscalls on fds this function owns (each wrapped in an OwnedFd).
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return Err(last());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let ring = libc::syscall(libc::SYS_pidfd_getfd, pidfd_raw(&pidfd), fd, 0);
        if ring < 0 {
            return Err(last());
        }
        let ring = OwnedFd::from_raw_fd(ring as i32);
        let efd = libc::eventfd(0, libc::EFD_CLOEXEC);
        if efd < 0 {
            return Err(last());
        }
        let efd = OwnedFd::from_raw_fd(efd);
        let raw = pidfd_raw(&efd);
        let reg = |op: libc::c_long, arg: *const i32, n: u32| {
            libc::syscall(libc::SYS_io_uring_register, pidfd_raw(&ring), op, arg, n)
        };
        if reg(IORING_REGISTER_EVENTFD, &raw, 1) == 0 {
            reg(IORING_UNREGISTER_EVENTFD, std::ptr::null(), 0);
            return Ok(false);
        }
        let e = last();
        if e.raw_os_error() == Some(libc::EBUSY) {
            Ok(true)
        } else {
            Err(e)
        }
    }
}

fn pidfd_raw(fd: &std::os::fd::OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_libraries_and_the_fix() {
        let maps = "\
7f00-7f10 r-xp 00000000 fe:00 1 /opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so
7f10-7f20 r-xp 00000000 fe:00 2 /usr/lib/x86_64-linux-gnu/libuv.so.1.0.0
7f20-7f24 rw-s 10000000 00:10 3 anon_inode:[io_uring]
";
        let libs = users_in(maps);
        assert_eq!(libs, vec!["libuv.so.1.0.0", "libtorch_cpu.so"]);
        let u = IoUring {
            fds: 1,
            mappings: 1,
            libraries: libs,
        };
        assert!(
            u.fix().contains("USE_LIBUV=0") && u.fix().contains("kernel.io_uring_disabled=2"),
            "{}",
            u.fix()
        );
        let plain = IoUring {
            fds: 1,
            mappings: 0,
            libraries: vec![],
        };
        assert!(plain.fix().contains("CRIU cannot dump io_uring"));
    }

    #[test]
    fn a_process_without_rings_has_none() {
        // A child of its own: this test process holds rings while other tests run.
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let found = io_uring(child.id() as i32);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found.unwrap(), None);
    }

    /// Captured on this project's VM (kernel 6.18.44) from uring-app (third_party/criu/tests):
    /// the file ring, idle, after a restore by patch 0008.
    const IDLE: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t111773\nSqMask:\t0x3f\n\
SqHead:\t7\nSqTail:\t7\nCachedSqHead:\t7\nCqMask:\t0x7f\nCqHead:\t7\nCqTail:\t7\n\
CachedCqTail:\t7\nSQEs:\t0\nCQEs:\t0\nSqThread:\t-1\nSqThreadCpu:\t-1\nSqTotalTime:\t0\n\
SqWorkTime:\t0\nUserFiles:\t0\nUserBufs:\t0\nPollList:\nCqOverflowList:\nNAPI:\tdisabled\n";

    /// The same kernel: a read of an empty pipe in flight (opcode 22, IORING_OP_READ) and a
    /// timeout (which fdinfo does not show).
    const PENDING: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t41698\nSqMask:\t0x7\n\
SqHead:\t3\nSqTail:\t3\nCachedSqHead:\t3\nCqMask:\t0xf\nCqHead:\t1\nCqTail:\t1\n\
CachedCqTail:\t1\nSQEs:\t0\nCQEs:\t0\nSqThread:\t-1\nSqThreadCpu:\t-1\nSqTotalTime:\t0\n\
SqWorkTime:\t0\nUserFiles:\t0\nUserBufs:\t0\nPollList:\n  op=22, task_works=0\n\
CqOverflowList:\nNAPI:\tdisabled\n";

    /// The same kernel: an SQPOLL ring with one CQE not reaped yet.
    const SQPOLL: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t41706\nSqMask:\t0x3\n\
SqHead:\t1\nSqTail:\t1\nCachedSqHead:\t1\nCqMask:\t0x7\nCqHead:\t0\nCqTail:\t1\n\
CachedCqTail:\t1\nSQEs:\t0\nCQEs:\t1\n    0: user_data:0, res:0, flag:0\nSqThread:\t28595\n\
SqThreadCpu:\t1\nSqTotalTime:\t11975\nSqWorkTime:\t0\nUserFiles:\t0\nUserBufs:\t0\nPollList:\n\
CqOverflowList:\nNAPI:\tdisabled\n";

    #[test]
    fn an_idle_ring_is_handled() {
        let r = parse_fdinfo(IDLE).unwrap();
        assert_eq!(
            (r.sq_entries, r.cq_entries, r.sq_head, r.cq_tail),
            (64, 128, 7, 7)
        );
        assert_eq!(r.sq_thread, None);
        assert!(refusals(8, &r).is_empty());
    }

    #[test]
    fn unreaped_completions_and_an_sq_thread_are_handled() {
        let r = parse_fdinfo(SQPOLL).unwrap();
        assert_eq!(r.sq_thread, Some(28595));
        assert_eq!((r.cq_head, r.cq_tail), (0, 1));
        assert!(refusals(11, &r).is_empty(), "{:?}", refusals(11, &r));
    }

    #[test]
    fn a_request_in_flight_is_refused_by_fd() {
        let r = parse_fdinfo(PENDING).unwrap();
        assert_eq!(r.polls, vec![22]);
        assert_eq!(
            refusals(3, &r),
            vec!["fd 3: io_uring with 1 request(s) in flight (opcodes 22)".to_string()]
        );
    }

    #[test]
    fn registrations_queued_sqes_and_overflows_are_refused() {
        let text = IDLE
            .replace("UserBufs:\t0", "UserBufs:\t2")
            .replace("UserFiles:\t0", "UserFiles:\t1")
            .replace("SqTail:\t7", "SqTail:\t9")
            .replace(
                "CqOverflowList:\n",
                "CqOverflowList:\n  user_data=1, res=0, flags=0\n",
            );
        let why = refusals(9, &parse_fdinfo(&text).unwrap());
        assert_eq!(why.len(), 4, "{why:?}");
        assert!(why[0].contains("2 SQE(s) queued"));
        assert!(why
            .iter()
            .any(|w| w == "fd 9: io_uring with 2 registered buffer(s)"));
        assert!(why.iter().any(|w| w.contains("1 registered file(s)")));
        assert!(why.iter().any(|w| w.contains("1 overflowed")));
    }

    #[test]
    fn sqe_mappings_of_a_ring_by_inode() {
        let maps = "\
7f20-7f24 rw-s 10000000 00:10 3 anon_inode:[io_uring]
7f30-7f33 rw-s 10000000 00:10 3 anon_inode:[io_uring]
7f40-7f44 rw-s 00000000 00:10 3 anon_inode:[io_uring]
7f50-7f54 rw-s 10000000 00:10 4 anon_inode:[io_uring]
";
        assert_eq!(sqe_mappings(maps, 3), vec![4, 3]);
        assert_eq!(sqe_mappings(maps, 4), vec![4]);
        assert!(sqe_mappings(maps, 5).is_empty());
    }

    #[test]
    fn other_fdinfo_is_not_a_ring() {
        assert_eq!(
            parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t1\neventfd-count:\t0\n"),
            None
        );
    }

    #[test]
    fn a_real_idle_ring_with_its_eventfd_is_handled() {
        // A ring of this test process: 8 entries, one NOP reaped, an eventfd registered.
        // SAFETY: raw io_uring syscalls on a ring this test makes and closes.
        unsafe {
            let mut p = [0u8; 120];
            let fd = libc::syscall(libc::SYS_io_uring_setup, 8, p.as_mut_ptr()) as i32;
            assert!(
                fd >= 0,
                "needs io_uring ({}): allow it (sysctl kernel.io_uring_disabled=0) to run the \
                 tests",
                std::io::Error::last_os_error()
            );
            let efd = libc::eventfd(0, 0);
            let r = libc::syscall(libc::SYS_io_uring_register, fd, 4, &efd, 1);
            assert_eq!(r, 0);
            let m = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(m, libc::MAP_FAILED);
            let me = std::process::id() as i32;
            let found = rings(me).unwrap();
            let ring = found.iter().find(|r| r.fd == fd).unwrap();
            let others = fs::read_dir("/proc/self/fd")
                .unwrap()
                .flatten()
                .filter(|e| {
                    fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]")
                })
                .count();
            if others == 1 {
                assert_eq!(ring.verdict, Ok(()));
            }
            let second = libc::eventfd(0, 0);
            let ring = rings(me).unwrap().into_iter().find(|r| r.fd == fd).unwrap();
            let why = ring.verdict.unwrap_err();
            assert!(
                why.iter().any(|w| w.contains("registered eventfd")),
                "{why:?}"
            );
            libc::munmap(m, 4096);
            for f in [fd, efd, second] {
                libc::close(f);
            }
        }
    }
}
