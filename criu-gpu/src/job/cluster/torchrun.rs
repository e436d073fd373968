//! torchrun's agents and their liveness. An agent of a dynamic rendezvous (`--rdzv-backend
//! c10d`) keeps its node alive by writing a wall-clock heartbeat into the rendezvous state every
//! 5 s, and each agent, at every read of the state (`_sanitize`, after each fetch), drops every
//! node whose heartbeat is more than 3 keep-alives (15 s) old: from the participants, and its own
//! keep-alives stop for good when that is itself (it finds no heartbeat of its own to renew). The
//! state lives in the TCPStore that node 0's agent serves, so it is dumped and restored with the
//! job, its heartbeats as old as the dump. A job restored more than 15 s after its dump (or a
//! snapshot frozen that long) would therefore, at each agent's first read, have every node
//! declared dead (torch 2.11 and 2.15 alike: docs/design.md).
//!
//! The answer, with no change to the job: the restore leaves every node's processes stopped;
//! on the node that serves the store, every thread of that agent but the store's is held
//! ([`super::hold`]), the store alone runs, and a helper run by the agent's own Python, through
//! the job's own store and torch's own rendezvous backend, sets every node's heartbeat to now
//! (a compare-and-set, as the agents write it); then every node's processes go on. No agent
//! runs between the restore and the fresh heartbeats.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A torchrun agent of a dynamic rendezvous whose state is in a TCPStore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agent {
    pub pid: i32,
    /// The rendezvous store: `--rdzv-endpoint` HOST and PORT.
    pub host: String,
    pub port: u16,
    /// `--rdzv-id`.
    pub run_id: String,
}

/// torchrun's default port of a rendezvous endpoint without one.
const DEFAULT_PORT: u16 = 29400;
/// torchrun's options that take no value.
const FLAGS: [&str; 6] = [
    "standalone",
    "no-python",
    "module",
    "run-path",
    "virtual-local-rank",
    "use-env",
];

/// The torchrun agents among `pids` whose rendezvous is c10d (the static one keeps no
/// heartbeats; etcd-v2 keeps its state outside the job: docs/known-limits.md).
pub fn agents(pids: &[i32]) -> Vec<Agent> {
    pids.iter()
        .filter_map(|&pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            parse(pid, &args)
        })
        .collect()
}

fn is_launcher(arg: &str) -> bool {
    arg == "torchrun"
        || arg.ends_with("/torchrun")
        || arg == "torch.distributed.run"
        || arg.ends_with("torch/distributed/run.py")
}

/// torchrun's options from its command line (`--rdzv-backend X`, `--rdzv_backend=X`, ...),
/// up to the training script.
fn parse(pid: i32, args: &[String]) -> Option<Agent> {
    let start = args.iter().position(|a| is_launcher(a))? + 1;
    let mut opts = std::collections::HashMap::new();
    let mut i = start;
    while i < args.len() {
        let a = &args[i];
        let Some(name) = a.strip_prefix("--") else {
            match a.as_str() {
                "-m" => i += 1,
                "-r" | "-t" => i += 2,
                _ => break, // the training script
            }
            continue;
        };
        let (name, value) = match name.split_once('=') {
            Some((n, v)) => (n.replace('_', "-"), Some(v.to_owned())),
            None => (name.replace('_', "-"), None),
        };
        let flag = FLAGS.contains(&name.as_str());
        let value = value.or_else(|| {
            let v = args
                .get(i + 1)
                .filter(|v| !flag && !v.starts_with('-'))
                .cloned();
            if v.is_some() {
                i += 1;
            }
            v
        });
        opts.insert(name, value.unwrap_or_default());
        i += 1;
    }
    if opts.get("rdzv-backend").map(String::as_str) != Some("c10d") {
        return None;
    }
    let endpoint = opts.get("rdzv-endpoint")?;
    let (host, port) = match endpoint.rsplit_once(':') {
        Some((h, p)) => (h.to_owned(), p.parse().ok()?),
        None => (endpoint.clone(), DEFAULT_PORT),
    };
    Some(Agent {
        pid,
        host: host.trim_matches(['[', ']']).to_owned(),
        port,
        run_id: opts
            .get("rdzv-id")
            .cloned()
            .unwrap_or_else(|| "none".into()),
    })
}

