//! `criu-gpu doctor`: is this node ready to checkpoint and restore GPU processes? Each check
//! says what it found and, when something is wrong, the fix.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::criu_bin;
use crate::human::bytes;
use crate::out;
use crate::runtime_conf::{self, LockSetting};
use criu_gpu_host::netlock::{NetworkLock, NodeLocks, CRIU_DEFAULT};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        check,
        status: Status::Ok,
        detail: detail.into(),
        fix: None,
    }
}

fn problem(
    check: &'static str,
    status: Status,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check,
        status,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

/// Where to look, and which libraries to load.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub driver: Option<String>,
    pub nvml: Option<String>,
    /// Directories checkpoint images will be written to.
    pub image_dirs: Vec<PathBuf>,
}

pub fn run(opts: &Options) -> Vec<Finding> {
    let mut f = vec![privileges()];
    f.extend(criu());
    let criu = criu_bin::find_criu();
    let (gpu, used) = gpus(opts);
    f.extend(gpu);
    f.push(huge_pages());
    f.push(ptrace());
    f.push(seccomp());
    f.extend(runtimes(criu.as_deref()));
    f.extend(space(opts, used));
    f
}

pub fn print(findings: &[Finding]) {
    for x in findings {
        let tag = match x.status {
            Status::Ok => "ok  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        out::line(format!("{tag}  {:<9} {}", x.check, x.detail));
        if let Some(fix) = &x.fix {
            out::line(format!("      {:<9} fix: {fix}", ""));
        }
    }
    let fails = findings.iter().filter(|x| x.status == Status::Fail).count();
    let warns = findings.iter().filter(|x| x.status == Status::Warn).count();
    out::line(match fails {
        0 => format!("this node is ready ({warns} warning(s))"),
        n => format!("this node is NOT ready: {n} problem(s) to fix, {warns} warning(s)"),
    });
}

/// Effective capabilities of this process, from /proc/self/status.
fn capabilities() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

fn privileges() -> Finding {
    const SYS_PTRACE: u64 = 1 << 19;
    const SYS_ADMIN: u64 = 1 << 21;
    let caps = capabilities();
    if !rustix::process::geteuid().is_root() {
        return problem(
            "root",
            Status::Fail,
            "not running as root",
            "CRIU checkpoints and restores as root: run criu-gpu (and criu) with sudo",
        );
    }
    if caps & (SYS_PTRACE | SYS_ADMIN) != SYS_PTRACE | SYS_ADMIN {
        return problem(
            "root",
            Status::Fail,
            format!("root without CAP_SYS_ADMIN and CAP_SYS_PTRACE (CapEff {caps:x}): a restricted container?"),
            "run it on the host, or in a privileged container (securityContext.privileged: true)",
        );
    }
    ok("root", "root with CAP_SYS_ADMIN and CAP_SYS_PTRACE")
}

/// The plugin directory CRIU uses: a `lib` line of its settings, else its default.
fn plugin_dir() -> (PathBuf, String) {
    for conf in ["/etc/criu/default.conf", "/etc/criu/runc.conf"] {
        if let Ok(text) = std::fs::read_to_string(conf) {
            if let Some(dir) = text.lines().find_map(|l| l.trim().strip_prefix("lib ")) {
                return (PathBuf::from(dir.trim()), format!("from {conf}"));
            }
        }
    }
    (PathBuf::from("/usr/lib/criu"), "CRIU's default".into())
}

fn criu() -> Vec<Finding> {
    let Some(bin) = criu_bin::find_criu() else {
        return vec![problem(
            "criu",
            Status::Fail,
            "criu not found (PATH, /usr/local/sbin, /usr/sbin)",
            "sudo scripts/install.sh (installs CRIU 4.2.1 when the system's is older)",
        )];
    };
    let (dir, why) = plugin_dir();
    let mut f = vec![criu_version(&bin), plugin(&dir, &why)];
    f.extend(older_criu_reading(&dir, &bin));
    f.extend(other_gpu_plugins(&dir));
    f
}

/// Whether the CRIU found has the device hooks the plugin needs (4.0), and is the tested 4.2.
fn criu_version(bin: &Path) -> Finding {
    match criu_bin::version_of(bin) {
        None => problem(
            "criu",
            Status::Fail,
            format!("{} does not answer --version", bin.display()),
            "reinstall CRIU: sudo scripts/install-criu.sh",
        ),
        Some((major, _, v)) if major < 4 => problem(
            "criu",
            Status::Fail,
            format!(
                "{} is CRIU {v}: it has no device hooks for GPU plugins",
                bin.display()
            ),
            "install CRIU 4.2 or later: sudo scripts/install-criu.sh (puts it in /usr/local/sbin)",
        ),
        Some((4, minor, v)) if minor < 2 => problem(
            "criu",
            Status::Warn,
            format!("{} is CRIU {v}", bin.display()),
            "CRIU 4.2 or later is what this project tests: sudo scripts/install-criu.sh",
        ),
        Some((_, _, v)) => ok("criu", format!("{} (CRIU {v})", bin.display())),
    }
}

/// The plugin in CRIU's plugin directory, and that it is one (its descriptor symbol).
fn plugin(dir: &Path, why: &str) -> Finding {
    let plugin = dir.join("criu_gpu_plugin.so");
    match std::fs::read(&plugin) {
        Err(e) => problem(
            "plugin",
            Status::Fail,
            format!(
                "{}: {e} (plugin directory {}, {why})",
                plugin.display(),
                dir.display()
            ),
            "sudo scripts/install.sh installs it there",
        ),
        Ok(elf) if !contains(&elf, b"CR_PLUGIN_DESC") => problem(
            "plugin",
            Status::Fail,
            format!(
                "{} is not a CRIU plugin (no CR_PLUGIN_DESC symbol)",
                plugin.display()
            ),
            "reinstall it: sudo scripts/install.sh",
        ),
        Ok(_) => ok("plugin", format!("{} ({why})", plugin.display())),
    }
}

/// A distribution's older CRIU reads the same plugin directory: it refuses a plugin with more
/// hooks than it knows ("Corrupted plugin"), and with it every command.
fn older_criu_reading(dir: &Path, bin: &Path) -> Vec<Finding> {
    let mut f = Vec::new();
    for c in ["/usr/sbin/criu", "/usr/bin/criu"].map(PathBuf::from) {
        if c == bin {
            continue;
        }
        if let Some((_, _, v)) = criu_bin::version_of(&c).filter(|(m, _, _)| *m < 4) {
            f.push(problem(
                "criu",
                Status::Warn,
                format!(
                    "{} is CRIU {v}, older than 4.0: it loads {} too and fails on \
                     criu_gpu_plugin.so (\"Corrupted plugin\")",
                    c.display(),
                    dir.display()
                ),
                format!(
                    "remove that package, or give it another plugin directory (CRIU_LIBS_DIR); \
                     {} is the one to use",
                    bin.display()
                ),
            ));
        }
    }
    f
}

/// Other GPU plugins beside ours: CRIU offers a GPU process to the first that takes it.
fn other_gpu_plugins(dir: &Path) -> Vec<Finding> {
    let mut f = Vec::new();
    for other in ["cuda_plugin.so", "amdgpu_plugin.so"] {
        if dir.join(other).exists() {
            f.push(problem(
                "plugin",
                Status::Warn,
                format!(
                    "{} is installed too: CRIU offers GPU processes to plugins in directory order",
                    dir.join(other).display()
                ),
                format!(
                    "remove {} so that criu_gpu handles every GPU process",
                    dir.join(other).display()
                ),
            ));
        }
    }
    f
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Driver and GPUs; returns the GPU memory in use (what a checkpoint of everything writes).
fn gpus(opts: &Options) -> (Vec<Finding>, u64) {
    use cuda_checkpoint_ctl::driver::Driver;
    use cuda_checkpoint_ctl::inventory::Inventory;
    let mut f = Vec::new();
    let kfd = Path::new("/dev/kfd").exists();
    let mut used = 0;
    match Driver::load(opts.driver.as_deref()) {
        Ok(d) => {
            let info = d.info().clone();
            f.push(match &info.simulated {
                Some(_) => problem("driver", Status::Warn, format!("{info}"), "this is the SIMULATED driver: fine for tests, not for real GPUs; unset CUDA_CKPT_LIBCUDA / --driver"),
                None => ok("driver", format!("{info}")),
            });
            match Inventory::query(opts.nvml.as_deref()) {
                Ok(inv) if inv.gpus.is_empty() => f.push(problem("GPUs", Status::Fail, format!("NVML (driver {}) sees no GPU", inv.driver_version), "check `nvidia-smi`; in a container, pass the GPUs in (NVIDIA container toolkit)")),
                Ok(inv) => {
                    for g in &inv.gpus {
                        used += g.memory_used;
                        f.push(ok("GPU", format!("{} {} {}: {} used, {} free", g.index, g.uuid, g.name, bytes(g.memory_used), bytes(g.memory_free))));
                    }
                    f.push(host_memory(&inv));
                }
                Err(e) => f.push(problem("GPUs", Status::Fail, e.to_string(), "NVML ships with the NVIDIA driver (libnvidia-ml.so.1): install the driver, or name the library with --nvml PATH / CUDA_CKPT_LIBNVML")),
            }
        }
        Err(e) if kfd => f.push(problem("driver", Status::Warn, format!("no CUDA driver ({e})"), "nothing to do on an AMD-only node")),
        Err(e) => f.push(problem("driver", Status::Fail, e.to_string(), "install the NVIDIA driver (r570 or later) or the amdgpu driver; or name the library with --driver PATH")),
    }
    if kfd {
        f.push(
            match amd_kfd::topology::Topology::parse(&amd_kfd::topology::Topology::default_root()) {
                Ok(t) => ok(
                    "AMD",
                    format!(
                        "/dev/kfd, {} GPU node(s) in the KFD topology",
                        t.gpus().count()
                    ),
                ),
                Err(e) => problem(
                    "AMD",
                    Status::Fail,
                    e.to_string(),
                    "load the amdgpu driver (modprobe amdgpu)",
                ),
            },
        );
    }
    (f, used)
}

/// Whether host memory can take the device memory of the GPU processes running now, which their
/// checkpoint copies there all at once (the rule the plugin and `criu-gpu dump` apply).
fn host_memory(inv: &cuda_checkpoint_ctl::inventory::Inventory) -> Finding {
    use process_facts::process::{self, memory::Room};
    use process_facts::refusal::{self, DeviceMemory};
    let mut processes: Vec<DeviceMemory> = Vec::new();
    for u in &inv.processes {
        let bytes = u.memory.unwrap_or(0);
        match processes.iter_mut().find(|p| p.pid == u.pid) {
            Some(p) => p.bytes += bytes,
            None => processes.push(DeviceMemory {
                pid: u.pid,
                comm: process::comm(u.pid).unwrap_or_default(),
                bytes,
            }),
        }
    }
    let pids: Vec<i32> = processes.iter().map(|p| p.pid).collect();
    let room = Room::of(&pids);
    if let Some(r) = refusal::host_memory(&processes, &room) {
        return problem("memory", Status::Fail, r.what(), r.fix(""));
    }
    let held: u64 = processes.iter().map(|p| p.bytes).sum();
    let available = room
        .available
        .map_or("MemAvailable unreadable".into(), |a| {
            format!("{} available (MemAvailable)", bytes(a))
        });
    ok(
        "memory",
        format!(
            "{available}: the {} GPU process(es) hold {} of device memory, which their \
             checkpoint copies into host memory; it fits, also below their memory cgroups' limits",
            processes.len(),
            bytes(held)
        ),
    )
}

/// The node's transparent huge page policy: what a GPU checkpoint gains from `always`, and a
/// policy left raised by a guardian that died.
fn huge_pages() -> Finding {
    use criu_gpu_host::thp::{Policy, Thp};
    let thp = Thp::default();
    let state = thp.state();
    let policy = match thp.policy() {
        Ok(p) => p,
        Err(e) => {
            return problem(
                "huge pages",
                Status::Warn,
                e.to_string(),
                "GPU checkpoints run with 4 KiB pages (about 1.7x slower on an H200)",
            )
        }
    };
    match (policy, state.original) {
        (Policy::Always, Some(orig)) if state.holders.is_empty() => problem(
            "huge pages",
            Status::Warn,
            format!(
                "transparent huge pages are at always, left raised by a GPU checkpoint whose \
                 guardian ended without putting back {}",
                orig.as_str()
            ),
            format!(
                "echo {} > {}/enabled (the next checkpoint also puts it back)",
                orig.as_str(),
                criu_gpu_host::thp::SYSFS
            ),
        ),
        (Policy::Always, _) => ok(
            "huge pages",
            "transparent huge pages at always: GPU checkpoints fill memory in 2 MiB pages",
        ),
        (Policy::Madvise, _) => ok(
            "huge pages",
            "transparent huge pages at madvise: the plugin raises them to always for the seconds \
             of a GPU checkpoint (1.7x faster on an H200) and puts madvise back \
             (CRIU_GPU_THP=off to leave them alone)",
        ),
        (Policy::Never, _) => problem(
            "huge pages",
            Status::Warn,
            "transparent huge pages at never: GPU checkpoints fault in 4 KiB pages (about 1.7x \
             slower on an H200); the plugin leaves an administrator's never alone",
            "set CRIU_GPU_THP=always in /etc/criu/gpu-plugin.conf to raise them for the \
             checkpoints only, or accept the slower checkpoints",
        ),
    }
}

fn ptrace() -> Finding {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").map(|s| s.trim().to_owned())
    {
        Ok(s) if s == "3" => problem(
            "ptrace",
            Status::Fail,
            "kernel.yama.ptrace_scope=3: ptrace is off until reboot, CRIU cannot seize processes",
            "set kernel.yama.ptrace_scope=1 in /etc/sysctl.d and reboot",
        ),
        Ok(s) => ok(
            "ptrace",
            format!("kernel.yama.ptrace_scope={s} (root may seize processes)"),
        ),
        Err(_) => ok("ptrace", "no Yama restrictions"),
    }
}

fn seccomp() -> Finding {
    let mode = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Seccomp:"))
                .map(|v| v.trim().to_owned())
        });
    match mode.as_deref() {
        Some("2") => problem(
            "seccomp",
            Status::Warn,
            "this process runs under a seccomp filter (a container's default profile?); CRIU started from here inherits it",
            "run on the host, or the DaemonSet with seccompProfile: Unconfined and privileged: true",
        ),
        _ => ok("seccomp", "no seccomp filter"),
    }
}

