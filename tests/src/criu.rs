//! Running the real CRIU with the plugin.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{artifact, stderr, Machine};

/// The installed CRIU, which must be 4.2 or later (scripts/install-criu.sh installs it).
pub fn criu_binary() -> PathBuf {
    let candidates = [
        std::env::var("CRIU").ok().map(PathBuf::from),
        Some(PathBuf::from("/usr/local/sbin/criu")),
        Some(PathBuf::from("/usr/sbin/criu")),
    ];
    for c in candidates.into_iter().flatten() {
        if let Ok(out) = Command::new(&c).arg("--version").output() {
            let text = String::from_utf8_lossy(&out.stdout);
            let version = text
                .lines()
                .find_map(|l| l.strip_prefix("Version: "))
                .unwrap_or("0");
            let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
            if (major, minor) >= (4, 2) {
                return c;
            }
        }
    }
    panic!("CRIU >= 4.2 not found: run scripts/install-criu.sh (or set CRIU=/path/to/criu)");
}

/// Where scripts/install-criu.sh puts stock CRIU 4.2.1 (without the project's patches).
pub const STOCK: &str = "/usr/local/lib/criu-gpu/stock/criu";

/// Where scripts/install-criu.sh puts CRIU's own C CUDA plugin.
pub const UPSTREAM_CUDA: &str = "/usr/local/lib/criu-gpu/upstream-cuda/cuda_plugin.so";

/// Names CRIU's C CUDA plugin where it is not installed (scripts/gpu/scenarios.sh: the carried
/// one).
pub const UPSTREAM_CUDA_ENV: &str = "GPU_CKPT_UPSTREAM_CUDA";

/// An image directory and the plugin directory for one simulated machine.
pub struct Criu {
    pub bin: PathBuf,
    pub plugins: PathBuf,
}

impl Criu {
    /// A plugin directory holding only this project's plugin.
    pub fn new(m: &impl Machine) -> Criu {
        let plugins = m.scratch().join("criu-plugins");
        fs::create_dir_all(&plugins).unwrap();
        fs::copy(
            artifact("libcriu_gpu_plugin.so"),
            plugins.join("criu_gpu_plugin.so"),
        )
        .unwrap();
        Criu {
            bin: criu_binary(),
            plugins,
        }
    }

    /// A plugin directory holding NVIDIA's C CUDA plugin as CRIU builds it (installed apart by
    /// scripts/install-criu.sh).
    pub fn upstream_cuda(m: &impl Machine) -> Criu {
        let built = std::env::var(UPSTREAM_CUDA_ENV)
            .map_or_else(|_| PathBuf::from(UPSTREAM_CUDA), PathBuf::from);
        assert!(
            built.exists(),
            "{} is missing: run scripts/install-criu.sh (it builds CRIU's CUDA plugin), or set \
             {UPSTREAM_CUDA_ENV}",
            built.display()
        );
        let plugins = m.scratch().join("upstream-plugins");
        fs::create_dir_all(&plugins).unwrap();
        fs::copy(&built, plugins.join("cuda_plugin.so")).unwrap();
        Criu {
            bin: criu_binary(),
            plugins,
        }
    }

