//! Nodes of a test bed on one machine: each node a network and UTS namespace of its own (its
//! hostname, an `eth0` with its address), all joined to a bridge in a namespace of the bed's
//! own, as machines on a switch. Nothing is made in the host's network namespace, so beds of
//! concurrent test runs cannot collide, whatever addresses they use. The links are made through
//! rtnetlink messages from here (the GPU machine has no `ip`); the namespaces are held by
//! `netbed hold` processes that end when the bed's directory goes.
//!
//! `netbed up DIR NAME=ADDR/PREFIX...`, `netbed exec DIR NAME -- CMD...`, `netbed addr DIR NAME
//! ADDR/PREFIX`, `netbed down DIR`.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};
use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType};

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_PID: u16 = 19;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 1;
const AF_INET: u8 = 2;

/// A netlink message being built: the header, the fixed part, then attributes.
struct Msg(Vec<u8>);

impl Msg {
    fn new(kind: u16, flags: u16, fixed: &[u8]) -> Msg {
        let mut b = vec![0u8; 16];
        b[4..6].copy_from_slice(&kind.to_ne_bytes());
        b[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        b.extend_from_slice(fixed);
        Msg(b)
    }

    fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Msg {
        let len = 4 + data.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(data);
        while self.0.len() % 4 != 0 {
            self.0.push(0);
        }
        self
    }

    /// An attribute holding others (built by `inner`).
    fn nest(&mut self, kind: u16, inner: impl FnOnce(&mut Msg)) -> &mut Msg {
        let start = self.0.len();
        self.attr(kind, &[]);
        inner(self);
        let len = (self.0.len() - start) as u16;
        self.0[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    fn bytes(&mut self) -> &[u8] {
        let len = self.0.len() as u32;
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        &self.0
    }
}

fn ifinfo(index: i32, flags: u32, change: u32) -> Vec<u8> {
    let mut b = vec![0u8; 16];
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

fn name(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Sends one request in the calling thread's network namespace and reads the kernel's answer.
fn request(msg: &mut Msg) -> std::io::Result<()> {
    // Protocol 0 is NETLINK_ROUTE.
    let fd = rustix::net::socket(AddressFamily::NETLINK, SocketType::RAW, None)?;
    rustix::net::sendto(
        &fd,
        msg.bytes(),
        SendFlags::empty(),
        &SocketAddrNetlink::new(0, 0),
    )?;
    let mut buf = [0u8; 4096];
    let (n, _) = rustix::net::recv(&fd, &mut buf, RecvFlags::empty())?;
    if n >= 20 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
        let errno = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        if errno != 0 {
            return Err(std::io::Error::from_raw_os_error(-errno));
        }
    }
    Ok(())
}

fn index(ifname: &str) -> std::io::Result<i32> {
    nix::net::if_::if_nametoindex(ifname)
        .map(|i| i as i32)
        .map_err(std::io::Error::from)
}

fn bridge(ifname: &str) -> std::io::Result<()> {
    let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &ifinfo(0, 0, 0));
    m.attr(IFLA_IFNAME, &name(ifname)).nest(IFLA_LINKINFO, |m| {
        m.attr(IFLA_INFO_KIND, b"bridge");
    });
    request(&mut m)
}

/// A veth pair: `ifname` here, `peer` in the network namespace of process `peer_pid`.
fn veth(ifname: &str, peer: &str, peer_pid: i32) -> std::io::Result<()> {
    let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &ifinfo(0, 0, 0));
    m.attr(IFLA_IFNAME, &name(ifname)).nest(IFLA_LINKINFO, |m| {
        m.attr(IFLA_INFO_KIND, b"veth").nest(IFLA_INFO_DATA, |m| {
            m.nest(VETH_INFO_PEER, |m| {
                m.0.extend_from_slice(&ifinfo(0, 0, 0));
                m.attr(IFLA_IFNAME, &name(peer))
                    .attr(IFLA_NET_NS_PID, &(peer_pid as u32).to_ne_bytes());
            });
        });
    });
    request(&mut m)
}

fn up(ifname: &str) -> std::io::Result<()> {
    request(&mut Msg::new(
        RTM_NEWLINK,
        0,
        &ifinfo(index(ifname)?, IFF_UP, IFF_UP),
    ))
}

fn master(ifname: &str, bridge: &str) -> std::io::Result<()> {
    let mut m = Msg::new(RTM_NEWLINK, 0, &ifinfo(index(ifname)?, 0, 0));
    m.attr(IFLA_MASTER, &(index(bridge)? as u32).to_ne_bytes());
    request(&mut m)
}

fn add_address(ifname: &str, ip: Ipv4Addr, prefix: u8) -> std::io::Result<()> {
    let mut fixed = vec![AF_INET, prefix, 0, 0];
    fixed.extend_from_slice(&(index(ifname)? as u32).to_ne_bytes());
    let mut m = Msg::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &fixed);
    m.attr(IFA_LOCAL, &ip.octets())
        .attr(IFA_ADDRESS, &ip.octets());
    request(&mut m)
}

/// "NAME=A.B.C.D/N".
pub fn parse_node(s: &str) -> Option<(String, Ipv4Addr, u8)> {
    let (name, addr) = s.split_once('=')?;
    let (ip, prefix) = parse_addr(addr)?;
    Some((name.to_owned(), ip, prefix))
}

pub fn parse_addr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, prefix) = s.split_once('/')?;
    Some((ip.parse().ok()?, prefix.parse().ok()?))
}

