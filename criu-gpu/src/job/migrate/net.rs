//! The two TCP connections of a move: how they are made, and what bounds every wait on them.
//! The pages connection is handed to CRIU on both sides (`--ps-socket`), so its bounds are set
//! here, as socket options CRIU keeps: a connection whose peer stops answering (its machine
//! gone, the link cut) fails within [`STALL`] instead of leaving CRIU waiting for ever.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use rustix::net::sockopt;

/// How long a connection may carry nothing its peer acknowledges, or answer no keep-alive,
/// before it fails: CRIU's page server and lazy-pages daemon then fail too, and the sender's
/// tree resumes.
pub const STALL: Duration = Duration::from_secs(10);

/// `HOST:PORT` (or `[V6]:PORT`), as `--to` gives it.
pub fn resolve(to: &str) -> Result<SocketAddr, String> {
    to.to_socket_addrs()
        .map_err(|e| format!("{to}: {e} (expected HOST:PORT)"))?
        .next()
        .ok_or_else(|| format!("{to}: no address"))
}

/// `[ADDR:]PORT`, as `--listen` gives it: all addresses when only the port is given.
pub fn listen_addr(listen: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = listen.parse::<u16>() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    resolve(listen)
}

/// Connects within `limit`, with the stall bounds set.
pub fn connect(to: SocketAddr, limit: Duration) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&to, limit)?;
    bound(&s)?;
    Ok(s)
}

/// The next connection to `l`, waiting at most until `deadline`.
pub fn accept(l: &TcpListener, deadline: Instant) -> std::io::Result<TcpStream> {
    l.set_nonblocking(true)?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                bound(&s)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "nobody connected",
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Keep-alives and a limit on unacknowledged data, so that a silent peer fails the connection
/// within [`STALL`] whoever waits on it (criu-gpu or CRIU); no Nagle delay on the few small
/// messages either side waits for.
fn bound(s: &TcpStream) -> std::io::Result<()> {
    let fd = s.as_fd();
    let secs = STALL.as_secs() as u32;
    sockopt::set_socket_keepalive(fd, true)?;
    sockopt::set_tcp_keepidle(fd, Duration::from_secs(2))?;
    sockopt::set_tcp_keepintvl(fd, Duration::from_secs(2))?;
    sockopt::set_tcp_keepcnt(fd, secs / 2)?;
    sockopt::set_tcp_user_timeout(fd, secs * 1000)?;
    s.set_nodelay(true)
}

/// Lets a child (CRIU) inherit `s`; returns the number it has there.
pub fn inheritable(s: &TcpStream) -> std::io::Result<i32> {
    rustix::io::fcntl_setfd(s.as_fd(), rustix::io::FdFlags::empty())?;
    Ok(s.as_raw_fd())
}

/// Waits on the control connection's reads for at most `limit` (`None`: the stall bound only).
pub fn read_limit(s: &TcpStream, limit: Option<Duration>) -> std::io::Result<()> {
    s.set_read_timeout(limit)
}
