//! The simulated GPU: a daemon that owns "device memory" and runs "kernels" for the processes
//! connected to it. Device memory lives here, outside the application, exactly as real device
//! memory lives on the GPU: CRIU cannot dump it, and refuses the connection to it ("External
//! socket is used"), until the driver has copied it into the process and let go of the device.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::collective::{Rendezvous, PEER_WAIT};
use crate::errors::code;
use crate::proto::{self, Answer, DeviceDesc, Reply, Request};

/// One GPU of the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSpec {
    pub name: String,
    pub memory: u64,
    pub uuid: [u8; 16],
}

#[derive(Debug, Clone)]
pub struct Config {
    pub socket: PathBuf,
    pub gpus: Vec<GpuSpec>,
    pub driver_version: String,
    /// The GPUs have device nodes /dev/nvidiaN, N their index (NVML reports the minor numbers).
    pub device_nodes: bool,
}

/// Parses `512MiB`, `4GiB`, `2G`, `1048576`.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// A stable UUID for GPU `index` of the machine named by `seed` (splitmix64 of the pair).
pub fn derive_uuid(seed: &str, index: u32) -> [u8; 16] {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in seed.bytes().chain(index.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x1000_0000_01b3);
    }
    let mut out = [0u8; 16];
    for chunk in out.chunks_exact_mut(8) {
        h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = h;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out[6] = (out[6] & 0x0f) | 0x40; // version 4 layout, as NVIDIA's UUIDs have
    out[8] = (out[8] & 0x3f) | 0x80;
    out
}

struct Client {
    pid: u32,
    used: Vec<u64>,
}

struct State {
    used: Vec<u64>,
    clients: HashMap<u64, Client>,
    next_client: u64,
}

struct Daemon {
    devices: Vec<DeviceDesc>,
    driver_version: String,
    state: Mutex<State>,
    collectives: Rendezvous,
}

/// Serves until the listener fails; each connection gets a thread.
pub fn serve(cfg: Config) -> io::Result<()> {
    if let Some(dir) = cfg.socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(&cfg.socket);
    let listener = UnixListener::bind(&cfg.socket)?;
    // Any user's CUDA process may use the GPU, as with /dev/nvidia* (mode 0666).
    std::fs::set_permissions(
        &cfg.socket,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )?;
    let daemon = Arc::new(Daemon {
        devices: cfg
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| DeviceDesc {
                uuid: g.uuid,
                name: g.name.clone(),
                total_memory: g.memory,
                minor: cfg.device_nodes.then_some(i as u32),
            })
            .collect(),
        driver_version: cfg.driver_version.clone(),
        state: Mutex::new(State {
            used: vec![0; cfg.gpus.len()],
            clients: HashMap::new(),
            next_client: 1,
        }),
        collectives: Rendezvous::default(),
    });
    eprintln!(
        "cuda-sim-gpud: {} GPU(s) on {}",
        daemon.devices.len(),
        cfg.socket.display()
    );
    for conn in listener.incoming() {
        let conn = conn?;
        let d = daemon.clone();
        std::thread::spawn(move || d.session(conn));
    }
    Ok(())
}

/// The other end of a session hung up: its process ended (or let go of the device).
fn peer_gone(conn: &UnixStream) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fd = [PollFd::new(conn, PollFlags::RDHUP | PollFlags::HUP)];
    let now = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fd, Some(&now)), Ok(n) if n > 0)
}

impl Daemon {
    fn session(&self, conn: UnixStream) {
        let pid = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
            .map(|c| c.pid() as u32)
            .unwrap_or(0);
        let id = {
            let mut st = self.state.lock().unwrap();
            let id = st.next_client;
            st.next_client += 1;
            id
        };
        let mut allocs: HashMap<u64, (u32, Vec<u8>)> = HashMap::new();
        let mut reader = BufReader::new(&conn);
        let mut writer = BufWriter::new(&conn);
        let mut registered = false;
        while let Ok(req) = Request::recv(&mut reader) {
            if let Request::Hello { app: true } = req {
                if !registered {
                    registered = true;
                    self.state.lock().unwrap().clients.insert(
                        id,
                        Client {
                            pid,
                            used: vec![0; self.devices.len()],
                        },
                    );
                }
            }
            let answer = self.handle(id, &mut allocs, req, || peer_gone(&conn));
            if proto::send_answer(&mut writer, &answer)
                .and_then(|()| writer.flush())
                .is_err()
            {
                break;
            }
        }
        // The process let go of the device (or died): its device memory is gone.
        let mut st = self.state.lock().unwrap();
        for (dev, buf) in allocs.values() {
            st.used[*dev as usize] -= buf.len() as u64;
        }
        st.clients.remove(&id);
    }

