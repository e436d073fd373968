//! The node's transparent huge page policy during a GPU checkpoint.
//!
//! The driver's checkpoint writes a process's device memory into fresh memory of the process;
//! with THP at `madvise` (the usual default) that memory comes in 4 KiB pages, and faulting them
//! in is most of the checkpoint's time: an 8 GiB checkpoint took 6.13 s and 4.92 s at `madvise`
//! and 3.29 s and 3.22 s at `always` on an H200 (docs/driver-facts.md, F14). The kernel has no
//! per-process "always" (prctl only disables THP, and process_madvise cannot set MADV_HUGEPAGE),
//! so the node's policy is raised for the seconds the checkpoint takes and put back after.
//!
//! Several dumps may run on a node at once: a state file under [`RUN_DIR`], read and written
//! under an flock, holds the policy to put back and the pids of the guardians that raised it; the
//! last one out puts it back. A holder that died is dropped the next time anyone looks.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// Where the kernel shows and takes the policy.
pub const SYSFS: &str = "/sys/kernel/mm/transparent_hugepage";
/// Where the raisers keep their state.
pub const RUN_DIR: &str = "/run/criu-gpu";
const STATE: &str = "thp.state";
const LOCK: &str = "thp.lock";

/// The policies of `enabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Always,
    Madvise,
    Never,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Always => "always",
            Policy::Madvise => "madvise",
            Policy::Never => "never",
        }
    }

    fn parse(word: &str) -> Option<Policy> {
        Some(match word {
            "always" => Policy::Always,
            "madvise" => Policy::Madvise,
            "never" => Policy::Never,
            _ => return None,
        })
    }
}

/// What the setting `CRIU_GPU_THP` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Want {
    /// Raise `madvise` to `always` for the checkpoint; leave `never` (an administrator's choice).
    #[default]
    Auto,
    /// Raise `madvise` and `never` to `always` for the checkpoint.
    Always,
    /// Never touch the policy.
    Off,
}

impl std::str::FromStr for Want {
    type Err = String;
    /// `auto`, `always`, or off as any switch is written off (`off`, `0`, `no`, `false`, in
    /// any case: [`process_facts::units::switch`]).
    fn from_str(v: &str) -> Result<Want, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Want::Auto),
            "always" => Ok(Want::Always),
            _ if process_facts::units::switch(v) == Some(false) => Ok(Want::Off),
            _ => Err("auto, always or off (or 0, no, false)".into()),
        }
    }
}

/// What a raise did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Raised {
    /// The policy was raised from `from` to always (by this holder, or it already was by another
    /// and this one joined).
    From(String),
    /// Left as it was (`always` already, `never` under `auto`, or `off`): nothing to put back.
    Untouched(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ThpError {
    #[error("transparent huge pages cannot be read or set here ({path}: {source})")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} holds no policy this plugin knows: {text:?}")]
    Unknown { path: String, text: String },
}

/// The policy knob and the shared state, at their usual places or elsewhere (tests).
#[derive(Debug, Clone)]
pub struct Thp {
    pub sysfs: PathBuf,
    pub run_dir: PathBuf,
}

impl Default for Thp {
    fn default() -> Thp {
        Thp {
            sysfs: PathBuf::from(SYSFS),
            run_dir: PathBuf::from(RUN_DIR),
        }
    }
}

/// Who holds the policy raised, and what to put back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub original: Option<Policy>,
    pub holders: Vec<i32>,
}

impl State {
    fn parse(text: &str) -> State {
        let mut s = State::default();
        for line in text.lines() {
            match line.split_once('=') {
                Some(("original", v)) => s.original = Policy::parse(v.trim()),
                Some(("holder", v)) => s.holders.extend(v.trim().parse::<i32>()),
                _ => {}
            }
        }
        s
    }

