//! The processes a CRIU restore created, as the kernel reports each fork: a restore that fails
//! kills exactly those, and nothing else.
//!
//! A pid and a start time cannot tell them apart: two restores of the same images at once make
//! processes with the same pids, and the one that lost (`Can't fork for P: File exists`) must not
//! kill the process P that the other one made. So the plugin subscribes to the kernel's process
//! events (the proc connector) in CRIU before anything is forked, and the guardian follows every
//! fork whose parent is CRIU or one of its descendants, taking a pidfd of each child as it
//! appears; a kill goes through that pidfd. Where the connector is not available (not root, not
//! the initial namespaces) or drops events (its buffer overflowed), CRIU's descendants are also
//! read from /proc every few milliseconds.
//!
//! A fork's event may be read after its parent died: a CRIU killed right after it forked the
//! tree's root, before the guardian ran. The child then has another parent (the reaper it was
//! handed to), and is told from a process that reused its pid by its start time: the forked
//! process started by the time of the event, a pid reused after it exited starts later.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use process_facts::process;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

/// The proc connector's multicast group and id (linux/connector.h, linux/cn_proc.h).
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 1;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDR: usize = 16;
const CN_MSG_HDR: usize = 20;
/// How often CRIU's descendants are read from /proc when events may be missing.
const SWEEP: Duration = Duration::from_millis(10);

/// Subscribes to the kernel's fork events. Called in CRIU before the restore forks anything;
/// the guardian reads the socket ([`Lineage::follow`]).
pub fn subscribe() -> std::io::Result<OwnedFd> {
    let fd = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        Some(netlink::CONNECTOR),
    )?;
    rustix::net::bind(&fd, &SocketAddrNetlink::new(0, CN_IDX_PROC))?;
    // Every process event of the machine comes here: room for a burst of them.
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(&fd, 8 << 20).is_err() {
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&fd, 8 << 20);
    }
    rustix::net::send(&fd, &listen_message(), SendFlags::empty())?;
    Ok(fd)
}

/// nlmsghdr + cn_msg + PROC_CN_MCAST_LISTEN.
fn listen_message() -> Vec<u8> {
    let mut m = Vec::with_capacity(NLMSG_HDR + CN_MSG_HDR + 4);
    let len = (NLMSG_HDR + CN_MSG_HDR + 4) as u32;
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes()); // flags
    m.extend_from_slice(&0u32.to_ne_bytes()); // seq
    m.extend_from_slice(&std::process::id().to_ne_bytes());
    m.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    m.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // ack
    m.extend_from_slice(&4u16.to_ne_bytes()); // len
    m.extend_from_slice(&0u16.to_ne_bytes()); // flags
    m.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    m
}

/// A fork the kernel reported (a new process; threads are left out).
#[derive(Debug, PartialEq, Eq)]
struct Fork {
    parent: i32,
    child: i32,
    /// When the kernel reported it (CLOCK_MONOTONIC, ns).
    at_ns: u64,
}

fn forks(datagram: &[u8]) -> Vec<Fork> {
    let word = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let time = |b: &[u8], at: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(len) = word(datagram, at).map(|l| l as usize) {
        if len < NLMSG_HDR || at + len > datagram.len() {
            break;
        }
        let msg = &datagram[at..at + len];
        let event = NLMSG_HDR + CN_MSG_HDR;
        let ours = word(msg, NLMSG_HDR) == Some(CN_IDX_PROC);
        if ours && word(msg, event) == Some(PROC_EVENT_FORK) {
            // proc_event: what, cpu, timestamp_ns, then parent_pid, parent_tgid, child_pid,
            // child_tgid.
            let f = |i: usize| word(msg, event + 16 + 4 * i).map(|v| v as i32);
            let at_ns = time(msg, event + 8);
            if let (Some(ptgid), Some(cpid), Some(ctgid), Some(at_ns)) = (f(1), f(2), f(3), at_ns) {
                if cpid == ctgid {
                    out.push(Fork {
                        parent: ptgid,
                        child: ctgid,
                        at_ns,
                    });
                }
            }
        }
        at += (len + 3) & !3;
    }
    out
}

/// CRIU and what it created.
struct Family {
    criu: i32,
    /// This guardian, forked from CRIU too.
    me: i32,
    /// Created processes, each held by a pidfd taken while it was known to be CRIU's.
    created: BTreeMap<i32, OwnedFd>,
    /// Events may be missing: CRIU's descendants are read from /proc too.
    sweeping: bool,
}

