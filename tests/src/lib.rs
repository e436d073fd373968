//! Test harness: the simulated GPU, GPU-like applications, the CLI and real CRIU, as processes.
//!
//! The binaries come from the workspace's target directory, so `cargo build --workspace` must
//! have run first (scripts/test.sh does).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub mod amd;
pub mod cluster;
pub mod containerd;
pub mod criu;
pub mod held;
pub mod job;
pub mod kube;
pub mod memcg;
pub mod migrate;
pub mod netbed;
pub mod nvidia;
pub mod podman;
pub mod rsh;
pub mod scenario;
pub mod scenario_job;
pub mod sweep;
pub mod uring;

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

/// A simulated machine the tests run processes and CRIU on.
pub trait Machine {
    /// The environment its processes and CRIU need.
    fn env(&self) -> Vec<(String, String)>;
    /// Its scratch directory.
    fn scratch(&self) -> &Path;
}

impl Machine for Sim {
    fn env(&self) -> Vec<(String, String)> {
        Sim::env(self)
    }
    fn scratch(&self) -> &Path {
        &self.dir
    }
}

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

/// Polls `f` until it returns true or `limit` passes.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    f()
}

pub fn pid_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie has exited already.
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits for a pid to disappear (CRIU restores a tree with the same pids).
pub fn wait_gone(pid: i32) {
    assert!(
        wait_until(Duration::from_secs(10), || !Path::new(&format!(
            "/proc/{pid}"
        ))
        .exists()),
        "pid {pid} is still there"
    );
}

/// Stopped by a signal (state T in /proc).
pub fn is_stopped(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// Waits for a background command and returns its output, or kills it after `limit`.
pub fn finish_within(child: Child, limit: Duration) -> Option<Output> {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.ok(),
        Err(_) => {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
            None
        }
    }
}

/// Kills a background command (a controller "dying") and reaps it.
pub fn kill_child(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

pub fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A simulated GPU (its daemon) and a scratch directory; everything is torn down on drop.
pub struct Sim {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub lib_dir: PathBuf,
    daemon: Child,
    apps: Vec<i32>,
}

/// Parameters of the simulated machine.
pub struct SimSpec<'a> {
    pub gpus: u32,
    pub memory: &'a str,
    /// Names the machine: GPU UUIDs derive from it.
    pub seed: &'a str,
    /// The GPUs have device nodes /dev/nvidiaN (`cuda-sim-gpud --device-nodes`): a restored
    /// process must find its GPUs' nodes in its root, as a container on a real GPU must.
    pub device_nodes: bool,
}

impl Default for SimSpec<'_> {
    fn default() -> Self {
        SimSpec {
            gpus: 1,
            memory: "1GiB",
            seed: "machine-a",
            device_nodes: false,
        }
    }
}

impl Sim {
    pub fn start() -> Sim {
        Sim::with(SimSpec::default())
    }

    pub fn with(spec: SimSpec<'_>) -> Sim {
        let dir = std::env::temp_dir().join(format!(
            "gpu-ckpt-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        let lib_dir = dir.join("lib");
        fs::create_dir_all(&lib_dir).unwrap();
        // The simulated driver under the names of the real libraries, in a folder of its own:
        // only processes told about this folder use it.
        let lib = artifact("libcuda.so");
        fs::copy(&lib, lib_dir.join("libcuda.so.1")).unwrap();
        fs::copy(&lib, lib_dir.join("libnvidia-ml.so.1")).unwrap();
        let socket = dir.join("gpud.sock");
        Sim {
            daemon: Sim::spawn_daemon(&dir, &socket, &spec),
            dir,
            socket,
            lib_dir,
            apps: Vec::new(),
        }
    }

    fn spawn_daemon(dir: &Path, socket: &Path, spec: &SimSpec<'_>) -> Child {
        let _ = fs::remove_file(socket);
        let child = Command::new(artifact("cuda-sim-gpud"))
            .args(["--socket", socket.to_str().unwrap()])
            .args(["--gpus", &spec.gpus.to_string(), "--memory", spec.memory])
            .args(["--uuid-seed", spec.seed])
            .args(spec.device_nodes.then_some("--device-nodes"))
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("gpud.log")).unwrap())
            .spawn()
            .expect("start cuda-sim-gpud");
        assert!(
            wait_until(Duration::from_secs(10), || {
                std::os::unix::net::UnixStream::connect(socket).is_ok()
            }),
            "the GPU daemon did not come up"
        );
        child
    }