    fn text(&self) -> String {
        let mut t = String::new();
        if let Some(o) = self.original {
            t.push_str(&format!("original={}\n", o.as_str()));
        }
        for h in &self.holders {
            t.push_str(&format!("holder={h}\n"));
        }
        t
    }
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

impl Thp {
    fn io(path: &Path) -> impl Fn(std::io::Error) -> ThpError + '_ {
        move |source| ThpError::Io {
            path: path.display().to_string(),
            source,
        }
    }

    /// The policy in force (the bracketed word of `enabled`).
    pub fn policy(&self) -> Result<Policy, ThpError> {
        let path = self.sysfs.join("enabled");
        let text = std::fs::read_to_string(&path).map_err(Self::io(&path))?;
        text.split_whitespace()
            .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
            .and_then(Policy::parse)
            .ok_or(ThpError::Unknown {
                path: path.display().to_string(),
                text: text.trim().to_owned(),
            })
    }

    fn set(&self, p: Policy) -> Result<(), ThpError> {
        let path = self.sysfs.join("enabled");
        std::fs::write(&path, p.as_str()).map_err(Self::io(&path))
    }

    /// The shared state, with holders that died dropped.
    pub fn state(&self) -> State {
        let mut s = std::fs::read_to_string(self.run_dir.join(STATE))
            .map(|t| State::parse(&t))
            .unwrap_or_default();
        s.holders.retain(|p| alive(*p));
        s
    }

