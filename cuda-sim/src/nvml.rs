//! NVML, simulated: the GPU inventory and per-process GPU memory, answered by the GPU daemon.

use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use crate::proto::{self, DeviceDesc, Reply, Request};

/// `nvmlReturn_t` values used here.
pub mod ret {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const DRIVER_NOT_LOADED: u32 = 9;
    pub const UNKNOWN: u32 = 999;
}

pub fn error_string(r: u32) -> &'static str {
    match r {
        ret::SUCCESS => "Success\0",
        ret::UNINITIALIZED => "Uninitialized\0",
        ret::INVALID_ARGUMENT => "Invalid Argument\0",
        ret::NOT_SUPPORTED => "Not Supported\0",
        ret::INSUFFICIENT_SIZE => "Insufficient Size\0",
        ret::DRIVER_NOT_LOADED => "Driver Not Loaded\0",
        _ => "Unknown Error\0",
    }
}

struct Session {
    stream: UnixStream,
    devices: Vec<DeviceDesc>,
    driver_version: String,
}

static SESSION: Mutex<Option<Session>> = Mutex::new(None);

pub fn init() -> Result<(), u32> {
    let mut s = UnixStream::connect(proto::socket_path()).map_err(|_| ret::DRIVER_NOT_LOADED)?;
    Request::Hello { app: false }
        .send(&mut s)
        .map_err(|_| ret::UNKNOWN)?;
    match proto::recv_answer(&mut s).map_err(|_| ret::UNKNOWN)? {
        Ok(Reply::Hello {
            driver_version,
            devices,
        }) => {
            *SESSION.lock().unwrap() = Some(Session {
                stream: s,
                devices,
                driver_version,
            });
            Ok(())
        }
        _ => Err(ret::UNKNOWN),
    }
}

pub fn shutdown() {
    *SESSION.lock().unwrap() = None;
}

fn with<T>(f: impl FnOnce(&mut Session) -> Result<T, u32>) -> Result<T, u32> {
    let mut g = SESSION.lock().unwrap();
    f(g.as_mut().ok_or(ret::UNINITIALIZED)?)
}

pub fn driver_version() -> Result<String, u32> {
    with(|s| Ok(s.driver_version.clone()))
}

pub fn device(index: u32) -> Result<DeviceDesc, u32> {
    with(|s| {
        s.devices
            .get(index as usize)
            .cloned()
            .ok_or(ret::INVALID_ARGUMENT)
    })
}

pub fn device_count() -> Result<u32, u32> {
    with(|s| Ok(s.devices.len() as u32))
}

fn query(req: Request) -> Result<Reply, u32> {
    with(|s| {
        req.send(&mut s.stream).map_err(|_| ret::UNKNOWN)?;
        proto::recv_answer(&mut s.stream)
            .map_err(|_| ret::UNKNOWN)?
            .map_err(|_| ret::INVALID_ARGUMENT)
    })
}

/// (free, total, used) in bytes.
pub fn memory(index: u32) -> Result<(u64, u64, u64), u32> {
    match query(Request::MemInfo { device: index })? {
        Reply::MemInfo { free, total } => Ok((free, total, total - free)),
        _ => Err(ret::UNKNOWN),
    }
}

/// (pid, used bytes) of processes holding memory on the device.
pub fn processes(index: u32) -> Result<Vec<(u32, u64)>, u32> {
    match query(Request::Processes { device: index })? {
        Reply::Processes(list) => Ok(list),
        _ => Err(ret::UNKNOWN),
    }
}
