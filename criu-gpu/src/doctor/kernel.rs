//! The kernel and this process: root with the capabilities CRIU needs, ptrace allowed, no
//! seccomp filter in the way, and the transparent huge page policy a GPU checkpoint gains from.

use super::{ok, problem, Finding, Status};

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

pub(super) fn privileges() -> Finding {
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

/// The node's transparent huge page policy: what a GPU checkpoint gains from `always`, and a
/// policy left raised by a guardian that died.
pub(super) fn huge_pages() -> Finding {
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

pub(super) fn ptrace() -> Finding {
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

pub(super) fn seccomp() -> Finding {
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
