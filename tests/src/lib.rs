//! Test harness: the simulated GPU, GPU-like applications, the CLI and real CRIU, as processes.
//!
//! The binaries come from the workspace's target directory, so `cargo build --workspace` must
//! have run first (scripts/test.sh does). This file holds the machine the tests run on (the
//! simulated one, [`Sim`]; a real NVIDIA one is [`nvidia`], chosen by [`scenario`]); the helpers
//! live by job: [`artifacts`] (build products and what is built on the spot), [`procs`]
//! (processes and commands), [`app`] (the test applications).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub mod amd;
pub mod app;
pub mod artifacts;
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
pub mod procs;
pub mod rsh;
pub mod scenario;
pub mod scenario_job;
pub mod sweep;
pub mod uring;

pub use self::app::{nccl_app, read_lines, start_app, App, NCCL_SOCKETS_ONLY};
pub use self::artifacts::{app_rootfs_tar, artifact, build_dir, fake_nccl, uring_launcher};
pub use self::procs::{
    exit_code, finish_within, is_stopped, kill_child, pid_alive, reap_in_background,
    setsid_command, signal, stderr, stdout, wait_gone, wait_until,
};

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

    /// The environment every process of this simulated machine needs. The plugin's settings file
    /// is the test's own (absent unless a test writes it): tests running at once never read or
    /// write the node's /etc/criu/gpu-plugin.conf.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "CRIU_GPU_CONFIG".into(),
                self.dir.join("gpu-plugin.conf").display().to_string(),
            ),
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
