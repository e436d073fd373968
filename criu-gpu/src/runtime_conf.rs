//! CRIU's settings files for container runtimes: runc hands CRIU `/etc/criu/runc.conf` (Podman
//! with runc, containerd, CRI-O), crun `/etc/criu/crun.conf`. What CRIU reads of them here: the
//! network lock. `criu-gpu runtime-config` writes the method this node can take
//! ([`criu_gpu_host::netlock`]) on a line of its own, marked, and changes nothing else: a file that does
//! not exist starts from the project's template, an administrator's own `network-lock` line is
//! left as it is (and reported when the node cannot take it). `criu-gpu doctor` reads the method
//! a runtime's CRIU will use and says whether the node can take it.

pub mod command;

use std::path::{Path, PathBuf};

use serde::Serialize;

use criu_gpu_host::netlock::{NetworkLock, NodeLocks};

/// CRIU's settings for every run (read first; a runtime's file overrides it).
pub const DEFAULT_CONF: &str = "/etc/criu/default.conf";
/// The runtimes that hand CRIU a settings file, and that file.
pub const RUNTIMES: [(&str, &str); 2] = [
    ("runc", "/etc/criu/runc.conf"),
    ("crun", "/etc/criu/crun.conf"),
];
/// The project's settings for runtime-driven checkpoints (container-hooks/criu/runc.conf): what
/// a file that does not exist yet starts from.
pub const TEMPLATE: &str = include_str!("../../container-hooks/criu/runc.conf");
/// The comment line above the line `runtime-config` manages.
pub const MARKER: &str =
    "# criu-gpu: the network lock this node can take (criu-gpu runtime-config \
                          rewrites the next line; delete both lines to set your own)";
const MARKER_PREFIX: &str = "# criu-gpu: the network lock";
/// Stands for the managed line where the node can take no method.
const NONE_LINE: &str = "# network-lock: none this node can take";

/// The `network-lock` setting of a settings file: the last one counts, as in CRIU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockSetting {
    /// As written.
    pub value: String,
    /// `None`: a value CRIU does not know (it refuses the whole file).
    pub lock: Option<NetworkLock>,
    /// Written by `runtime-config` (on the line after [`MARKER`]).
    pub managed: bool,
}

/// CRIU's settings are `option value` lines; `#` starts a comment.
fn option_value(line: &str) -> Option<(&str, &str)> {
    let line = line.split('#').next()?.trim();
    let (opt, value) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    (!opt.is_empty()).then_some((opt, value.trim()))
}

/// The `network-lock` setting of a settings file's text, if it has one.
pub fn lock_setting(text: &str) -> Option<LockSetting> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let (opt, value) = option_value(l)?;
            (opt == "network-lock").then(|| LockSetting {
                value: value.to_owned(),
                lock: NetworkLock::parse(value),
                managed: i > 0 && lines[i - 1].starts_with(MARKER_PREFIX),
            })
        })
        .next_back()
}

/// The method a runtime's CRIU will use, and where it comes from: its own file, else CRIU's
/// default.conf, else CRIU's built-in default.
pub fn effective(runtime_conf: &Path, default_conf: &Path) -> (Option<LockSetting>, String) {
    for conf in [runtime_conf, default_conf] {
        if let Some(s) = std::fs::read_to_string(conf)
            .ok()
            .and_then(|t| lock_setting(&t))
        {
            return (Some(s), conf.display().to_string());
        }
    }
    (None, "CRIU's default".into())
}

/// What `runtime-config` did to one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Outcome {
    /// The file did not exist: the template with the managed line.
    Created { lock: Option<NetworkLock> },
    /// The managed line was added or changed.
    Set {
        lock: Option<NetworkLock>,
        was: Option<String>,
    },
    /// The managed line already said this.
    Unchanged { lock: Option<NetworkLock> },
    /// An administrator's own `network-lock` line: left as it is.
    Own { value: String, takeable: bool },
}

impl Outcome {
    /// A problem the operator must fix: no method at all, or an own setting this node cannot
    /// take.
    pub fn is_problem(&self) -> bool {
        match self {
            Outcome::Created { lock } | Outcome::Set { lock, .. } | Outcome::Unchanged { lock } => {
                lock.is_none()
            }
            Outcome::Own { takeable, .. } => !takeable,
        }
    }
}

/// The managed line for `lock`.
fn managed_line(lock: Option<NetworkLock>) -> String {
    match lock {
        Some(l) => format!("network-lock {l}"),
        None => format!(
            "{NONE_LINE} ({}): checkpoints of containers with a network namespace fail",
            NodeLocks::NO_LOCK_FIX
        ),
    }
}