fn pid_file(dir: &Path, node: &str) -> PathBuf {
    dir.join(format!("{node}.pid"))
}

/// The pid holding `node`'s namespaces.
pub fn holder(dir: &Path, node: &str) -> std::io::Result<i32> {
    std::fs::read_to_string(pid_file(dir, node))?
        .trim()
        .parse()
        .map_err(|_| std::io::Error::other(format!("bad pid file of node {node}")))
}

/// Moves the calling thread into the network (and UTS) namespace of `pid`.
pub fn enter(pid: i32, uts: bool) -> std::io::Result<()> {
    let open = |ns: &str| -> std::io::Result<OwnedFd> {
        Ok(std::fs::File::open(format!("/proc/{pid}/ns/{ns}"))?.into())
    };
    setns(open("net")?.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
    if uts {
        setns(open("uts")?.as_fd(), CloneFlags::CLONE_NEWUTS).map_err(std::io::Error::from)?;
    }
    Ok(())
}

/// `netbed hold DIR NAME`: new namespaces named NAME; stays until DIR goes.
pub fn hold(dir: &Path, node: &str) -> std::io::Result<()> {
    nix::sched::unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWUTS)
        .map_err(std::io::Error::from)?;
    nix::unistd::sethostname(node).map_err(std::io::Error::from)?;
    up("lo")?;
    let tmp = dir.join(format!(".{node}.pid"));
    std::fs::write(&tmp, std::process::id().to_string())?;
    std::fs::rename(&tmp, pid_file(dir, node))?;
    while dir.exists() {
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// Starts a holder for `node` (this executable as `netbed hold`) and waits for its pid.
fn spawn_holder(me: &Path, dir: &Path, node: &str) -> std::io::Result<i32> {
    Command::new(me)
        .arg("hold")
        .arg(dir)
        .arg(node)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let start = Instant::now();
    loop {
        if let Ok(pid) = holder(dir, node) {
            return Ok(pid);
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err(std::io::Error::other(format!(
                "node {node} did not come up"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `netbed up`: the switch and every node, each node's `eth0` on the switch with its address.
pub fn up_bed(me: &Path, dir: &Path, nodes: &[(String, Ipv4Addr, u8)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let switch = spawn_holder(me, dir, ".switch")?;
    let pids = nodes
        .iter()
        .map(|(n, _, _)| spawn_holder(me, dir, n))
        .collect::<std::io::Result<Vec<i32>>>()?;
    // This thread does the rest: it enters the switch, then each node.
    enter(switch, false)?;
    bridge("br0")?;
    up("br0")?;
    for (i, pid) in pids.iter().enumerate() {
        let port = format!("p{i}");
        veth(&port, "eth0", *pid)?;
        master(&port, "br0")?;
        up(&port)?;
    }
    for ((_, ip, prefix), pid) in nodes.iter().zip(&pids) {
        enter(*pid, false)?;
        add_address("eth0", *ip, *prefix)?;
        up("eth0")?;
    }
    Ok(())
}

/// `netbed link DIR NAME up|down`: a node's `eth0` up or down (a cable pulled: its
/// connections carry nothing until it is back).
pub fn link(dir: &Path, node: &str, on: bool) -> std::io::Result<()> {
    enter(holder(dir, node)?, false)?;
    let flags = if on { IFF_UP } else { 0 };
    request(&mut Msg::new(
        RTM_NEWLINK,
        0,
        &ifinfo(index("eth0")?, flags, IFF_UP),
    ))
}

/// `netbed addr DIR NAME ADDR/N`: another address on a node's `eth0`.
pub fn address(dir: &Path, node: &str, ip: Ipv4Addr, prefix: u8) -> std::io::Result<()> {
    enter(holder(dir, node)?, false)?;
    add_address("eth0", ip, prefix)
}