fn runtimes(criu: Option<&Path>) -> Vec<Finding> {
    let mut f = Vec::new();
    let version = |tool: &str| -> Option<String> {
        let out = Command::new(tool).arg("--version").output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // The runtimes whose checkpoints go through CRIU, each with the settings file it hands it.
    let mut checkpointing = Vec::new();
    if let Some(v) = version("runc") {
        let first = v.lines().next().unwrap_or("runc").to_owned();
        f.push(match std::fs::read_to_string("/etc/criu/runc.conf") {
            Ok(conf) if conf.lines().any(|l| l.trim_start().starts_with("timeout")) => ok("runc", format!("{first}; /etc/criu/runc.conf sets a timeout")),
            Ok(_) => problem("runc", Status::Warn, format!("{first}; /etc/criu/runc.conf has no `timeout` line: CRIU gives seizing 10 s"), "add `timeout 600` (see container-hooks/criu/runc.conf)"),
            Err(_) => problem("runc", Status::Warn, format!("{first}; no /etc/criu/runc.conf"), "install container-hooks/criu/runc.conf as /etc/criu/runc.conf (scripts/install.sh does)"),
        });
        checkpointing.push(runtime_conf::RUNTIMES[0]);
    }
    if let Some(v) = version("crun") {
        f.push(if v.contains("+CRIU") {
            checkpointing.push(runtime_conf::RUNTIMES[1]);
            ok("crun", "crun with CRIU support")
        } else {
            problem(
                "crun",
                Status::Warn,
                "crun is built without CRIU: checkpoints through it fail",
                "use runc for GPU containers (podman --runtime runc; runtime = \"runc\")",
            )
        });
    }
    if let (Some(criu), false) = (criu, checkpointing.is_empty()) {
        let node = NodeLocks::probe(criu);
        for (runtime, conf) in checkpointing {
            let conf = Path::new(conf);
            let (setting, from) =
                runtime_conf::effective(conf, Path::new(runtime_conf::DEFAULT_CONF));
            f.push(network_lock(runtime, conf, setting.as_ref(), &from, node));
        }
    }
    if let Some(v) = version("containerd") {
        f.push(ok(
            "containerd",
            v.lines().next().unwrap_or("containerd").to_owned(),
        ));
    }
    f.push(if Path::new(criu_gpu_host::settings::CONFIG_FILE).exists() {
        ok("settings", format!("{} (read by every criu the runtimes start)", criu_gpu_host::settings::CONFIG_FILE))
    } else {
        problem(
            "settings",
            Status::Warn,
            format!("no {}: runtimes start criu without your environment, so CRIU_GPU_* settings cannot reach the plugin", criu_gpu_host::settings::CONFIG_FILE),
            "install container-hooks/gpu-plugin.conf there (scripts/install.sh does)",
        )
    });
    f
}

/// Whether the network lock a runtime's CRIU will take (`setting` read from `from`, else CRIU's
/// default) is one this node can take. CRIU locks the network of every container with a
/// network namespace of its own (Podman's `--network none` too) after the GPU checkpoint: a
/// lock it cannot take fails the checkpoint there.
pub fn network_lock(
    runtime: &str,
    conf: &Path,
    setting: Option<&LockSetting>,
    from: &str,
    node: NodeLocks,
) -> Finding {
    const CHECK: &str = "net lock";
    let conf = conf.display();
    let fix_for = |own: bool| match node.choose() {
        Some(c) if own => format!(
            "set `network-lock {c}` in {conf} (that line is an administrator's own: \
             criu-gpu runtime-config leaves it alone)"
        ),
        Some(c) => format!(
            "sudo criu-gpu runtime-config (writes `network-lock {c}` into {}; \
             scripts/install.sh runs it)",
            runtime_conf::RUNTIMES.map(|(_, f)| f).join(" and ")
        ),
        None => NodeLocks::NO_LOCK_FIX.to_owned(),
    };
    let own = setting.is_some_and(|s| !s.managed) && from == conf.to_string();
    let lock = match setting {
        None => CRIU_DEFAULT,
        Some(s) => match s.lock {
            Some(l) => l,
            None => {
                return problem(
                    CHECK,
                    Status::Fail,
                    format!(
                        "{runtime}: `network-lock {}` in {from} is no method CRIU knows: CRIU \
                         refuses the file, and every checkpoint through {runtime} fails",
                        s.value
                    ),
                    fix_for(own),
                )
            }
        },
    };
    if node.can_take(lock) {
        let note = if lock == NetworkLock::Skip {
            ": no lock, packets of restored TCP connections may be lost"
        } else {
            ""
        };
        return ok(
            CHECK,
            format!("{runtime}: CRIU locks container networks with {lock} ({from}), which this node can take{note}"),
        );
    }
    problem(
        CHECK,
        Status::Fail,
        format!(
            "{runtime}: CRIU would lock container networks with {lock} ({from}), but {}: the \
             checkpoint of a container with a network namespace of its own fails after its GPU \
             checkpoint",
            node.why_not(lock)
        ),
        fix_for(own),
    )
}

/// Free space where images go, against the GPU memory in use (which a checkpoint writes out).
fn space(opts: &Options, gpu_used: u64) -> Vec<Finding> {
    let dirs: Vec<PathBuf> = if opts.image_dirs.is_empty() {
        [
            "/var/lib/kubelet/checkpoints",
            "/var/lib/containers",
            "/var/lib/containerd",
        ]
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .chain([std::env::temp_dir()])
        .collect()
    } else {
        opts.image_dirs.clone()
    };
    dirs.into_iter()
        .map(|d| match rustix::fs::statvfs(&d) {
            Err(e) => problem("space", Status::Fail, format!("{}: {e}", d.display()), "create it, or name another directory with --images DIR"),
            Ok(s) => {
                let free = s.f_bavail * s.f_frsize;
                let text = format!("{}: {} free; GPU memory in use {}", d.display(), bytes(free), bytes(gpu_used));
                if free < gpu_used {
                    problem("space", Status::Fail, text, "free space there: a checkpoint writes at least the GPU memory in use, plus the processes' own memory")
                } else if free < gpu_used.saturating_mul(2) {
                    problem("space", Status::Warn, text, "a checkpoint also writes the processes' host memory; keep twice the GPU memory free")
                } else {
                    ok("space", text)
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU_NODE: NodeLocks = NodeLocks {
        nftables: true,
        iptables: false,
    };

    fn setting(value: &str, managed: bool) -> LockSetting {
        LockSetting {
            value: value.into(),
            lock: NetworkLock::parse(value),
            managed,
        }
    }

    #[test]
    fn criu_s_default_iptables_without_its_tools_is_a_problem_with_its_fix() {
        let conf = Path::new("/etc/criu/runc.conf");
        let f = network_lock("runc", conf, None, "CRIU's default", GPU_NODE);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.detail.contains("iptables (CRIU's default)")
                && f.detail.contains("ip6tables-restore is missing"),
            "{}",
            f.detail
        );
        let fix = f.fix.unwrap();
        assert!(
            fix.contains("criu-gpu runtime-config") && fix.contains("network-lock nftables"),
            "{fix}"
        );
        // The same from default.conf.
        let s = setting("iptables", false);
        let f = network_lock("runc", conf, Some(&s), "/etc/criu/default.conf", GPU_NODE);
        assert_eq!(f.status, Status::Fail);
        assert!(f.fix.unwrap().contains("criu-gpu runtime-config"));
    }

    #[test]
    fn an_administrator_s_own_setting_gets_a_fix_by_hand() {
        let conf = Path::new("/etc/criu/crun.conf");
        let s = setting("iptables", false);
        let f = network_lock("crun", conf, Some(&s), "/etc/criu/crun.conf", GPU_NODE);
        assert_eq!(f.status, Status::Fail);
        let fix = f.fix.unwrap();
        assert!(
            fix.starts_with("set `network-lock nftables` in /etc/criu/crun.conf"),
            "{fix}"
        );
        let s = setting("nft", false);
        let f = network_lock("crun", conf, Some(&s), "/etc/criu/crun.conf", GPU_NODE);
        assert_eq!(f.status, Status::Fail);
        assert!(f.detail.contains("no method CRIU knows"), "{}", f.detail);
    }

    #[test]
    fn a_lock_the_node_can_take_is_fine() {
        let conf = Path::new("/etc/criu/runc.conf");
        let s = setting("nftables", true);
        let f = network_lock("runc", conf, Some(&s), "/etc/criu/runc.conf", GPU_NODE);
        assert_eq!(f.status, Status::Ok, "{}", f.detail);
        let ipt = NodeLocks {
            nftables: false,
            iptables: true,
        };
        assert_eq!(
            network_lock("runc", conf, None, "CRIU's default", ipt).status,
            Status::Ok
        );
        let f = network_lock("runc", conf, Some(&s), "/etc/criu/runc.conf", ipt);
        assert_eq!(f.status, Status::Fail);
        assert!(f.fix.unwrap().contains("runtime-config"));
        let none = NodeLocks::default();
        let f = network_lock("runc", conf, None, "CRIU's default", none);
        assert_eq!(f.fix.unwrap(), NodeLocks::NO_LOCK_FIX);
        let skip = setting("skip", false);
        let f = network_lock("runc", conf, Some(&skip), "/etc/criu/runc.conf", none);
        assert_eq!(f.status, Status::Ok);
    }
}