    /// Runs `f` on the state under the lock, and writes back what it returns.
    fn locked<T>(
        &self,
        f: impl FnOnce(&Thp, &mut State) -> Result<T, ThpError>,
    ) -> Result<T, ThpError> {
        std::fs::create_dir_all(&self.run_dir).map_err(Self::io(&self.run_dir))?;
        let lock_path = self.run_dir.join(LOCK);
        let lock = File::create(&lock_path).map_err(Self::io(&lock_path))?;
        rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| Self::io(&lock_path)(e.into()))?;
        let mut state = self.state();
        let out = f(self, &mut state)?;
        let path = self.run_dir.join(STATE);
        if state.holders.is_empty() {
            let _ = std::fs::remove_file(&path);
        } else {
            let tmp = self.run_dir.join(".thp.state.new");
            File::create(&tmp)
                .and_then(|mut f| f.write_all(state.text().as_bytes()))
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(Self::io(&path))?;
        }
        Ok(out)
    }

    /// Raises the policy to `always` for `holder` (a guardian's pid), as `want` allows.
    pub fn raise(&self, want: Want, holder: i32) -> Result<Raised, ThpError> {
        self.locked(|thp, state| {
            let node = match state.original {
                Some(original) if !state.holders.is_empty() => {
                    // Raised by another dump: join it, so that the last one out puts it back.
                    state.holders.push(holder);
                    return Ok(Raised::From(original.as_str().to_owned()));
                }
                // Left raised by holders that died: that was the node's own policy.
                Some(original) => original,
                None => thp.policy()?,
            };
            let raise = match (want, node) {
                (Want::Off, _) | (_, Policy::Always) | (Want::Auto, Policy::Never) => false,
                (Want::Auto | Want::Always, _) => true,
            };
            if !raise {
                if state.original.take().is_some() {
                    thp.set(node)?;
                }
                return Ok(Raised::Untouched(node.as_str().to_owned()));
            }
            thp.set(Policy::Always)?;
            *state = State {
                original: Some(node),
                holders: vec![holder],
            };
            Ok(Raised::From(node.as_str().to_owned()))
        })
    }

    /// `holder` is done: the last holder out puts the original policy back. Returns the policy
    /// put back, if this call did.
    pub fn lower(&self, holder: i32) -> Result<Option<Policy>, ThpError> {
        self.locked(|thp, state| {
            state.holders.retain(|h| *h != holder);
            match state.original {
                Some(original) if state.holders.is_empty() => {
                    thp.set(original)?;
                    state.original = None;
                    Ok(Some(original))
                }
                _ => Ok(None),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(policy: &str) -> (tempfile::TempDir, Thp) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sys")).unwrap();
        std::fs::write(d.path().join("sys/enabled"), policy).unwrap();
        let thp = Thp {
            sysfs: d.path().join("sys"),
            run_dir: d.path().join("run"),
        };
        (d, thp)
    }

    /// The fake sysfs file takes the word written, as the kernel shows it afterwards.
    fn shown(thp: &Thp) -> String {
        std::fs::read_to_string(thp.sysfs.join("enabled")).unwrap()
    }

    /// `CRIU_GPU_THP` is off whenever the one boolean parser reads its value as off.
    #[test]
    fn off_is_any_switch_word_for_off() {
        for off in ["off", "OFF", "0", "no", "False", " off "] {
            assert_eq!(off.parse::<Want>(), Ok(Want::Off), "{off}");
        }
        assert_eq!("Auto".parse::<Want>(), Ok(Want::Auto));
        assert_eq!("always".parse::<Want>(), Ok(Want::Always));
        // An on word does not say which of auto and always.
        for bad in ["on", "1", "yes", "never", ""] {
            assert!(bad.parse::<Want>().is_err(), "{bad}");
        }
    }

    #[test]
    fn raised_for_the_checkpoint_and_put_back() {
        let (_d, thp) = node("always [madvise] never\n");
        assert_eq!(thp.policy().unwrap(), Policy::Madvise);
        let me = std::process::id() as i32;
        assert_eq!(
            thp.raise(Want::Auto, me).unwrap(),
            Raised::From("madvise".into())
        );
        assert_eq!(shown(&thp), "always");
        assert_eq!(thp.lower(me).unwrap(), Some(Policy::Madvise));
        assert_eq!(shown(&thp), "madvise");
        assert!(!thp.run_dir.join(STATE).exists());
    }

    #[test]
    fn never_and_always_are_left_alone_under_auto_and_off_touches_nothing() {
        let me = std::process::id() as i32;
        let (_d, thp) = node("always madvise [never]");
        assert_eq!(
            thp.raise(Want::Auto, me).unwrap(),
            Raised::Untouched("never".into())
        );
        assert_eq!(thp.lower(me).unwrap(), None);
        assert_eq!(shown(&thp), "always madvise [never]");
        assert_eq!(
            thp.raise(Want::Always, me).unwrap(),
            Raised::From("never".into())
        );
        assert_eq!(thp.lower(me).unwrap(), Some(Policy::Never));
        let (_d, thp) = node("always [madvise] never");
        assert!(matches!(
            thp.raise(Want::Off, me).unwrap(),
            Raised::Untouched(_)
        ));
        assert_eq!(shown(&thp), "always [madvise] never");
    }

    #[test]
    fn the_last_of_two_dumps_puts_it_back_and_dead_holders_do_not_count() {
        let (_d, thp) = node("always [madvise] never");
        let me = std::process::id() as i32;
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let them = other.id() as i32;
        thp.raise(Want::Auto, me).unwrap();
        // The second raiser sees "always" in sysfs but joins the first: madvise goes back.
        assert_eq!(
            thp.raise(Want::Auto, them).unwrap(),
            Raised::From("madvise".into())
        );
        assert_eq!(thp.lower(me).unwrap(), None);
        assert_eq!(shown(&thp), "always");
        // The other holder dies without lowering: the next look drops it, and the next dump
        // starts from the node's own policy, not from the "always" left behind.
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(thp.state().holders.is_empty());
        assert_eq!(thp.state().original, Some(Policy::Madvise));
        assert_eq!(
            thp.raise(Want::Auto, me).unwrap(),
            Raised::From("madvise".into())
        );
        assert_eq!(thp.lower(me).unwrap(), Some(Policy::Madvise));
        assert_eq!(shown(&thp), "madvise");
    }
}