    /// `gone`: the process that asked has ended (it closed its end of the session).
    fn handle(
        &self,
        id: u64,
        allocs: &mut Allocs,
        req: Request,
        gone: impl Fn() -> bool,
    ) -> Answer {
        match req {
            Request::Hello { .. } => Ok(Reply::Hello {
                driver_version: self.driver_version.clone(),
                devices: self.devices.clone(),
            }),
            Request::Alloc { device, dptr, size } => self.alloc(id, allocs, device, dptr, size),
            Request::Free { dptr } => self.free(id, allocs, dptr),
            Request::Write { dptr, offset, data } => {
                let (a, b) = range(allocs, dptr, offset, data.len() as u64)?;
                buffer(allocs, dptr)?[a..b].copy_from_slice(&data);
                Ok(Reply::Done)
            }
            Request::Read { dptr, offset, len } => {
                let (a, b) = range(allocs, dptr, offset, len)?;
                Ok(Reply::Data(buffer(allocs, dptr)?[a..b].to_vec()))
            }
            Request::Memset32 {
                dptr,
                offset,
                count,
                value,
            } => {
                let (a, b) = range(allocs, dptr, offset, count.saturating_mul(4))?;
                for word in buffer(allocs, dptr)?[a..b].chunks_exact_mut(4) {
                    word.copy_from_slice(&value.to_le_bytes());
                }
                Ok(Reply::Done)
            }
            Request::Busy { ms } => {
                std::thread::sleep(Duration::from_millis(ms as u64));
                Ok(Reply::Done)
            }
            Request::Collective {
                group,
                seq,
                ranks,
                ms,
            } => {
                std::thread::sleep(Duration::from_millis(ms as u64));
                if self.collectives.meet(group, seq, ranks, PEER_WAIT, gone) {
                    Ok(Reply::Done)
                } else {
                    Err(code::UNKNOWN)
                }
            }
            Request::MemInfo { device } => self.mem_info(device),
            Request::Processes { device } => self.processes(device),
        }
    }

    fn alloc(&self, id: u64, allocs: &mut Allocs, device: u32, dptr: u64, size: u64) -> Answer {
        let dev = self
            .devices
            .get(device as usize)
            .ok_or(code::INVALID_DEVICE)?;
        if size == 0 || allocs.contains_key(&dptr) {
            return Err(code::INVALID_VALUE);
        }
        let mut st = self.state.lock().unwrap();
        if st.used[device as usize] + size > dev.total_memory {
            return Err(code::OUT_OF_MEMORY);
        }
        let mut buf = Vec::new();
        buf.try_reserve_exact(size as usize)
            .map_err(|_| code::OUT_OF_MEMORY)?;
        buf.resize(size as usize, 0);
        st.used[device as usize] += size;
        if let Some(c) = st.clients.get_mut(&id) {
            c.used[device as usize] += size;
        }
        allocs.insert(dptr, (device, buf));
        Ok(Reply::Done)
    }

    fn free(&self, id: u64, allocs: &mut Allocs, dptr: u64) -> Answer {
        let (dev, buf) = allocs.remove(&dptr).ok_or(code::INVALID_VALUE)?;
        let mut st = self.state.lock().unwrap();
        st.used[dev as usize] -= buf.len() as u64;
        if let Some(c) = st.clients.get_mut(&id) {
            c.used[dev as usize] -= buf.len() as u64;
        }
        Ok(Reply::Done)
    }