/// Sets every node's heartbeat in the rendezvous state to now, through torch's own backend and
/// the job's own store; one line in ("refresh"), one out per refresh.
const SCRIPT: &str = r#"
import datetime, pickle, sys
from datetime import timedelta, timezone
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
host, port, run_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
backend = C10dRendezvousBackend(store, run_id)
print("ready", flush=True)
for _ in sys.stdin:
    said = "failed: the rendezvous state kept changing under 20 tries"
    for _try in range(20):
        got = backend.get_state()
        if got is None:
            said = "no rendezvous state " + run_id
            break
        state = pickle.loads(got[0])
        now = datetime.datetime.now(timezone.utc)
        ages = ["%s %.1f s" % (n, (now - t).total_seconds()) for n, t in state.last_heartbeats.items()]
        for n in list(state.last_heartbeats):
            state.last_heartbeats[n] = now
        done = backend.set_state(pickle.dumps(state), got[1])
        if done is not None and done[2]:
            said = "ok: heartbeats were " + ", ".join(ages) + " old; now fresh"
            break
    print(said, flush=True)
"#;

/// How long the helper may take to start (importing torch on a busy host) and to answer.
const START: Duration = Duration::from_secs(180);
const ANSWER: Duration = Duration::from_secs(60);

/// A helper run by the agent's own Python that refreshes the heartbeats on request.
pub struct Refresher {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Refresher {
    /// Starts the helper for `agent` (its Python, its environment) and waits until it reached
    /// the store.
    pub fn start(agent: &Agent) -> Result<Refresher, String> {
        let env = environ(agent.pid);
        let python = python_of(agent.pid, &env)?;
        let mut child = Command::new(&python)
            .args([
                "-c",
                SCRIPT,
                &agent.host,
                &agent.port.to_string(),
                &agent.run_id,
            ])
            .env_clear()
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{} cannot be run: {e}", python.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let lines = reader(child.stdout.take().ok_or("no stdout")?);
        let r = Refresher {
            child,
            stdin,
            lines,
        };
        match r.lines.recv_timeout(START) {
            Ok(l) if l == "ready" => Ok(r),
            Ok(l) => Err(format!("the rendezvous helper said {l:?}")),
            Err(_) => Err(format!(
                "the rendezvous helper ({}) did not reach the store {}:{} within {} s",
                python.display(),
                agent.host,
                agent.port,
                START.as_secs()
            )),
        }
    }

    /// Every node's heartbeat set to now; what the helper saw.
    pub fn refresh(&mut self) -> Result<String, String> {
        self.stdin
            .write_all(b"refresh\n")
            .map_err(|e| format!("the rendezvous helper went away: {e}"))?;
        match self.lines.recv_timeout(ANSWER) {
            Ok(l) if l.starts_with("ok: ") => Ok(l[4..].to_owned()),
            Ok(l) => Err(l),
            Err(_) => Err("the rendezvous helper did not answer".into()),
        }
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn reader(out: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line.trim().to_owned()).is_err() {
                return;
            }
        }
    });
    rx
}

fn environ(pid: i32) -> Vec<(String, String)> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// The agent's interpreter as it was started (argv[0], found on its PATH), so that its
/// virtual environment and its torch are the ones the helper imports.
fn python_of(pid: i32, env: &[(String, String)]) -> Result<PathBuf, String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 =
        String::from_utf8_lossy(raw.split(|b| *b == 0).next().unwrap_or_default()).into_owned();
    if argv0.starts_with('/') {
        return Ok(argv0.into());
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("/usr/bin:/bin", |(_, v)| v.as_str());
    path.split(':')
        .map(|d| PathBuf::from(d).join(&argv0))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("torchrun's interpreter {argv0:?} is not on its PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn reads_torchrun_as_users_write_it() {
        let a = parse(
            7,
            &args(
                "/v/bin/python3 /v/bin/torchrun --nnodes 2 --rdzv-backend c10d \
                 --rdzv_endpoint=10.0.0.1:29500 --rdzv-id job --standalone train.py --rdzv-id x",
            ),
        )
        .unwrap();
        assert_eq!(
            a,
            Agent {
                pid: 7,
                host: "10.0.0.1".into(),
                port: 29500,
                run_id: "job".into()
            }
        );
        let a = parse(
            1,
            &args("python -m torch.distributed.run --rdzv-backend=c10d --rdzv-endpoint h t.py"),
        )
        .unwrap();
        assert_eq!(
            (a.host.as_str(), a.port, a.run_id.as_str()),
            ("h", 29400, "none")
        );
        // The static rendezvous keeps no heartbeats; a training script is not torchrun.
        assert!(parse(1, &args("torchrun --nnodes 2 --master-addr h t.py")).is_none());
        assert!(parse(1, &args("python3 train.py --rdzv-backend c10d")).is_none());
    }
}