    /// Replaces the GPU daemon by another "machine" (e.g. other UUIDs or memory sizes).
    pub fn swap_gpus(&mut self, spec: SimSpec<'_>) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        self.daemon = Sim::spawn_daemon(&self.dir, &self.socket, &spec);
    }

    /// Takes the GPUs away: the daemon stops, as if the driver were not loaded.
    pub fn stop_gpus(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = fs::remove_file(&self.socket);
    }

    /// The environment every process of this simulated machine needs.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("CUDA_SIM_SOCKET".into(), self.socket.display().to_string()),
            (
                "CUDA_CKPT_LIBCUDA".into(),
                self.lib_dir.join("libcuda.so.1").display().to_string(),
            ),
            (
                "CUDA_CKPT_LIBNVML".into(),
                self.lib_dir.join("libnvidia-ml.so.1").display().to_string(),
            ),
            ("LD_LIBRARY_PATH".into(), self.lib_dir.display().to_string()),
        ]
    }

    /// Starts the test application as a session leader (as CRIU wants a dump root).
    pub fn app(&mut self, name: &str, args: &[&str]) -> App {
        let log = self.dir.join(format!("{name}.log"));
        let app = start_app("cuda-sim-app", &log, args, self.env());
        self.apps.push(app.pid);
        app
    }

    /// Remembers a pid to kill at the end (e.g. a restored process).
    pub fn adopt(&mut self, pid: i32) {
        self.apps.push(pid);
    }

    /// Runs cuda-checkpoint-ctl.
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_env(args, &[])
    }

    pub fn ctl_env(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        Command::new(artifact("cuda-checkpoint-ctl"))
            .args(args)
            .envs(self.env())
            .envs(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .output()
            .expect("run cuda-checkpoint-ctl")
    }

    /// Starts cuda-checkpoint-ctl in the background (output captured), e.g. to kill it while
    /// its driver call waits.
    pub fn ctl_spawn(&self, args: &[&str], extra: &[(&str, &str)]) -> Child {
        Command::new(artifact("cuda-checkpoint-ctl"))
            .args(args)
            .envs(self.env())
            .envs(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cuda-checkpoint-ctl")
    }

    /// Starts `driver-call ARGS`: one driver call without cuda-checkpoint-ctl's checks (which
    /// refuse a process whose driver thread cannot run), to see what the driver itself does.
    pub fn driver_spawn(&self, args: &[&str]) -> Child {
        Command::new(artifact("driver-call"))
            .args(args)
            .envs(self.env())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start driver-call")
    }

    /// Waits until an action is pending or running on `pid`: its state cannot be read then
    /// (docs/driver-facts.md, F4; nor while the process cannot run, F11). On a running process
    /// the driver takes a request at once, so after this a controller that dies no longer takes
    /// its action with it.
    pub fn wait_busy(&self, pid: i32) -> bool {
        let p = pid.to_string();
        wait_until(Duration::from_secs(10), || {
            let probe = self.driver_spawn(&["state", &p]);
            finish_within(probe, Duration::from_millis(150)).is_none()
        })
    }

    /// Runs cuda-checkpoint-ctl as the unprivileged user `nobody`.
    pub fn ctl_as_nobody(&self, args: &[&str]) -> Output {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(artifact("cuda-checkpoint-ctl"))
            .args(args)
            .envs(self.env())
            .output()
            .expect("run cuda-checkpoint-ctl with setpriv")
    }

    /// The UUIDs of the simulated GPUs, in index order.
    pub fn gpu_uuids(&self) -> Vec<String> {
        self.gpus().into_iter().map(|(u, _)| u).collect()
    }

    /// `cuda-checkpoint-ctl ARGS --json`, parsed.
    pub fn ctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.ctl(&a);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "bad JSON from {args:?} ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// The driver's state of `pid`, or "no answer" when it gives none within 20 s (the driver
    /// waits as long as the process cannot run: docs/driver-facts.md, F11).
    pub fn state(&self, pid: i32) -> String {
        let child = self.ctl_spawn(&["--get-state", "--pid", &pid.to_string()], &[]);
        match finish_within(child, Duration::from_secs(20)) {
            Some(out) => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            None => "no answer".into(),
        }
    }

    /// GPUs as NVML sees them: (uuid, used bytes).
    pub fn gpus(&self) -> Vec<(String, u64)> {
        let v = self.ctl_json(&["--gpus"]);
        v["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["uuid"].as_str().unwrap().to_owned(),
                    g["memory_used"].as_u64().unwrap(),
                )
            })
            .collect()
    }
}