impl Family {
    fn ours(&self, pid: i32) -> bool {
        pid == self.criu || self.created.contains_key(&pid)
    }

    /// Takes `child` of `parent` in, if the parent is ours; `forked_ns`: when the kernel
    /// reported the fork (None: seen in /proc, where the parent is the one it has now).
    fn born(&mut self, parent: i32, child: i32, forked_ns: Option<u64>) {
        if child == self.me || !self.ours(parent) || self.created.contains_key(&child) {
            return;
        }
        let Some(pid) = Pid::from_raw(child) else {
            return;
        };
        let Ok(fd) = pidfd_open(pid, PidfdFlags::empty()) else {
            return; // gone already: nothing to kill
        };
        // The pid may have been reused before the pidfd was taken: a process that another of
        // ours did not fork is not ours. One whose parent died since (a killed CRIU) was handed
        // to a reaper: it is the forked one if it started by the time of the fork.
        let forked_by_ours = process::parent(child).is_some_and(|p| self.ours(p))
            || forked_ns.is_some_and(|t| started_by(child, t));
        if forked_by_ours {
            self.created.insert(child, fd);
        }
    }

    /// Reads CRIU's descendants from /proc.
    fn sweep(&mut self) {
        for pid in process::tree(self.criu) {
            if let Some(parent) = process::parent(pid) {
                self.born(parent, pid, None);
            }
        }
    }
}

/// What a restore's CRIU created, followed from the guardian.
#[derive(Clone)]
pub struct Lineage {
    family: Arc<Mutex<Family>>,
    events: Option<Arc<OwnedFd>>,
}

impl Lineage {
    /// Follows what `criu` forks from now on, through `events` (from [`subscribe`]) where there
    /// are any, and through /proc.
    pub fn follow(events: Option<OwnedFd>, criu: i32) -> Lineage {
        let l = Lineage {
            family: Arc::new(Mutex::new(Family {
                criu,
                me: std::process::id() as i32,
                created: BTreeMap::new(),
                sweeping: events.is_none(),
            })),
            events: events.map(Arc::new),
        };
        let follower = l.clone();
        std::thread::spawn(move || loop {
            follower.wait(SWEEP);
            follower.catch_up();
        });
        l
    }

    fn wait(&self, most: Duration) {
        let Some(fd) = &self.events else {
            std::thread::sleep(most);
            return;
        };
        let ts = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: most.as_nanos() as i64,
        };
        let mut fds = [PollFd::new(&**fd, PollFlags::IN)];
        let _ = poll(&mut fds, Some(&ts));
    }

    /// Takes in every event queued so far (and sweeps /proc if events may be missing).
    fn catch_up(&self) {
        let mut family = self.family.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fd) = &self.events {
            let mut buf = vec![0u8; 16 << 10];
            loop {
                match rustix::net::recv(&**fd, &mut buf[..], RecvFlags::DONTWAIT) {
                    Ok((n, _)) => {
                        for f in forks(&buf[..n]) {
                            family.born(f.parent, f.child, Some(f.at_ns));
                        }
                    }
                    Err(rustix::io::Errno::NOBUFS) => family.sweeping = true,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => break,
                }
            }
        }
        if family.sweeping {
            family.sweep();
        }
    }

    /// The created processes still alive, with their pids in their own namespace, after
    /// taking in what happened up to now.
    pub fn alive(&self) -> Vec<(i32, i32)> {
        self.catch_up();
        let mut family = self.family.lock().unwrap_or_else(|e| e.into_inner());
        if process::exists(family.criu) {
            family.sweep();
        }
        family
            .created
            .iter()
            .filter(|(_, fd)| !exited(fd))
            .map(|(pid, _)| (*pid, process::ns_pid(*pid).unwrap_or(*pid)))
            .collect()
    }

    /// Kills a created process (through its pidfd: never another process with its pid).
    pub fn kill(&self, pid: i32) {
        let family = self.family.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fd) = family.created.get(&pid) {
            let _ = pidfd_send_signal(fd, Signal::KILL);
        }
    }
}

