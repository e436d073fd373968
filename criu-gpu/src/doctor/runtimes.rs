//! The container runtimes, and whether the network lock their CRIU takes is one this node can
//! take.

use std::path::Path;
use std::process::Command;

use criu_gpu_host::netlock::{NetworkLock, NodeLocks, CRIU_DEFAULT};

use super::{ok, problem, Finding, Status};
use crate::runtime_conf::{self, LockSetting};

pub(super) fn runtimes(criu: Option<&Path>) -> Vec<Finding> {
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
fn network_lock(
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
