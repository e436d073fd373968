//! The wire protocol between the simulated driver (in each CUDA process) and the simulated
//! GPU daemon, over a unix stream socket: length-prefixed little-endian frames. A request is an
//! op byte and its fields; a reply is a `CUresult` and its fields. Replies come in request order,
//! which is how asynchronous work (a "kernel") completes later than it was submitted.

use std::io::{self, Read, Write};

/// Default socket of the daemon, like the device nodes of a real driver.
pub const DEFAULT_SOCKET: &str = "/run/cuda-sim/gpud.sock";
/// The variable that overrides the socket path (for processes and controllers; read through
/// [`crate::config::var`]).
pub const SOCKET_ENV: &str = "CUDA_SIM_SOCKET";
/// Frames larger than this are refused (a corrupt or hostile peer).
pub const MAX_FRAME: usize = 64 << 20;
/// Bulk copies are split into chunks of this size.
pub const CHUNK: usize = 8 << 20;

pub fn socket_path() -> String {
    crate::config::var(SOCKET_ENV).unwrap_or_else(|| DEFAULT_SOCKET.to_owned())
}

/// One simulated GPU as the daemon describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceDesc {
    pub uuid: [u8; 16],
    pub name: String,
    pub total_memory: u64,
    /// The N of the GPU's device node /dev/nvidiaN, as NVML reports it; `None`: the simulated
    /// machine has no device nodes (NVML answers "not supported").
    pub minor: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// First message of every connection; `app` connections own device memory.
    Hello {
        app: bool,
    },
    Alloc {
        device: u32,
        dptr: u64,
        size: u64,
    },
    Free {
        dptr: u64,
    },
    Write {
        dptr: u64,
        offset: u64,
        data: Vec<u8>,
    },
    Read {
        dptr: u64,
        offset: u64,
        len: u64,
    },
    Memset32 {
        dptr: u64,
        offset: u64,
        count: u64,
        value: u32,
    },
    /// Keeps the device busy, like a long kernel.
    Busy {
        ms: u32,
    },
    /// A collective kernel of a job (NCCL's all_reduce, in small): it computes for `ms`, then
    /// waits on the device until the `ranks` members of `group` have each launched step `seq`.
    Collective {
        group: u64,
        seq: u64,
        ranks: u32,
        ms: u32,
    },
    MemInfo {
        device: u32,
    },
    Processes {
        device: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Hello {
        driver_version: String,
        devices: Vec<DeviceDesc>,
    },
    Done,
    Data(Vec<u8>),
    MemInfo {
        free: u64,
        total: u64,
    },
    Processes(Vec<(u32, u64)>),
}

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(self, v: &[u8]) -> Self {
        let mut s = self.u64(v.len() as u64);
        s.0.extend_from_slice(v);
        s
    }
}

struct Dec<'a>(&'a [u8]);

fn short() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "truncated frame")
}

impl Dec<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(short());
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let n = self.u64()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

fn write_frame(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
    w.write_all(&(body.len() as u32).to_le_bytes())?;
    w.write_all(body)
}

fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(body)
}

impl Request {
    pub fn send(&self, w: &mut impl Write) -> io::Result<()> {
        let e = match self {
            Request::Hello { app } => Enc::default().u8(0).u8(*app as u8),
            Request::Alloc { device, dptr, size } => {
                Enc::default().u8(1).u32(*device).u64(*dptr).u64(*size)
            }
            Request::Free { dptr } => Enc::default().u8(2).u64(*dptr),
            Request::Write { dptr, offset, data } => {
                Enc::default().u8(3).u64(*dptr).u64(*offset).bytes(data)
            }
            Request::Read { dptr, offset, len } => {
                Enc::default().u8(4).u64(*dptr).u64(*offset).u64(*len)
            }
            Request::Memset32 {
                dptr,
                offset,
                count,
                value,
            } => Enc::default()
                .u8(5)
                .u64(*dptr)
                .u64(*offset)
                .u64(*count)
                .u32(*value),
            Request::Busy { ms } => Enc::default().u8(6).u32(*ms),
            Request::MemInfo { device } => Enc::default().u8(7).u32(*device),
            Request::Processes { device } => Enc::default().u8(8).u32(*device),
            Request::Collective {
                group,
                seq,
                ranks,
                ms,
            } => Enc::default()
                .u8(9)
                .u64(*group)
                .u64(*seq)
                .u32(*ranks)
                .u32(*ms),
        };
        write_frame(w, &e.0)
    }