/// Whether process `pid` started by `mono_ns` (CLOCK_MONOTONIC), to the clock tick its start
/// time is kept in (/proc/PID/stat counts CLOCK_BOOTTIME ticks).
fn started_by(pid: i32, mono_ns: u64) -> bool {
    let ns = |t: rustix::time::Timespec| t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128;
    let since_boot = ns(rustix::time::clock_gettime(rustix::time::ClockId::Boottime))
        - ns(rustix::time::clock_gettime(
            rustix::time::ClockId::Monotonic,
        ));
    let tick_ns = 1_000_000_000 / procfs::ticks_per_second().max(1) as i128;
    let forked_tick = (mono_ns as i128 + since_boot) / tick_ns;
    process::starttime(pid).is_some_and(|s| s as i128 <= forked_tick)
}

/// A pidfd is readable once its process has exited.
fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let now = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&now)).is_ok_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fork_event(parent: i32, child_pid: i32, child_tgid: i32) -> Vec<u8> {
        let mut m = listen_message();
        m.truncate(NLMSG_HDR + CN_MSG_HDR);
        // what, cpu, timestamp_ns (7, in two words), parent pid and tgid.
        for v in [PROC_EVENT_FORK, 0, 7, 0, parent as u32, parent as u32] {
            m.extend_from_slice(&v.to_ne_bytes());
        }
        m.extend_from_slice(&(child_pid as u32).to_ne_bytes());
        m.extend_from_slice(&(child_tgid as u32).to_ne_bytes());
        let len = m.len() as u32;
        m[..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn fork_events_name_parent_and_child_and_leave_threads_out() {
        let mut two = fork_event(10, 11, 11);
        two.extend(fork_event(11, 12, 11));
        let fork = Fork {
            parent: 10,
            child: 11,
            at_ns: if cfg!(target_endian = "little") {
                7
            } else {
                7 << 32
            },
        };
        assert_eq!(forks(&two), vec![fork]);
        assert_eq!(forks(&[1, 2, 3]), vec![]);
    }

    /// Forks followed from the kernel's events: a child of this process and its child are
    /// ours, a process forked by someone else is not. Needs root (the proc connector).
    #[test]
    fn what_a_process_forks_is_followed_and_nothing_else() {
        let events = subscribe().unwrap_or_else(|e| {
            panic!(
                "needs the kernel's proc connector, which only root may read ({e}): run the \
                 tests as root, as scripts/test.sh does"
            )
        });
        let me = std::process::id() as i32;
        let l = Lineage::follow(Some(events), me);
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut grandchild = None;
        for _ in 0..200 {
            grandchild = process::children(pid).first().copied();
            if grandchild.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let grandchild = grandchild.expect("sh forked sleep");
        let alive: Vec<i32> = l.alive().iter().map(|(p, _)| *p).collect();
        assert!(
            alive.contains(&pid) && alive.contains(&grandchild),
            "{alive:?}"
        );
        assert!(!alive.contains(&1));
        l.kill(grandchild);
        let _ = child.wait();
        l.kill(pid);
    }

    /// A fork whose event is read only after its parent died (a CRIU killed right after it
    /// forked the tree's root, the guardian not yet run): the child, handed to a reaper, is
    /// still followed and killed. Needs root (the proc connector).
    #[test]
    fn a_child_whose_parent_died_before_its_fork_was_read_is_followed() {
        let events = subscribe().expect("the proc connector (run the tests as root)");
        // The "CRIU": a shell that forks a sleep, says its pid and exits.
        let mut criu = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(criu.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let child: i32 = line.trim().parse().unwrap();
        criu.wait().unwrap();
        assert_ne!(process::parent(child), Some(criu.id() as i32));
        // Only now are the events read: the sleep's parent is its reaper.
        let l = Lineage::follow(Some(events), criu.id() as i32);
        let alive: Vec<i32> = l.alive().iter().map(|(p, _)| *p).collect();
        l.kill(child);
        assert_eq!(alive, vec![child]);
        let gone = || !process::exists(child) || process::is_zombie(child);
        for _ in 0..500 {
            if gone() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(gone(), "the sleep {child} was not killed");
    }

    /// A process that started after a fork's time is not the forked one (its pid reused).
    #[test]
    fn a_process_started_after_the_fork_is_not_the_forked_one() {
        let mono_ns = || {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
            t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
        };
        let forked = mono_ns();
        // Two clock ticks (10 ms each) later.
        std::thread::sleep(Duration::from_millis(30));
        let mut later = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = later.id() as i32;
        let verdicts = (started_by(pid, forked), started_by(pid, mono_ns()));
        let _ = later.kill();
        let _ = later.wait();
        assert_eq!(verdicts, (false, true));
    }
}