/// The new text of a settings file (`None`: leave it as it is) and what was done. `text` is its
/// text now (`None`: it does not exist), `choice` what [`NodeLocks::choose`] answered.
pub fn update(
    text: Option<&str>,
    template: &str,
    choice: Option<NetworkLock>,
    node: NodeLocks,
) -> (Option<String>, Outcome) {
    let Some(text) = text else {
        let mut t = template.trim_end().to_owned();
        t.push_str(&format!("\n{MARKER}\n{}\n", managed_line(choice)));
        return (Some(t), Outcome::Created { lock: choice });
    };
    if let Some(own) = lock_setting(text).filter(|s| !s.managed) {
        let takeable = own.lock.is_some_and(|l| node.can_take(l));
        return (
            None,
            Outcome::Own {
                value: own.value,
                takeable,
            },
        );
    }
    let want = managed_line(choice);
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let was = match lines.iter().position(|l| l.starts_with(MARKER_PREFIX)) {
        Some(m) => {
            let next = lines.get(m + 1).map(String::as_str).unwrap_or("");
            let ours = next.starts_with("network-lock") || next.starts_with(NONE_LINE);
            if ours && next == want {
                return (None, Outcome::Unchanged { lock: choice });
            }
            lines[m] = MARKER.to_owned();
            if ours {
                Some(std::mem::replace(&mut lines[m + 1], want))
            } else {
                lines.insert(m + 1, want);
                None
            }
        }
        None => {
            lines.push(MARKER.to_owned());
            lines.push(want);
            None
        }
    };
    let mut t = lines.join("\n");
    t.push('\n');
    (Some(t), Outcome::Set { lock: choice, was })
}

/// One file's result, for the command's output.
#[derive(Debug, Clone, Serialize)]
pub struct FileResult {
    pub file: PathBuf,
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl FileResult {
    /// One line for the operator.
    pub fn describe(&self, node: NodeLocks) -> String {
        let f = self.file.display();
        let lock = |l: &Option<NetworkLock>| match l {
            Some(l) => format!("network-lock {l}"),
            None => "no network lock (this node can take none)".to_owned(),
        };
        match &self.outcome {
            Outcome::Created { lock: l } => format!("{f}: written, {}", lock(l)),
            Outcome::Set { lock: l, was: None } => format!("{f}: {} added", lock(l)),
            Outcome::Set {
                lock: l,
                was: Some(w),
            } => format!("{f}: {} (was `{w}`)", lock(l)),
            Outcome::Unchanged { lock: l } => format!("{f}: unchanged, {}", lock(l)),
            Outcome::Own { value, takeable } if *takeable => {
                format!(
                    "{f}: left as it is (its own `network-lock {value}`, which this node can take)"
                )
            }
            Outcome::Own { value, .. } => {
                let why = NetworkLock::parse(value)
                    .map_or("CRIU does not know that method and refuses the file", |l| {
                        node.why_not(l)
                    });
                format!(
                    "{f}: WARNING: left as it is, but its own `network-lock {value}` cannot be \
                     taken here ({why}); {}",
                    match node.choose() {
                        Some(c) => format!("set `network-lock {c}` there"),
                        None => NodeLocks::NO_LOCK_FIX.to_owned(),
                    }
                )
            }
        }
    }
}

/// Writes the network lock `node` can take into each file (atomically: a temporary file and a
/// rename). `template`: what a missing file starts from.
pub fn apply(
    files: &[PathBuf],
    template: &str,
    node: NodeLocks,
    dry_run: bool,
) -> std::io::Result<Vec<(FileResult, Option<String>)>> {
    let choice = node.choose();
    let mut done = Vec::new();
    for file in files {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", file.display()),
                ))
            }
        };
        let (new, outcome) = update(text.as_deref(), template, choice, node);
        if let (Some(new), false) = (&new, dry_run) {
            write_atomically(file, new)?;
        }
        done.push((
            FileResult {
                file: file.clone(),
                outcome,
            },
            new,
        ));
    }
    Ok(done)
}

