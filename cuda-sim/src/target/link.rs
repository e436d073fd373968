//! The connection to the GPU daemon, the simulated device file: synchronous calls, submitted
//! asynchronous work ("kernels") and its sticky errors.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::CuResult;
use crate::errors::code;
use crate::proto::{self, DeviceDesc, Reply, Request};

/// The connection to the GPU daemon: the "device file".
#[derive(Default)]
pub(super) struct Link {
    pub(super) stream: Option<UnixStream>,
    /// Submitted asynchronous work not yet completed.
    pending: usize,
    /// First error of asynchronous work, reported by the next synchronising call.
    sticky: u32,
}

pub(super) fn lost(_: std::io::Error) -> u32 {
    code::UNKNOWN
}

impl Link {
    pub(super) fn connected(stream: UnixStream) -> Link {
        Link {
            stream: Some(stream),
            ..Link::default()
        }
    }

    pub(super) fn stream(&mut self) -> CuResult<&mut UnixStream> {
        self.stream.as_mut().ok_or(code::NOT_INITIALIZED)
    }

    /// Waits for submitted work, until `deadline`; CUDA_ERROR_NOT_READY if it is still running
    /// then (what a lock that gives up answers, F1).
    pub(super) fn drain(&mut self, deadline: Option<Instant>) -> CuResult<()> {
        while self.pending > 0 {
            let s = self.stream()?;
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                let ts = rustix::time::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: left.subsec_nanos() as i64,
                };
                let mut fds = [rustix::event::PollFd::new(
                    &*s,
                    rustix::event::PollFlags::IN,
                )];
                if rustix::event::poll(&mut fds, Some(&ts)).map_err(|_| code::UNKNOWN)? == 0 {
                    return Err(code::NOT_READY);
                }
            }
            let answer = proto::recv_answer(s).map_err(lost)?;
            self.pending -= 1;
            if let Err(c) = answer {
                if self.sticky == 0 {
                    self.sticky = c;
                }
            }
        }
        match std::mem::take(&mut self.sticky) {
            0 => Ok(()),
            c => Err(c),
        }
    }

    pub(super) fn call(&mut self, req: &Request) -> CuResult<Reply> {
        self.drain(None)?;
        let s = self.stream()?;
        req.send(s).and_then(|()| s.flush()).map_err(lost)?;
        proto::recv_answer(s).map_err(lost)?
    }

    pub(super) fn submit(&mut self, req: &Request) -> CuResult<()> {
        let s = self.stream()?;
        req.send(s).map_err(lost)?;
        self.pending += 1;
        Ok(())
    }

    pub(super) fn write(&mut self, dptr: u64, offset: u64, data: &[u8]) -> CuResult<()> {
        self.drain(None)?;
        let s = self.stream()?;
        proto::send_write(s, dptr, offset, data).map_err(lost)?;
        proto::recv_answer(s).map_err(lost)?.map(|_| ())
    }

    pub(super) fn read(&mut self, dptr: u64, offset: u64, dst: &mut [u8]) -> CuResult<()> {
        self.drain(None)?;
        let s = self.stream()?;
        Request::Read {
            dptr,
            offset,
            len: dst.len() as u64,
        }
        .send(s)
        .map_err(lost)?;
        proto::recv_data_into(s, dst).map_err(lost)?
    }
}

pub(super) fn connect(socket: &str) -> CuResult<(UnixStream, Vec<DeviceDesc>)> {
    let mut s = UnixStream::connect(socket).map_err(|_| code::NO_DEVICE)?;
    Request::Hello { app: true }.send(&mut s).map_err(lost)?;
    match proto::recv_answer(&mut s).map_err(lost)?? {
        Reply::Hello { devices, .. } if !devices.is_empty() => Ok((s, devices)),
        _ => Err(code::NO_DEVICE),
    }
}
