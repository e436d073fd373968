//! `netbed`: nodes of a test bed as namespaces on one machine (gpu_ckpt_tests::netbed).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use gpu_ckpt_tests::{netbed, rsh};

fn usage() -> ! {
    eprintln!(
        "usage: netbed up DIR NAME=A.B.C.D/N... | exec DIR NAME -- CMD... | addr DIR NAME \
         A.B.C.D/N | link DIR NAME up|down | down DIR | hold DIR NAME | rshd DIR NAME PORT | rsh \
         HOST:PORT CMD..."
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(2).map(PathBuf::from).unwrap_or_else(|| usage());
    let result = match args.get(1).map(String::as_str) {
        Some("up") => {
            let nodes: Vec<_> = args[3..]
                .iter()
                .map(|a| netbed::parse_node(a).unwrap_or_else(|| usage()))
                .collect();
            let me = std::env::current_exe().expect("own path");
            netbed::up_bed(&me, &dir, &nodes)
        }
        Some("hold") => netbed::hold(&dir, args.get(3).unwrap_or_else(|| usage())),
        Some("addr") => {
            let (ip, prefix) = args
                .get(4)
                .and_then(|a| netbed::parse_addr(a))
                .unwrap_or_else(|| usage());
            netbed::address(&dir, args.get(3).unwrap_or_else(|| usage()), ip, prefix)
        }
        Some("link") => {
            let on = match args.get(4).map(String::as_str) {
                Some("up") => true,
                Some("down") => false,
                _ => usage(),
            };
            netbed::link(&dir, args.get(3).unwrap_or_else(|| usage()), on)
        }
        Some("exec") => {
            let node = args.get(3).unwrap_or_else(|| usage());
            let cmd = match args.get(4).map(String::as_str) {
                Some("--") => &args[5..],
                _ => usage(),
            };
            if cmd.is_empty() {
                usage();
            }
            netbed::holder(&dir, node)
                .and_then(|pid| netbed::enter(pid, true))
                .map(|()| std::process::Command::new(&cmd[0]).args(&cmd[1..]).exec())
                .and_then(Err)
        }
        Some("down") => std::fs::remove_dir_all(&dir),
        Some("rshd") => {
            let port = args
                .get(4)
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| usage());
            rsh::serve(&dir, args.get(3).unwrap_or_else(|| usage()), port)
        }
        // `netbed rsh HOST:PORT CMD...` (the second word is the address, not a directory).
        Some("rsh") if args.len() > 3 => rsh::run(&args[2], &args[3..]),
        _ => usage(),
    };
    if let Err(e) = result {
        eprintln!("netbed: {e}");
        std::process::exit(1);
    }
}
