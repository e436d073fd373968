//! What the tests run: the workspace's build products, and the few things built on the spot
//! (a container root file system, a fake NCCL library, an io_uring launcher).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::stderr;

/// The directory holding the workspace's build products (target/debug or target/release).
pub fn build_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("GPU_CKPT_BUILD_DIR") {
        return PathBuf::from(dir);
    }
    // target/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// A build product, or a panic that says how to make it.
pub fn artifact(name: &str) -> PathBuf {
    let p = build_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` before the tests (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A container root file system holding the test application, the simulated driver and the C
/// libraries they need, as a tar under `scratch`. No registry is involved.
pub fn app_rootfs_tar(scratch: &Path) -> PathBuf {
    let root = scratch.join("rootfs");
    for d in [
        "usr/bin",
        "opt/sim/lib",
        "lib/x86_64-linux-gnu",
        "lib64",
        "logs",
        "run/cuda-sim",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::copy(artifact("cuda-sim-app"), root.join("usr/bin/cuda-sim-app")).unwrap();
    fs::copy(
        artifact("libcuda.so"),
        root.join("opt/sim/lib/libcuda.so.1"),
    )
    .unwrap();
    for lib in ["libc.so.6", "libgcc_s.so.1", "libm.so.6"] {
        fs::copy(
            Path::new("/lib/x86_64-linux-gnu").join(lib),
            root.join("lib/x86_64-linux-gnu").join(lib),
        )
        .unwrap();
    }
    fs::copy(
        "/lib64/ld-linux-x86-64.so.2",
        root.join("lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    let tar = scratch.join("rootfs.tar");
    let ok = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar of the root file system");
    tar
}

/// A shared library named `libnccl.so.2` (empty), for processes that must look like NCCL ranks:
/// preloaded, it shows in their memory map as NCCL does. Built with the system's C compiler.
pub fn fake_nccl(dir: &Path) -> PathBuf {
    let src = dir.join("fake-nccl.c");
    let lib = dir.join("libnccl.so.2");
    fs::write(&src, "void fake_nccl(void) {}\n").unwrap();
    cc(&src, &lib, &["-shared", "-fPIC"]);
    lib
}

/// A launcher, built with the system's C compiler: `uring-launcher PROGRAM ARGS...` forks a child
/// that sets up an io_uring (its fd and ring mapping, as libuv's) and waits, then becomes
/// PROGRAM, so the tree is PROGRAM with an io_uring-holding child.
pub fn uring_launcher(dir: &Path) -> PathBuf {
    let src = dir.join("uring-launcher.c");
    let bin = dir.join("uring-launcher");
    fs::write(
        &src,
        r#"#include <linux/io_uring.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (fork() == 0) {
        struct io_uring_params p;
        memset(&p, 0, sizeof(p));
        int fd = syscall(__NR_io_uring_setup, 4, &p);
        if (fd < 0) return 1;
        void *sq = mmap(0, p.sq_off.array + p.sq_entries * 4, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
        if (sq == MAP_FAILED) return 1;
        for (;;) pause();
    }
    execvp(argv[1], argv + 1);
    return 127;
}
"#,
    )
    .unwrap();
    cc(&src, &bin, &["-O2"]);
    bin
}

/// `cc FLAGS -o OUT SRC` with the system's C compiler; the test fails with its words if it fails.
pub fn cc(src: &Path, out: &Path, flags: &[&str]) {
    let run = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .expect("run cc");
    assert!(run.status.success(), "cc: {}", stderr(&run));
}