/// SIGKILLs every process of each tree: read whole before any is killed (a dead parent's
/// children are no longer its children).
pub fn kill_trees(roots: &[i32]) {
    let all: Vec<i32> = roots
        .iter()
        .flat_map(|&pid| process_facts::process::tree(pid))
        .collect();
    for pid in all {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        kill_trees(&self.apps);
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        if std::env::var_os("KEEP_TEST_DIRS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Starts a test application (`program --log LOG ARGS`) in a session of its own and waits for
/// its first verified step.
pub fn start_app(program: &str, log: &Path, args: &[&str], env: Vec<(String, String)>) -> App {
    let child = setsid_command(&artifact(program))
        .args(["--log", log.to_str().unwrap()])
        .args(args)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    let app = App {
        pid: reap_in_background(child),
        log: log.to_path_buf(),
    };
    assert!(
        wait_until(Duration::from_secs(20), || app.steps() >= 1),
        "{program} did not start: {}",
        app.tail()
    );
    app
}

/// Hands a child to a thread that reaps it when it dies, so its pid is free again at once
/// (CRIU restores processes with their old pids). Returns the pid.
pub fn reap_in_background(mut child: Child) -> i32 {
    let pid = child.id() as i32;
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    pid
}

/// `setsid PROGRAM`: a new session, so CRIU can dump the process as a tree root.
pub fn setsid_command(program: &Path) -> Command {
    let mut c = Command::new("setsid");
    c.arg(program);
    c
}

/// A running test application and its log.
pub struct App {
    pub pid: i32,
    pub log: PathBuf,
}

impl App {
    pub fn lines(&self) -> Vec<String> {
        read_lines(&self.log)
    }

    /// The number of verified steps so far.
    pub fn steps(&self) -> usize {
        self.lines().iter().filter(|l| l.ends_with(" ok")).count()
    }

    /// Asserts no step found wrong data and the application did not fail.
    pub fn assert_healthy(&self) {
        for l in self.lines() {
            assert!(
                !l.starts_with("MISMATCH") && !l.starts_with("ERROR"),
                "{}: {l}",
                self.log.display()
            );
        }
    }

    /// Waits for `n` more verified steps.
    pub fn advances(&self, n: usize) -> bool {
        let start = self.steps();
        wait_until(Duration::from_secs(20), || self.steps() >= start + n)
    }

    /// True if no step completes within `d` (the process is locked or stopped). The one step
    /// that was past its last CUDA call may still log, however late a loaded machine lets it.
    pub fn stalls_for(&self, d: Duration) -> bool {
        let start = self.steps();
        std::thread::sleep(d + Duration::from_millis(200));
        self.steps() <= start + 1
    }

    pub fn tail(&self) -> String {
        self.lines()
            .iter()
            .rev()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

pub fn read_lines(p: &Path) -> Vec<String> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// stdout of a command as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The exit status as the shell sees it (a CUDA error code modulo 256).
pub fn exit_code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// A shared library named `libnccl.so.2` (empty), for processes that must look like NCCL ranks:
/// preloaded, it shows in their memory map as NCCL does. Built with the system's C compiler.
pub fn fake_nccl(dir: &Path) -> PathBuf {
    let src = dir.join("fake-nccl.c");
    let lib = dir.join("libnccl.so.2");
    fs::write(&src, "void fake_nccl(void) {}\n").unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(out.status.success(), "cc: {}", stderr(&out));
    lib
}

/// NCCL's settings that make ranks of one node talk through sockets only.
pub const NCCL_SOCKETS_ONLY: [(&str, &str); 3] = [
    ("NCCL_P2P_DISABLE", "1"),
    ("NCCL_SHM_DISABLE", "1"),
    ("NCCL_CUMEM_ENABLE", "0"),
];

/// Starts `cuda-sim-app ARGS` on `sim` as an NCCL job: the fake NCCL preloaded, `extra` in its
/// environment (forked children inherit both).
pub fn nccl_app(sim: &mut Sim, name: &str, args: &[&str], extra: &[(&str, &str)]) -> App {
    let lib = fake_nccl(&sim.dir);
    let mut env = sim.env();
    env.push(("LD_PRELOAD".into(), lib.display().to_string()));
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let app = start_app(
        "cuda-sim-app",
        &sim.dir.join(format!("{name}.log")),
        args,
        env,
    );
    sim.adopt(app.pid);
    app
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
    let out = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(out.status.success(), "cc: {}", stderr(&out));
    bin
}
