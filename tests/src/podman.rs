//! Rootful Podman with runc, a locally built image holding the simulated GPU application, and
//! the plugin's settings file (container runtimes do not pass their environment on to criu).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::Sim;

/// Podman for one test: runc through a wrapper of the test's own that names the test's own
/// plugin settings file (`CRIU_GPU_CONFIG`) to the CRIU it starts, so tests running at once never
/// share `/etc/criu/gpu-plugin.conf`. The variable cannot come from the caller's environment:
/// Podman starts conmon, and conmon the runtime, with environments of their own.
#[derive(Clone)]
pub struct Podman {
    runtime: PathBuf,
    /// The plugin's settings file of this test.
    pub conf: PathBuf,
}

impl Podman {
    pub fn new(scratch: &Path) -> Podman {
        let dir = scratch.join("podman-runtime");
        std::fs::create_dir_all(&dir).unwrap();
        let conf = scratch.join("gpu-plugin.conf");
        std::fs::write(&conf, "").unwrap();
        let runc = Command::new("sh")
            .args(["-c", "command -v runc"])
            .output()
            .expect("look for runc");
        let runc = String::from_utf8_lossy(&runc.stdout).trim().to_owned();
        assert!(!runc.is_empty(), "runc is not on PATH");
        // Named runc: Podman knows what a runtime can do by its name.
        let runtime = dir.join("runc");
        std::fs::write(
            &runtime,
            format!(
                "#!/bin/sh\nCRIU_GPU_CONFIG='{}' exec {runc} \"$@\"\n",
                conf.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        Podman { runtime, conf }
    }

    /// `podman ARGS` with this test's runtime (named on every call: Podman knows a runtime given
    /// by its path only while that call runs).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("podman");
        c.arg("--runtime").arg(&self.runtime).args(args);
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run podman")
    }

    /// Writes this test's plugin settings file.
    pub fn settings(&self, lines: &[String]) {
        std::fs::write(&self.conf, lines.join("\n") + "\n").unwrap();
    }

    /// The log of the last checkpoint or restore of a container kept with --keep.
    pub fn container_log(&self, container: &str, name: &str) -> String {
        let out = self.run(&["inspect", "--format", "{{.Id}}", container]);
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let path = PathBuf::from("/var/lib/containers/storage/overlay-containers")
            .join(id)
            .join("userdata")
            .join(name);
        std::fs::read_to_string(path).unwrap_or_default()
    }
}

/// The plugin settings a simulated machine needs (what criu needs to reach its driver).
pub fn sim_settings(sim: &Sim) -> Vec<String> {
    sim.env()
        .into_iter()
        .filter(|(k, _)| k != "LD_LIBRARY_PATH" && k != "CRIU_GPU_CONFIG")
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// CRIU's settings for the runc of a test's containers, written into its scratch directory: the
/// plugin under test (never the node's installed one, which /etc/criu/runc.conf names) and CRIU's
/// timeout for the GPU lock. runc reads the file a container's `org.criu.config` annotation names
/// at its checkpoints and restores, instead of /etc/criu/runc.conf.
pub fn criu_config(sim: &Sim) -> PathBuf {
    let criu = crate::criu::Criu::new(sim);
    let conf = sim.dir.join("criu-runc.conf");
    std::fs::write(
        &conf,
        format!("lib {}\ntimeout 600\n", criu.plugins.display()),
    )
    .unwrap();
    conf
}

/// Podman's tests of one test process build one image (named by the process) and each runs a
/// GPU application on a simulated machine: one at a time. Held for the whole test.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Podman and runc, or a panic saying how to get them.
pub fn require() {
    for tool in ["podman", "runc"] {
        assert!(
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success()),
            "{tool} is missing: run scripts/install.sh --with-containers (it installs Podman and runc)"
        );
    }
}

/// An image built from a directory: the test application, the simulated driver and the C
/// libraries they need. No registry is involved.
pub struct Image {
    pub name: String,
    podman: Podman,
}

impl Image {
    pub fn build(podman: &Podman, scratch: &Path) -> Image {
        let tar = crate::app_rootfs_tar(scratch);
        let name = format!("localhost/criu-gpu-test:{}", std::process::id());
        let out = podman.run(&["import", tar.to_str().unwrap(), &name]);
        assert!(
            out.status.success(),
            "podman import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Image {
            name,
            podman: podman.clone(),
        }
    }

