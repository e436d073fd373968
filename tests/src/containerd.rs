//! containerd for real: Debian's containerd and runc, started by the test with its own root,
//! state and socket (no system service involved), driven with `ctr`. runc runs the installed
//! CRIU (found in PATH) and the plugin under test, named by a CRIU settings file the container
//! carries in its `org.criu.config` annotation.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::{pid_alive, signal, wait_until};

/// Every `ctr` call is bounded: a stuck shim must fail the test, not hang it.
const CTR_LIMIT: Duration = Duration::from_secs(120);

pub fn require() {
    for tool in ["containerd", "ctr", "runc"] {
        assert!(
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success()),
            "{tool} is missing: run scripts/install.sh --with-containers (it installs Debian's containerd and runc)"
        );
    }
}

/// Runs `cmd` for at most `limit`; kills it after that and says so in stderr.
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
            let mut out = rx.recv().expect("killed child").expect("wait");
            out.stderr
                .extend_from_slice(format!("\n[killed after {} s]", limit.as_secs()).as_bytes());
            out
        }
    }
}

/// A containerd daemon of the test's own.
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub namespace: String,
    daemon: Child,
}

impl Containerd {
    /// `plugin_settings`: the plugin's settings file for the CRIU runs of this daemon's
    /// containers (runc's CRIU inherits the daemon's environment), so the test leaves
    /// /etc/criu/gpu-plugin.conf alone.
    pub fn start(scratch: &Path, plugin_settings: &Path) -> Containerd {
        let dir = scratch.join("containerd");
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("containerd.sock");
        let config = format!(
            "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{s}\"\n[ttrpc]\n  address = \"{s}.ttrpc\"\n",
            d = dir.display(),
            s = socket.display()
        );
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let path = format!(
            "/usr/local/sbin:/usr/local/bin:{}",
            std::env::var("PATH").unwrap_or_default()
        );
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .env("PATH", path)
            .env("CRIU_GPU_CONFIG", plugin_settings)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("containerd.log")).unwrap())
            .spawn()
            .expect("start containerd");
        let c = Containerd {
            dir,
            socket,
            namespace: format!("criu-gpu-test-{}", std::process::id()),
            daemon,
        };
        assert!(
            wait_until(Duration::from_secs(20), || c
                .ctr(&["version"])
                .status
                .success()),
            "containerd did not come up: {}",
            std::fs::read_to_string(c.dir.join("containerd.log")).unwrap_or_default()
        );
        c
    }

    pub fn ctr(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", &self.namespace])
            .args(args);
        run_bounded(cmd, CTR_LIMIT)
    }

    /// Kills and removes a container and its task, whatever state they are in.
    pub fn remove(&self, id: &str) {
        let _ = self.ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
        wait_until(Duration::from_secs(10), || {
            !String::from_utf8_lossy(&self.ctr(&["tasks", "list"]).stdout).contains("RUNNING")
        });
        // A task whose restore failed never ran: a plain delete removes it, where --force
        // would wait for an exit that never comes.
        if !self.ctr(&["tasks", "delete", id]).status.success() {
            let _ = self.ctr(&["tasks", "delete", "--force", id]);
        }
        let _ = self.ctr(&["containers", "delete", id]);
    }

    /// The CRIU restore log runc left for a container, wherever this containerd keeps it.
    pub fn restore_log(&self, id: &str) -> String {
        let ns = &self.namespace;
        [
            self.dir.join(format!(
                "root/io.containerd.runtime.v2.task/{ns}/{id}/restore.log"
            )),
            self.dir.join(format!(
                "state/io.containerd.runtime.v2.task/{ns}/{id}/work/restore.log"
            )),
        ]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default()
    }

    /// The CRIU logs runc left under this containerd's directories (tails of each), for
    /// failure messages.
    pub fn criu_logs(&self) -> String {
        let mut found = Vec::new();
        let mut dirs = vec![self.dir.clone()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir() && !t.is_symlink()) {
                    if !p.ends_with("rootfs") && !p.ends_with("snapshots") {
                        dirs.push(p);
                    }
                } else if p.to_string_lossy().ends_with("dump.log")
                    || p.to_string_lossy().ends_with("restore.log")
                {
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    found.push(format!(
                        "--- {}\n{}",
                        p.display(),
                        crate::criu::tail(&text, 25)
                    ));
                }
            }
        }
        found.join("\n")
    }

    /// Shims this daemon started (they outlive it).
    fn shims(&self) -> Vec<i32> {
        let needle = self.socket.display().to_string();
        std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                    .filter(|pid| {
                        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                            let c = String::from_utf8_lossy(&c);
                            c.contains("containerd-shim") && c.contains(&needle)
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let list = self.ctr(&["containers", "list", "--quiet"]);
        for id in String::from_utf8_lossy(&list.stdout).lines() {
            self.remove(id.trim());
        }
        for pid in self.shims() {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
        }
        signal(self.daemon.id() as i32, nix::sys::signal::Signal::SIGTERM);
        let pid = self.daemon.id() as i32;
        if !wait_until(Duration::from_secs(10), || !pid_alive(pid)) {
            let _ = self.daemon.kill();
        }
        let _ = self.daemon.wait();
        // Snapshots left mounted by a failed test would keep the scratch directory busy.
        let _ = Command::new("umount")
            .arg("-R")
            .arg(self.dir.join("root"))
            .stderr(Stdio::null())
            .status();
    }
}
