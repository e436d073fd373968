//! TCP sockets as the kernel lists them (`/proc/PID/net/tcp` and `tcp6`, the network namespace
//! of that process), matched with the socket inodes a process holds.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The TCP states that matter to a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpState {
    Established,
    Listen,
    /// Any other state (closing, time-wait, a bound socket never connected...).
    Other(u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSocket {
    pub inode: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: TcpState,
}

/// The TCP sockets of the network namespace `pid` is in.
pub fn tcp_sockets(pid: i32) -> Vec<TcpSocket> {
    let mut out = Vec::new();
    for file in ["tcp", "tcp6"] {
        if let Ok(text) = fs::read_to_string(format!("/proc/{pid}/net/{file}")) {
            out.extend(text.lines().skip(1).filter_map(parse_line));
        }
    }
    out
}

fn parse_line(line: &str) -> Option<TcpSocket> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let state = match u8::from_str_radix(f.get(3)?, 16).ok()? {
        1 => TcpState::Established,
        10 => TcpState::Listen,
        s => TcpState::Other(s),
    };
    Some(TcpSocket {
        local: addr(f.get(1)?)?,
        remote: addr(f.get(2)?)?,
        state,
        inode: f.get(9)?.parse().ok()?,
    })
}

/// "0100007F:1F90" (IPv4) or 32 hex digits then the port (IPv6), as the kernel prints them:
/// each 32-bit word in host (little-endian) order.
fn addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).map(u32::swap_bytes))
        .collect::<Result<_, _>>()
        .ok()?;
    let ip = match words.as_slice() {
        [w] => IpAddr::V4(Ipv4Addr::from(*w)),
        [a, b, c, d] => {
            let mut bytes = [0u8; 16];
            for (i, w) in [a, b, c, d].iter().enumerate() {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernels_lines() {
        let v4 = "   1: 0100007F:6D7C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     \
                  0        0 877905 1 00000000feabc712 100 0 0 10 0";
        let s = parse_line(v4).unwrap();
        assert_eq!(s.local, "127.0.0.1:28028".parse().unwrap());
        assert_eq!(s.state, TcpState::Listen);
        assert_eq!(s.inode, 877905);
        let v6 = "   3: 0000000000000000FFFF00000100007F:73B6 0000000000000000FFFF00000100007F:\
                  DFB0 01 00000000:00000000 00:00000000 00000000     0        0 22902 1 \
                  000000005e3df995 20 4 0 18 -1";
        let s = parse_line(v6).unwrap();
        assert_eq!(s.local, "[::ffff:127.0.0.1]:29622".parse().unwrap());
        assert_eq!(s.remote.port(), 0xDFB0);
        assert_eq!(s.state, TcpState::Established);
    }

    #[test]
    fn finds_a_listener_of_this_process() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        let inodes = super::super::socket_inodes(me);
        assert!(tcp_sockets(me).iter().any(|s| s.local.port() == port
            && s.state == TcpState::Listen
            && inodes.contains(&s.inode)));
    }
}