    /// `criu ARGS --lib PLUGINS` with the machine's environment (not yet started), and the
    /// plugin's settings file of the test's own (the machine's, else absent in its scratch
    /// directory): never the node's /etc/criu/gpu-plugin.conf.
    pub fn command(&self, sim: &impl Machine, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .args(["--lib", self.plugins.to_str().unwrap()])
            .env("CRIU_GPU_CONFIG", sim.scratch().join("gpu-plugin.conf"))
            .envs(sim.env())
            .env_remove("LD_LIBRARY_PATH")
            .envs(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        c
    }

    fn run(&self, sim: &impl Machine, args: &[String], env: &[(&str, &str)]) -> Output {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.command(sim, &args, env).output().expect("run criu")
    }

    /// Starts criu in the background, its output in its log file only.
    fn spawn(
        &self,
        sim: &impl Machine,
        args: &[String],
        env: &[(&str, &str)],
    ) -> std::process::Child {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.command(sim, &args, env)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start criu")
    }

    /// `criu dump -t PID -D DIR -v4 -o dump.log [args]`, started in the background.
    pub fn spawn_dump(
        &self,
        sim: &impl Machine,
        pid: i32,
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> std::process::Child {
        self.spawn(sim, &dump_args("dump", pid, dir, args), env)
    }

    /// `criu restore -D DIR -d -v4 -o restore.log`, started in the background.
    pub fn spawn_restore(
        &self,
        sim: &impl Machine,
        dir: &Path,
        env: &[(&str, &str)],
    ) -> std::process::Child {
        self.spawn(sim, &restore_args(dir, &[]), env)
    }

    /// `criu dump -t PID -D DIR -v4 -o dump.log [args]`.
    pub fn dump(
        &self,
        sim: &impl Machine,
        pid: i32,
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Output {
        self.run(sim, &dump_args("dump", pid, dir, args), env)
    }

    /// `criu pre-dump -t PID -D DIR -v4 -o pre-dump.log`.
    pub fn pre_dump(&self, sim: &impl Machine, pid: i32, dir: &Path) -> Output {
        self.run(sim, &dump_args("pre-dump", pid, dir, &[]), &[])
    }

    /// `criu restore -D DIR -d -v4 -o restore.log [args]`.
    pub fn restore(
        &self,
        sim: &impl Machine,
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Output {
        self.run(sim, &restore_args(dir, args), env)
    }
}

/// `criu ACTION -t PID -D DIR -v4 -o ACTION.log [args]`, creating DIR.
fn dump_args(action: &str, pid: i32, dir: &Path, args: &[&str]) -> Vec<String> {
    fs::create_dir_all(dir).unwrap();
    let mut a: Vec<String> = vec![
        action.into(),
        "-t".into(),
        pid.to_string(),
        "-D".into(),
        dir.to_str().unwrap().into(),
        "-v4".into(),
        "-o".into(),
        format!("{action}.log"),
    ];
    a.extend(args.iter().map(|s| s.to_string()));
    a
}

/// `criu restore -D DIR -d -v4 -o restore.log [args]`.
fn restore_args(dir: &Path, args: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "restore",
        "-D",
        dir.to_str().unwrap(),
        "-d",
        "-v4",
        "-o",
        "restore.log",
    ]
    .map(String::from)
    .to_vec();
    a.extend(args.iter().map(|s| s.to_string()));
    a
}

/// A CRIU log of an image directory.
pub fn log(dir: &Path, name: &str) -> String {
    fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// Asserts a CRIU command succeeded, showing its log otherwise.
pub fn assert_ok(out: &Output, dir: &Path, log_name: &str) {
    assert!(
        out.status.success(),
        "criu failed: {}\n--- {log_name} (tail) ---\n{}",
        stderr(out),
        tail(&log(dir, log_name), 40)
    );
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The plugin's lines of a CRIU log.
pub fn plugin_lines(dir: &Path, log_name: &str) -> Vec<String> {
    log(dir, log_name)
        .lines()
        .filter(|l| l.contains("criu_gpu:"))
        .map(str::to_owned)
        .collect()
}

/// Sends `sig` to `child` (a CRIU) once `pattern` shows in `log` (after `delay`) and reaps it;
/// false if CRIU ended first.
pub fn signal_when(
    child: &mut std::process::Child,
    log: &Path,
    pattern: &str,
    delay: std::time::Duration,
    sig: nix::sys::signal::Signal,
) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(30) {
        if fs::read_to_string(log).is_ok_and(|l| l.contains(pattern)) {
            std::thread::sleep(delay);
            crate::signal(child.id() as i32, sig);
            let _ = child.wait();
            return true;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    panic!("{pattern:?} never appeared in {}", log.display());
}

/// The guardian's record in the image directory, once it mentions `what`.
pub fn guardian_log(images: &Path, what: &str) -> String {
    let path = images.join("gpu-guardian.log");
    // A minute: putting back a large process on a loaded machine, or a GPU's 4 GiB.
    let found = crate::wait_until(std::time::Duration::from_secs(60), || {
        fs::read_to_string(&path).is_ok_and(|l| l.contains(what))
    });
    let text = fs::read_to_string(&path).unwrap_or_default();
    assert!(found, "the guardian did not log {what:?}: {text}");
    text
}

/// A CRIU action script in `dir` that SIGKILLs CRIU (its parent) at `action`.
pub fn killing_script(dir: &Path, action: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("kill-at-{action}.sh"));
    fs::write(
        &path,
        format!(
            "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = '{action}' ] && kill -9 $PPID\nexit 0\n"
        ),
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// The guardian processes (named `criu-gpu-guard`) of CRIU runs on machine `m`: forked from a
/// CRIU started with the machine's environment, which names its scratch directory.
pub fn guardians(m: &impl Machine) -> Vec<i32> {
    let ours = m.scratch().display().to_string();
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "criu-gpu-guard")
                && fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&ours))
                && crate::pid_alive(*pid)
        })
        .collect()
}

/// Waits until the guardians of machine `m` have done all they do alone and ended: only then
/// does a process they must not have killed prove anything by being alive.
pub fn wait_guardians_gone(m: &impl Machine) {
    let gone = crate::wait_until(std::time::Duration::from_secs(30), || {
        guardians(m).is_empty()
    });
    assert!(gone, "guardians {:?} did not end", guardians(m));
}
