//! A remote shell between the nodes of a bed, as ssh is between machines, for launchers that
//! start their daemons on the other nodes through one (Open MPI's `plm_rsh_agent`): `netbed rshd
//! DIR NODE PORT` serves in NODE, and runs each command it is sent in a session of its own
//! there, its standard input and output the connection itself; `netbed rsh HOST:PORT CMD...`
//! sends CMD and relays its own standard input and output over the connection. So the daemon
//! started on the other node is a process of that node (not a child of the launcher), and the
//! connection between the launcher's side and it is an ordinary TCP connection between the
//! nodes: each node's part of the job holds one end.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};

/// Serves on `port` of the node's addresses; never returns but on an error.
pub fn serve(dir: &Path, node: &str, port: u16) -> std::io::Result<()> {
    crate::netbed::enter(crate::netbed::holder(dir, node)?, true)?;
    let listener = TcpListener::bind(("0.0.0.0", port))?;
    for conn in listener.incoming() {
        let conn = conn?;
        std::thread::spawn(move || {
            if let Err(e) = session(conn) {
                eprintln!("netbed rshd: {e}");
            }
        });
    }
    Ok(())
}

/// One command: its line, then `setsid sh -c LINE` with the connection as its stdio.
fn session(mut conn: TcpStream) -> std::io::Result<()> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while conn.read(&mut byte)? == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let cmd = String::from_utf8_lossy(&line).into_owned();
    let io = |c: &TcpStream| -> std::io::Result<Stdio> {
        Ok(Stdio::from(OwnedFd::from(c.try_clone()?)))
    };
    let mut child = Command::new("setsid")
        .args(["sh", "-c", &cmd])
        .stdin(io(&conn)?)
        .stdout(io(&conn)?)
        .stderr(io(&conn)?)
        .spawn()?;
    drop(conn);
    child.wait()?;
    Ok(())
}

/// The client: sends `cmd` to `addr`, relays stdin to it and what comes back to stdout.
pub fn run(addr: &str, cmd: &[String]) -> std::io::Result<()> {
    let mut conn = TcpStream::connect(addr)?;
    conn.write_all(format!("{}\n", cmd.join(" ")).as_bytes())?;
    let mut up = conn.try_clone()?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut up);
        let _ = up.shutdown(Shutdown::Write);
    });
    std::io::copy(&mut conn, &mut std::io::stdout())?;
    Ok(())
}
