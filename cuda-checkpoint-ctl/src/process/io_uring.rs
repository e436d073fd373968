//! io_uring instances of a process. CRIU (4.2.1) cannot dump them: it fails on the ring's mapping
//! ("Unknown shit 600 (anon_inode:[io_uring])") after the GPU state was already checkpointed. In
//! GPU jobs they come from libuv, which PyTorch's TCPStore server runs on (rank 0 of a
//! torch.multiprocessing job, torchrun's agent; docs/driver-facts.md, D1).

use std::fs;

/// The io_uring instances of a process and who is likely to have made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoUring {
    /// Open io_uring fds.
    pub fds: usize,
    /// Mapped rings.
    pub mappings: usize,
    /// Mapped libraries known to use io_uring (file names), most specific first.
    pub libraries: Vec<String>,
}

const ANON: &str = "anon_inode:[io_uring]";

/// Libraries that make io_uring instances, by a part of their file name.
const USERS: [&str; 4] = ["libuv", "liburing", "libtorch_cpu", "libtorch"];

/// The process's io_uring instances, `None` when it has none.
pub fn io_uring(pid: i32) -> std::io::Result<Option<IoUring>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mappings = maps.lines().filter(|l| l.ends_with(ANON)).count();
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))?
        .flatten()
        .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == ANON))
        .count();
    if fds == 0 && mappings == 0 {
        return Ok(None);
    }
    Ok(Some(IoUring {
        fds,
        mappings,
        libraries: users_in(&maps),
    }))
}

fn users_in(maps: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for user in USERS {
        let file = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter_map(|p| p.rsplit('/').next())
            .find(|name| name.starts_with(user) && name.contains(".so"));
        if let Some(f) = file {
            if !found.iter().any(|x| x == f) {
                found.push(f.to_owned());
            }
        }
    }
    found
}

impl IoUring {
    /// What most likely made the rings, and how to do without them.
    pub fn fix(&self) -> String {
        let torch = self.libraries.iter().any(|l| l.starts_with("libtorch"));
        if torch {
            "PyTorch's TCPStore servers run on libuv, which holds an io_uring: start a job of \
             torch.multiprocessing (or init_process_group with tcp:// or env://) with \
             USE_LIBUV=0; torchrun's agent makes its stores on libuv whatever its settings \
             (PyTorch 2.11: USE_LIBUV=0, --rdzv-conf use_libuv=0, UV_USE_IO_URING=0 and \
             TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 all leave a ring): start a torchrun job with \
             io_uring off on the node (sysctl kernel.io_uring_disabled=2 while it starts; \
             libuv then uses epoll) and USE_LIBUV=0"
                .into()
        } else if self.libraries.iter().any(|l| l.starts_with("libuv")) {
            "libuv uses io_uring: UV_USE_IO_URING=0 in the program's environment turns it off for \
             file operations; a program that still holds a ring must stop using it before a \
             checkpoint"
                .into()
        } else {
            "CRIU cannot dump io_uring instances: switch the program (or the library that uses \
             io_uring) to ordinary I/O before checkpointing it"
                .into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_libraries_and_the_fix() {
        let maps = "\
7f00-7f10 r-xp 00000000 fe:00 1 /opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so
7f10-7f20 r-xp 00000000 fe:00 2 /usr/lib/x86_64-linux-gnu/libuv.so.1.0.0
7f20-7f24 rw-s 10000000 00:10 3 anon_inode:[io_uring]
";
        let libs = users_in(maps);
        assert_eq!(libs, vec!["libuv.so.1.0.0", "libtorch_cpu.so"]);
        let u = IoUring {
            fds: 1,
            mappings: 1,
            libraries: libs,
        };
        assert!(
            u.fix().contains("USE_LIBUV=0") && u.fix().contains("kernel.io_uring_disabled=2"),
            "{}",
            u.fix()
        );
        let plain = IoUring {
            fds: 1,
            mappings: 0,
            libraries: vec![],
        };
        assert!(plain.fix().contains("CRIU cannot dump io_uring"));
    }

    #[test]
    fn a_process_without_rings_has_none() {
        assert_eq!(io_uring(std::process::id() as i32).unwrap(), None);
    }
}