    pub fn recv(r: &mut impl Read) -> io::Result<Request> {
        let body = read_frame(r)?;
        let mut d = Dec(&body);
        Ok(match d.u8()? {
            0 => Request::Hello { app: d.u8()? != 0 },
            1 => Request::Alloc {
                device: d.u32()?,
                dptr: d.u64()?,
                size: d.u64()?,
            },
            2 => Request::Free { dptr: d.u64()? },
            3 => Request::Write {
                dptr: d.u64()?,
                offset: d.u64()?,
                data: d.bytes()?,
            },
            4 => Request::Read {
                dptr: d.u64()?,
                offset: d.u64()?,
                len: d.u64()?,
            },
            5 => Request::Memset32 {
                dptr: d.u64()?,
                offset: d.u64()?,
                count: d.u64()?,
                value: d.u32()?,
            },
            6 => Request::Busy { ms: d.u32()? },
            7 => Request::MemInfo { device: d.u32()? },
            8 => Request::Processes { device: d.u32()? },
            9 => Request::Collective {
                group: d.u64()?,
                seq: d.u64()?,
                ranks: d.u32()?,
                ms: d.u32()?,
            },
            op => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown op {op}"),
                ))
            }
        })
    }
}

/// Sends `Write { dptr, offset, data }` without copying `data` into a frame first.
pub fn send_write(w: &mut impl Write, dptr: u64, offset: u64, data: &[u8]) -> io::Result<()> {
    let head = Enc::default()
        .u8(3)
        .u64(dptr)
        .u64(offset)
        .u64(data.len() as u64);
    w.write_all(&((head.0.len() + data.len()) as u32).to_le_bytes())?;
    w.write_all(&head.0)?;
    w.write_all(data)
}

/// Receives the answer to a `Read` of `dst.len()` bytes straight into `dst`.
pub fn recv_data_into(r: &mut impl Read, dst: &mut [u8]) -> io::Result<Result<(), u32>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad data reply");
    let mut word = [0u8; 4];
    r.read_exact(&mut word)?;
    let len = u32::from_le_bytes(word) as usize;
    if !(4..=MAX_FRAME).contains(&len) {
        return Err(bad());
    }
    r.read_exact(&mut word)?;
    let code = u32::from_le_bytes(word);
    if code != 0 {
        io::copy(&mut r.take(len as u64 - 4), &mut io::sink())?;
        return Ok(Err(code));
    }
    let mut head = [0u8; 9];
    r.read_exact(&mut head)?;
    let n = u64::from_le_bytes(head[1..].try_into().unwrap()) as usize;
    if head[0] != 2 || n != dst.len() || len != 4 + 9 + n {
        return Err(bad());
    }
    r.read_exact(dst)?;
    Ok(Ok(()))
}

/// A reply on the wire: `Ok` carries the payload, `Err` a `CUresult`.
pub type Answer = Result<Reply, u32>;

pub fn send_answer(w: &mut impl Write, answer: &Answer) -> io::Result<()> {
    let e = match answer {
        Err(code) => Enc::default().u32(*code),
        Ok(Reply::Hello {
            driver_version,
            devices,
        }) => {
            let mut e = Enc::default()
                .u32(0)
                .u8(0)
                .bytes(driver_version.as_bytes())
                .u32(devices.len() as u32);
            for d in devices {
                e = e
                    .bytes(&d.uuid)
                    .bytes(d.name.as_bytes())
                    .u64(d.total_memory);
            }
            // The device nodes after the list, so that a reader built before them still reads
            // the rest.
            e = e.u8(1);
            for d in devices {
                e = e.u32(d.minor.unwrap_or(u32::MAX));
            }
            e
        }
        Ok(Reply::Done) => Enc::default().u32(0).u8(1),
        Ok(Reply::Data(data)) => Enc::default().u32(0).u8(2).bytes(data),
        Ok(Reply::MemInfo { free, total }) => Enc::default().u32(0).u8(3).u64(*free).u64(*total),
        Ok(Reply::Processes(list)) => {
            let mut e = Enc::default().u32(0).u8(4).u32(list.len() as u32);
            for (pid, used) in list {
                e = e.u32(*pid).u64(*used);
            }
            e
        }
    };
    write_frame(w, &e.0)
}