fn write_atomically(file: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let ctx = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", file.display()));
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(ctx)?;
    }
    let mode = std::fs::metadata(file).map_or(0o644, |m| m.permissions().mode());
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = file.with_file_name(format!(".{}.criu-gpu", name.unwrap_or_default()));
    std::fs::write(&tmp, text).map_err(ctx)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).map_err(ctx)?;
    std::fs::rename(&tmp, file).map_err(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use criu_gpu_host::netlock::CRIU_DEFAULT;

    const GPU_NODE: NodeLocks = NodeLocks {
        nftables: true,
        iptables: false,
    };
    const IPT_NODE: NodeLocks = NodeLocks {
        nftables: false,
        iptables: true,
    };

    fn run(text: Option<&str>, node: NodeLocks) -> (Option<String>, Outcome) {
        update(text, TEMPLATE, node.choose(), node)
    }

    #[test]
    fn a_missing_file_gets_the_template_and_the_lock_this_node_can_take() {
        let (new, outcome) = run(None, GPU_NODE);
        let new = new.unwrap();
        assert!(new.starts_with(TEMPLATE.trim_end()), "{new}");
        assert!(
            new.ends_with(&format!("{MARKER}\nnetwork-lock nftables\n")),
            "{new}"
        );
        assert_eq!(
            outcome,
            Outcome::Created {
                lock: Some(NetworkLock::Nftables)
            }
        );
        let s = lock_setting(&new).unwrap();
        assert!(s.managed);
        assert_eq!(s.lock, Some(NetworkLock::Nftables));
        // Run again: nothing to do.
        assert_eq!(
            run(Some(&new), GPU_NODE),
            (
                None,
                Outcome::Unchanged {
                    lock: Some(NetworkLock::Nftables)
                }
            )
        );
    }

    #[test]
    fn an_existing_file_gets_only_the_managed_lines_and_keeps_the_rest() {
        let admin = "lib /opt/plugins\n# mine\ntimeout 900\n";
        let (new, outcome) = run(Some(admin), GPU_NODE);
        let new = new.unwrap();
        assert_eq!(
            new,
            format!("lib /opt/plugins\n# mine\ntimeout 900\n{MARKER}\nnetwork-lock nftables\n")
        );
        assert!(matches!(outcome, Outcome::Set { was: None, .. }));
        // The node changes (iptables only now): the managed line follows, nothing else moves.
        let (newer, outcome) = run(Some(&new), IPT_NODE);
        assert_eq!(
            newer.unwrap(),
            format!("lib /opt/plugins\n# mine\ntimeout 900\n{MARKER}\nnetwork-lock iptables\n")
        );
        assert_eq!(
            outcome,
            Outcome::Set {
                lock: Some(NetworkLock::Iptables),
                was: Some("network-lock nftables".into())
            }
        );
    }

    #[test]
    fn an_administrator_s_own_line_is_left_alone_and_judged() {
        let own = "timeout 600\nnetwork-lock iptables\n";
        let (new, outcome) = run(Some(own), GPU_NODE);
        assert_eq!(new, None);
        assert_eq!(
            outcome,
            Outcome::Own {
                value: "iptables".into(),
                takeable: false
            }
        );
        assert!(outcome.is_problem());
        let r = FileResult {
            file: "/etc/criu/runc.conf".into(),
            outcome,
        };
        let text = r.describe(GPU_NODE);
        assert!(
            text.contains("WARNING") && text.contains("set `network-lock nftables` there"),
            "{text}"
        );
        let (new, outcome) = run(Some(own), IPT_NODE);
        assert_eq!(new, None);
        assert!(!outcome.is_problem());
        // A value CRIU does not know.
        let (_, outcome) = run(Some("network-lock nft\n"), GPU_NODE);
        assert!(outcome.is_problem());
    }

    #[test]
    fn a_node_without_any_lock_gets_a_comment_saying_so() {
        let none = NodeLocks::default();
        let (new, outcome) = run(Some("timeout 600\n"), none);
        let new = new.unwrap();
        assert!(new.contains(NONE_LINE), "{new}");
        assert_eq!(lock_setting(&new), None, "CRIU reads no network-lock line");
        assert!(outcome.is_problem());
        // Once iptables is installed, the same line becomes the setting.
        let (newer, _) = run(Some(&new), IPT_NODE);
        let newer = newer.unwrap();
        assert!(!newer.contains(NONE_LINE));
        assert_eq!(
            lock_setting(&newer).unwrap().lock,
            Some(NetworkLock::Iptables)
        );
        assert_eq!(newer.matches(MARKER_PREFIX).count(), 1);
    }

    #[test]
    fn settings_are_read_as_criu_reads_them() {
        assert_eq!(lock_setting("# network-lock iptables\ntimeout 5\n"), None);
        let s = lock_setting("network-lock iptables\nnetwork-lock   nftables  # why\n").unwrap();
        assert_eq!(s.lock, Some(NetworkLock::Nftables));
        assert!(!s.managed);
    }

    #[test]
    fn the_effective_method_comes_from_the_runtime_s_file_then_default_conf() {
        let dir = tempfile::tempdir().unwrap();
        let (rt, def) = (
            dir.path().join("runc.conf"),
            dir.path().join("default.conf"),
        );
        assert_eq!(effective(&rt, &def), (None, "CRIU's default".into()));
        std::fs::write(&def, "network-lock skip\n").unwrap();
        let (s, from) = effective(&rt, &def);
        assert_eq!(s.unwrap().lock, Some(NetworkLock::Skip));
        assert_eq!(from, def.display().to_string());
        std::fs::write(&rt, "timeout 600\nnetwork-lock nftables\n").unwrap();
        let (s, from) = effective(&rt, &def);
        assert_eq!(s.unwrap().lock, Some(NetworkLock::Nftables));
        assert_eq!(from, rt.display().to_string());
        assert_eq!(CRIU_DEFAULT, NetworkLock::Iptables);
    }

    #[test]
    fn apply_writes_files_atomically_and_keeps_their_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("etc/criu/runc.conf");
        let b = dir.path().join("crun.conf");
        std::fs::write(&b, "timeout 600\n").unwrap();
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o600)).unwrap();
        let files = vec![a.clone(), b.clone()];
        let dry = apply(&files, TEMPLATE, GPU_NODE, true).unwrap();
        assert!(!a.exists(), "a dry run writes nothing");
        assert!(dry[0].1.as_ref().unwrap().contains("network-lock nftables"));
        apply(&files, TEMPLATE, GPU_NODE, false).unwrap();
        assert!(std::fs::read_to_string(&a)
            .unwrap()
            .contains("network-lock nftables"));
        assert_eq!(
            std::fs::metadata(&b).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            2,
            "no temporary left"
        );
    }
}
