//! `--ranks N`: the application as a distributed job of N ranks under one parent, with the
//! resources a PyTorch NCCL job holds besides the GPU (docs/driver-facts.md, D1): rank 0 serves a
//! TCPStore-like listener on `[::]` that every rank stays connected to (over ::ffff:127.0.0.1),
//! each rank listens on an ephemeral port of 127.0.0.1 and the ranks connect in a ring (accepted
//! sockets share their listener's port), and an unlinked shared-memory file in /dev/shm that all
//! ranks write (NCCL's `nccl-*` files). As NCCL's, the ring listeners have no SO_REUSEADDR, and
//! each first serves a short bootstrap connection that it closes first: the TIME_WAIT socket this
//! leaves on its port is what kept a real job's listener from being restored (CRIU patch 0005).
//! Every step each rank writes its slot of the file, sends the step and its slot's hash to the
//! next rank and checks what the previous one sent against the previous slot: a job restored with
//! a connection, a byte of the file or a step lost says so. With `--collective-ms`, each step also
//! launches a collective kernel that waits on the GPU for every rank's (an all_reduce): a rank
//! locked before it launched its part leaves its peers' kernels waiting, as NCCL's do.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::sys::SharedFile;

/// Bytes at the head of the file: one port per rank.
const HEADER: usize = 4096;

pub struct Rank {
    /// The rank on this node, and the ranks of this node.
    pub rank: usize,
    pub ranks: usize,
    /// Across nodes: this rank's place among all of them, and how many there are.
    pub global: usize,
    pub total: usize,
    /// The job's collectives on the GPU.
    pub group: u64,
    file: SharedFile,
    slot: usize,
    next: TcpStream,
    prev: TcpStream,
    store: TcpStream,
    /// Rank 0: the store's listener and its accepted connections.
    served: Vec<TcpStream>,
    _listeners: Vec<TcpListener>,
}

/// Made by the parent before it forks the ranks: the shared file, already unlinked.
pub struct Plan {
    pub ranks: usize,
    pub store_port: u16,
    file: SharedFile,
    group: u64,
    nodes: Option<Nodes>,
}

/// A job across machines (`--nnodes`): this node's place and where the store is.
#[derive(Clone)]
pub struct Nodes {
    pub nnodes: usize,
    pub node_rank: usize,
    /// HOST:PORT of the store (node 0's rank 0 listens on its port).
    pub master: String,
}

impl Plan {
    pub fn new(ranks: usize, store_port: u16, shm_mib: usize) -> Result<Plan> {
        // Unique to this job on the GPU daemon: the parent's pid and the time it started.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // Also by the time: jobs in pid namespaces of their own all have pid 1, and a restore
        // puts the (unlinked) file back at its name for a moment.
        let name = format!("/dev/shm/cuda-sim-job-{}-{nanos:x}", std::process::id());
        let file = SharedFile::create_unlinked(&name, HEADER + shm_mib.max(1) * (1 << 20))?;
        Ok(Plan {
            ranks,
            store_port,
            file,
            group: (std::process::id() as u64) << 32 ^ nanos,
            nodes: None,
        })
    }