pub fn recv_answer(r: &mut impl Read) -> io::Result<Answer> {
    let body = read_frame(r)?;
    let mut d = Dec(&body);
    let code = d.u32()?;
    if code != 0 {
        return Ok(Err(code));
    }
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad reply");
    Ok(Ok(match d.u8()? {
        0 => {
            let driver_version = String::from_utf8(d.bytes()?).map_err(|_| bad())?;
            let n = d.u32()?;
            let mut devices = Vec::new();
            for _ in 0..n {
                let uuid: [u8; 16] = d.bytes()?.try_into().map_err(|_| bad())?;
                let name = String::from_utf8(d.bytes()?).map_err(|_| bad())?;
                devices.push(DeviceDesc {
                    uuid,
                    name,
                    total_memory: d.u64()?,
                    minor: None,
                });
            }
            // A daemon built before device nodes sends none.
            if d.0.first() == Some(&1) {
                d.u8()?;
                for dev in &mut devices {
                    dev.minor = Some(d.u32()?).filter(|m| *m != u32::MAX);
                }
            }
            Reply::Hello {
                driver_version,
                devices,
            }
        }
        1 => Reply::Done,
        2 => Reply::Data(d.bytes()?),
        3 => Reply::MemInfo {
            free: d.u64()?,
            total: d.u64()?,
        },
        4 => {
            let n = d.u32()?;
            let mut list = Vec::new();
            for _ in 0..n {
                list.push((d.u32()?, d.u64()?));
            }
            Reply::Processes(list)
        }
        _ => return Err(bad()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let all = [
            Request::Hello { app: true },
            Request::Alloc {
                device: 1,
                dptr: 0x7000_0000_0000,
                size: 4096,
            },
            Request::Free { dptr: 9 },
            Request::Write {
                dptr: 1,
                offset: 2,
                data: vec![1, 2, 3],
            },
            Request::Read {
                dptr: 1,
                offset: 2,
                len: 3,
            },
            Request::Memset32 {
                dptr: 1,
                offset: 0,
                count: 8,
                value: 0xdead_beef,
            },
            Request::Busy { ms: 5 },
            Request::Collective {
                group: 7,
                seq: 1 << 40,
                ranks: 2,
                ms: 3,
            },
            Request::MemInfo { device: 0 },
            Request::Processes { device: 0 },
        ];
        for req in all {
            let mut buf = Vec::new();
            req.send(&mut buf).unwrap();
            assert_eq!(Request::recv(&mut buf.as_slice()).unwrap(), req);
        }
    }

    #[test]
    fn answers_round_trip() {
        let all: Vec<Answer> = vec![
            Err(2),
            Ok(Reply::Hello {
                driver_version: "580.00-sim".into(),
                devices: vec![DeviceDesc {
                    uuid: [7; 16],
                    name: "Sim".into(),
                    total_memory: 1 << 30,
                    minor: None,
                }],
            }),
            Ok(Reply::Hello {
                driver_version: "580.00-sim".into(),
                devices: vec![
                    DeviceDesc {
                        uuid: [7; 16],
                        name: "Sim".into(),
                        total_memory: 1 << 30,
                        minor: Some(0),
                    },
                    DeviceDesc {
                        uuid: [8; 16],
                        name: "Sim".into(),
                        total_memory: 1 << 30,
                        minor: Some(1),
                    },
                ],
            }),
            Ok(Reply::Done),
            Ok(Reply::Data(vec![9; 10])),
            Ok(Reply::MemInfo { free: 1, total: 2 }),
            Ok(Reply::Processes(vec![(42, 4096)])),
        ];
        for a in all {
            let mut buf = Vec::new();
            send_answer(&mut buf, &a).unwrap();
            assert_eq!(recv_answer(&mut buf.as_slice()).unwrap(), a);
        }
    }

    #[test]
    fn bulk_helpers_match_the_framed_forms() {
        let mut a = Vec::new();
        send_write(&mut a, 1, 2, &[5, 6, 7]).unwrap();
        let mut b = Vec::new();
        Request::Write {
            dptr: 1,
            offset: 2,
            data: vec![5, 6, 7],
        }
        .send(&mut b)
        .unwrap();
        assert_eq!(a, b);
        let mut buf = Vec::new();
        send_answer(&mut buf, &Ok(Reply::Data(vec![1, 2, 3]))).unwrap();
        let mut dst = [0u8; 3];
        assert_eq!(
            recv_data_into(&mut buf.as_slice(), &mut dst).unwrap(),
            Ok(())
        );
        assert_eq!(dst, [1, 2, 3]);
        let mut buf = Vec::new();
        send_answer(&mut buf, &Err(2)).unwrap();
        assert_eq!(
            recv_data_into(&mut buf.as_slice(), &mut dst).unwrap(),
            Err(2)
        );
    }

    #[test]
    fn oversized_and_truncated_frames_are_refused() {
        let mut buf = (MAX_FRAME as u32 + 1).to_le_bytes().to_vec();
        buf.extend_from_slice(&[0; 8]);
        assert!(Request::recv(&mut buf.as_slice()).is_err());
        let mut buf = Vec::new();
        write_frame(&mut buf, &[1, 0, 0]).unwrap();
        assert!(Request::recv(&mut buf.as_slice()).is_err());
    }
}