    /// `podman run -d` of the test application with the simulated GPU's socket mounted in, as
    /// NVIDIA's container toolkit mounts /dev/nvidia*, and CRIU's settings of the test
    /// ([`criu_config`]) as its `org.criu.config` annotation.
    pub fn run(&self, sim: &Sim, container: &str, logs: &Path, app_args: &[&str]) -> Output {
        self.run_with(sim, container, logs, &[], app_args)
    }

    /// `run` with more podman options (a CDI device).
    pub fn run_with(
        &self,
        sim: &Sim,
        container: &str,
        logs: &Path,
        podman_args: &[&str],
        app_args: &[&str],
    ) -> Output {
        let sock_mount = format!("{}:/run/cuda-sim", sim.socket.parent().unwrap().display());
        let log_mount = format!("{}:/logs", logs.display());
        let annotation = format!("org.criu.config={}", criu_config(sim).display());
        let mut a = vec![
            "run",
            "-d",
            "--name",
            container,
            "--network",
            "none",
            // This sandbox cannot raise resource limits; podman's defaults would.
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "-v",
            &sock_mount,
            "-v",
            &log_mount,
            "-e",
            "LD_LIBRARY_PATH=/opt/sim/lib",
            "-e",
            "CUDA_SIM_SOCKET=/run/cuda-sim/gpud.sock",
            "--annotation",
            &annotation,
        ];
        a.extend_from_slice(podman_args);
        a.extend_from_slice(&[
            &self.name,
            "/usr/bin/cuda-sim-app",
            "--log",
            "/logs/app.log",
        ]);
        a.extend_from_slice(app_args);
        self.podman.run(&a)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = self.podman.run(&["rmi", "-f", &self.name]);
    }
}

/// A CDI spec of the simulated GPUs, as NVIDIA's container toolkit writes one for real GPUs
/// (devices "0", "1", ..., "all", each with its /dev/nvidiaN), in /var/run/cdi while alive. The
/// device nodes are made up (char 195:N, never opened): a container given them holds the nodes a
/// real GPU's container holds, and `cuda-sim-gpud --device-nodes` makes the plugin want them.
pub struct Cdi {
    path: PathBuf,
    pub kind: String,
}

impl Cdi {
    pub fn write(gpus: u32) -> Cdi {
        // A kind of this test process's own: two runs on one machine (each with a spec in the
        // shared /var/run/cdi) would otherwise define the same devices twice, which Podman
        // refuses ("unresolvable CDI devices").
        let kind = format!("criu-gpu-test-{}.example/gpu", std::process::id());
        let node = |n: u32| serde_json::json!({"path": format!("/dev/nvidia{n}"), "type": "c", "major": 195, "minor": n});
        let mut devices: Vec<serde_json::Value> = (0..gpus)
            .map(|n| serde_json::json!({"name": n.to_string(), "containerEdits": {"deviceNodes": [node(n)]}}))
            .collect();
        devices.push(serde_json::json!({
            "name": "all",
            "containerEdits": {"deviceNodes": (0..gpus).map(node).collect::<Vec<_>>()}
        }));
        let spec = serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": kind,
            "devices": devices,
            "containerEdits": {"deviceNodes": [
                {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}
            ]},
        });
        let path = PathBuf::from(format!(
            "/var/run/cdi/criu-gpu-test-{}.json",
            std::process::id()
        ));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        Cdi { path, kind }
    }

    /// `--device` for GPU `name` ("0", "all", ...).
    pub fn device(&self, name: &str) -> String {
        format!("{}={name}", self.kind)
    }
}

impl Drop for Cdi {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