    /// The job spans nodes: every node's ranks meet through the store at `master`. The
    /// collectives' group is the store's address: the same on every node.
    pub fn across(mut self, nodes: Nodes) -> Plan {
        self.group = nodes.master.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x1000_0000_01b3)
        });
        self.nodes = Some(nodes);
        self
    }

    /// Joins a job across nodes as local rank `rank`: the ring's addresses come from the store.
    fn join_across(self, rank: usize, nodes: Nodes) -> Result<Rank> {
        let n = self.ranks;
        let global = nodes.node_rank * n + rank;
        let total = nodes.nnodes * n;
        let slot = (self.file.len() - HEADER) / n;
        let port = nodes
            .master
            .rsplit_once(':')
            .map_or(self.store_port, |(_, p)| {
                p.parse().unwrap_or(self.store_port)
            });
        let mut listeners = Vec::new();
        if global == 0 {
            listeners.push(TcpListener::bind(("0.0.0.0", port)).context("store listener")?);
        }
        let ring =
            listen_without_reuseaddr(std::net::Ipv4Addr::UNSPECIFIED).context("ring listener")?;
        let mut store = connect(&nodes.master)?;
        let me = (store.local_addr()?.ip(), ring.local_addr()?.port());
        let mut hello = (global as u32).to_le_bytes().to_vec();
        hello.extend_from_slice(&me.1.to_le_bytes());
        store.write_all(&hello)?;
        let served = match listeners.first() {
            Some(l) => serve_table(l, total)?,
            None => Vec::new(),
        };
        let table = read_table(&mut store, total)?;
        let next = table[(global + 1) % total];
        let (next, prev) = join_ring(ring, &next.to_string(), global, &mut listeners)?;
        Ok(Rank {
            rank,
            ranks: n,
            global,
            total,
            group: self.group,
            file: self.file,
            slot,
            next,
            prev,
            store,
            served,
            _listeners: listeners,
        })
    }

    /// Joins the job as `rank` (in the forked rank process).
    pub fn join(self, rank: usize) -> Result<Rank> {
        if let Some(nodes) = self.nodes.clone() {
            return self.join_across(rank, nodes);
        }
        let n = self.ranks;
        let slot = (self.file.len() - HEADER) / n;
        let mut listeners = Vec::new();
        if rank == 0 {
            let l = TcpListener::bind(("::", self.store_port)).context("store listener")?;
            listeners.push(l);
        }
        let ring =
            listen_without_reuseaddr(std::net::Ipv4Addr::LOCALHOST).context("ring listener")?;
        let port = ring.local_addr()?.port();
        self.file.write_u32(rank * 4, port as u32);
        let store = connect(&format!("[::ffff:127.0.0.1]:{}", self.store_port))?;
        let served = match listeners.first() {
            Some(l) => (0..n)
                .map(|_| Ok(l.accept()?.0))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let next_port = wait_port(&self.file, (rank + 1) % n)?;
        let next = format!("127.0.0.1:{next_port}");
        let (next, prev) = join_ring(ring, &next, rank, &mut listeners)?;
        Ok(Rank {
            rank,
            ranks: n,
            global: rank,
            total: n,
            group: self.group,
            file: self.file,
            slot,
            next,
            prev,
            store,
            served,
            _listeners: listeners,
        })
    }
}

fn connect(addr: &str) -> Result<TcpStream> {
    let start = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(_) if start.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(e).with_context(|| format!("connecting {addr}")),
        }
    }
}

/// A listener on an ephemeral port of `ip` without SO_REUSEADDR (std's TcpListener sets it).
fn listen_without_reuseaddr(ip: std::net::Ipv4Addr) -> Result<TcpListener> {
    use rustix::net::{self, AddressFamily, SocketFlags, SocketType};
    let fd = net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    net::bind(&fd, &std::net::SocketAddrV4::new(ip, 0))?;
    net::listen(&fd, 16)?;
    Ok(TcpListener::from(fd))
}

/// The ring's two connections of rank `rank` (global): to the next rank at `next`, from the
/// one before, once the ring is bootstrapped; its listener is kept in `listeners`.
fn join_ring(
    ring: TcpListener,
    next: &str,
    rank: usize,
    listeners: &mut Vec<TcpListener>,
) -> Result<(TcpStream, TcpStream)> {
    bootstrap(&ring, next, rank)?;
    let next = connect(next)?;
    let prev = ring.accept()?.0;
    listeners.push(ring);
    for s in [&next, &prev] {
        s.set_read_timeout(Some(Duration::from_secs(600)))?;
    }
    Ok((next, prev))
}

/// NCCL's bootstrap in small: a connection to the next rank that tells it who we are, and one
/// from the previous rank that we read and close first (its end stays in TIME_WAIT on our port).
fn bootstrap(ring: &TcpListener, next: &str, rank: usize) -> Result<()> {
    let mut to_next = connect(next)?;
    to_next.write_all(&[rank as u8])?;
    let (mut from_prev, _) = ring.accept()?;
    from_prev.read_exact(&mut [0u8])?;
    drop(from_prev);
    // The next rank closes first; our end waits for that.
    if to_next.read(&mut [0u8])? != 0 {
        bail!("bootstrap: the next rank sent more than its rank");
    }
    Ok(())
}