    fn mem_info(&self, device: u32) -> Answer {
        let dev = self
            .devices
            .get(device as usize)
            .ok_or(code::INVALID_DEVICE)?;
        let used = self.state.lock().unwrap().used[device as usize];
        Ok(Reply::MemInfo {
            free: dev.total_memory - used,
            total: dev.total_memory,
        })
    }

    fn processes(&self, device: u32) -> Answer {
        self.devices
            .get(device as usize)
            .ok_or(code::INVALID_DEVICE)?;
        let st = self.state.lock().unwrap();
        let mut list: Vec<(u32, u64)> = st
            .clients
            .values()
            .filter(|c| c.used[device as usize] > 0)
            .map(|c| (c.pid, c.used[device as usize]))
            .collect();
        list.sort_unstable();
        Ok(Reply::Processes(list))
    }
}

/// Whether a daemon answers on `socket`.
pub fn is_running(socket: &Path) -> bool {
    UnixStream::connect(socket).is_ok()
}

/// A client's device allocations: device pointer to (device, bytes).
type Allocs = HashMap<u64, (u32, Vec<u8>)>;

/// The byte range `off..off+len` of allocation `dptr`, if it lies inside it.
fn range(allocs: &Allocs, dptr: u64, off: u64, len: u64) -> Result<(usize, usize), u32> {
    let (_, buf) = allocs.get(&dptr).ok_or(code::INVALID_VALUE)?;
    let end = off.checked_add(len).ok_or(code::INVALID_VALUE)?;
    if end > buf.len() as u64 {
        return Err(code::INVALID_VALUE);
    }
    Ok((off as usize, end as usize))
}

fn buffer(allocs: &mut Allocs, dptr: u64) -> Result<&mut Vec<u8>, u32> {
    allocs
        .get_mut(&dptr)
        .map(|(_, b)| b)
        .ok_or(code::INVALID_VALUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("4X"), None);
    }

    #[test]
    fn uuids_depend_on_machine_and_index() {
        assert_eq!(derive_uuid("a", 0), derive_uuid("a", 0));
        assert_ne!(derive_uuid("a", 0), derive_uuid("a", 1));
        assert_ne!(derive_uuid("a", 0), derive_uuid("b", 0));
    }

    #[test]
    fn memory_is_accounted_and_freed_on_disconnect() {
        let dir = std::env::temp_dir().join(format!("gpud-test-{}", std::process::id()));
        let socket = dir.join("s.sock");
        let cfg = Config {
            socket: socket.clone(),
            gpus: vec![GpuSpec {
                name: "t".into(),
                memory: 1 << 20,
                uuid: [1; 16],
            }],
            driver_version: "x".into(),
            device_nodes: true,
        };
        std::thread::spawn(move || serve(cfg));
        let connect = || loop {
            if let Ok(s) = UnixStream::connect(&socket) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let call = |s: &mut UnixStream, r: Request| {
            r.send(s).unwrap();
            proto::recv_answer(s).unwrap()
        };
        let mut app = connect();
        match call(&mut app, Request::Hello { app: true }) {
            Ok(Reply::Hello { devices, .. }) => {
                assert_eq!(devices[0].minor, Some(0), "--device-nodes: /dev/nvidia0")
            }
            other => panic!("{other:?}"),
        }
        let alloc = |size| Request::Alloc {
            device: 0,
            dptr: 64,
            size,
        };
        assert_eq!(call(&mut app, alloc(2 << 20)), Err(code::OUT_OF_MEMORY));
        call(&mut app, alloc(1 << 19)).unwrap();
        let mut obs = connect();
        assert_eq!(
            call(&mut obs, Request::MemInfo { device: 0 }),
            Ok(Reply::MemInfo {
                free: 1 << 19,
                total: 1 << 20
            })
        );
        match call(&mut obs, Request::Processes { device: 0 }) {
            Ok(Reply::Processes(list)) => {
                assert_eq!(list, vec![(std::process::id(), 1 << 19)])
            }
            other => panic!("{other:?}"),
        }
        drop(app);
        for _ in 0..100 {
            if call(&mut obs, Request::MemInfo { device: 0 })
                == Ok(Reply::MemInfo {
                    free: 1 << 20,
                    total: 1 << 20,
                })
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("memory not freed after disconnect");
    }
}