/// The store's side (node 0's rank 0): every rank's hello, then the table of their ring
/// addresses to each of them.
fn serve_table(l: &TcpListener, total: usize) -> Result<Vec<TcpStream>> {
    let mut conns = Vec::new();
    let mut table = vec![None; total];
    for _ in 0..total {
        let (mut s, peer) = l.accept()?;
        let mut hello = [0u8; 6];
        s.read_exact(&mut hello)?;
        let g = u32::from_le_bytes(hello[..4].try_into().unwrap()) as usize;
        let port = u16::from_le_bytes(hello[4..].try_into().unwrap());
        let ip = match peer.ip() {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer.ip(), Into::into),
            ip => ip,
        };
        *table.get_mut(g).context("a rank beyond the job's")? =
            Some(std::net::SocketAddr::new(ip, port));
        conns.push(s);
    }
    let mut bytes = Vec::new();
    for a in table {
        let a = a.context("a rank never said hello")?;
        let line = format!("{a}\n");
        bytes.extend_from_slice(line.as_bytes());
    }
    for s in &mut conns {
        s.write_all(&bytes)?;
    }
    Ok(conns)
}

/// Every rank's ring address, from the store.
fn read_table(store: &mut TcpStream, total: usize) -> Result<Vec<std::net::SocketAddr>> {
    let mut text = Vec::new();
    let mut byte = [0u8; 1];
    while text.iter().filter(|b| **b == b'\n').count() < total {
        store.read_exact(&mut byte)?;
        text.push(byte[0]);
    }
    String::from_utf8(text)?
        .lines()
        .map(|l| Ok(l.parse()?))
        .collect()
}

fn wait_port(file: &SharedFile, rank: usize) -> Result<u16> {
    let start = Instant::now();
    loop {
        match file.read_u32(rank * 4) {
            0 if start.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            0 => bail!("rank {rank} never published its port"),
            p => return Ok(p as u16),
        }
    }
}

fn pattern(rank: usize, step: u64) -> u8 {
    (rank as u64 * 31 + step) as u8
}

impl Rank {
    fn slot_hash(&self, rank: usize) -> u64 {
        self.file
            .bytes(HEADER + rank * self.slot, self.slot)
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ *b as u64).wrapping_mul(0x1000_0000_01b3)
            })
    }

    /// One step of the job: write this rank's slot, pass the step round the ring, check the
    /// previous rank's message and slot. Returns a word for the log, or what is wrong.
    pub fn step(&mut self, step: u64) -> Result<()> {
        let (off, len) = (HEADER + self.rank * self.slot, self.slot);
        self.file.fill(off, len, pattern(self.rank, step));
        let mut msg = [0u8; 16];
        msg[..8].copy_from_slice(&step.to_le_bytes());
        msg[8..].copy_from_slice(&self.slot_hash(self.rank).to_le_bytes());
        self.next.write_all(&msg).context("ring send")?;
        self.store
            .write_all(&step.to_le_bytes())
            .context("store send")?;
        let mut got = [0u8; 16];
        self.prev.read_exact(&mut got).context("ring receive")?;
        let prev_global = (self.global + self.total - 1) % self.total;
        let prev = (self.rank + self.ranks - 1) % self.ranks;
        let their_step = u64::from_le_bytes(got[..8].try_into().unwrap());
        let their_hash = u64::from_le_bytes(got[8..].try_into().unwrap());
        if their_step != step {
            bail!("rank {prev_global} sent step {their_step}, this rank is at step {step}");
        }
        if their_hash == 0 {
            bail!("rank {prev_global} sent no hash");
        }
        // The previous rank's slot is in this node's file only if it runs on this node.
        if prev_global / self.ranks != self.global / self.ranks {
            return self.drain_store();
        }
        // The previous rank wrote its slot before it sent: the file must show that step, or a
        // later one (a rank can run ahead by less than a lap of the ring).
        let seen = self.file.bytes(HEADER + prev * self.slot, 1)[0];
        let ahead = (0..=self.ranks as u64).any(|a| seen == pattern(prev, step + a));
        if !ahead {
            bail!("rank {prev}'s part of the shared file holds {seen:#x} at step {step}");
        }
        self.drain_store()
    }

    /// The store's side reads what the ranks sent it (steps it does not check).
    fn drain_store(&mut self) -> Result<()> {
        let mut sink = [0u8; 4096];
        for s in &mut self.served {
            s.set_nonblocking(true)?;
            while let Ok(n) = s.read(&mut sink) {
                if n == 0 {
                    bail!("a rank closed its store connection");
                }
            }
            s.set_nonblocking(false)?;
        }
        Ok(())
    }
}
