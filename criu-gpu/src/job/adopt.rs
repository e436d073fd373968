//! What a failed restore left running, seen rather than assumed. `criu-gpu` is the child
//! subreaper of the restores it runs: a CRIU that dies (SIGKILL included) hands what it forked
//! to `criu-gpu`: the plugin's guardian (which kills a half-restored tree), CRIU's helpers, and
//! the restored processes. `criu-gpu` waits for the guardian, ends what cannot go on without
//! CRIU, then looks at what is still alive.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use process_facts::process;

/// How long CRIU's forks may take to end once CRIU is gone: the guardian's kills (it gives up
/// after 60 s), the project's CRIU's helper putting the last deferred pages in place (CRIU
/// itself waits 2 minutes for it, and 4 s a GiB).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(120);
/// The plugin's guardian, as its process is named (criu-plugin/src/guardian/sys.rs).
const GUARDIAN: &str = "criu-gpu-guard";
/// The guardian's record, in the restore's work directory (criu-plugin/src/guardian/machine.rs).
const GUARDIAN_LOG: &str = "gpu-guardian.log";

/// This process, made the subreaper of the CRIU it runs next.
pub struct Adopter {
    adopts: bool,
}

/// What a failed restore left.
pub enum Left {
    /// Nothing of the restore runs; `ended`: what the killed CRIU had left that could not go on
    /// without it (its helpers, tasks it had not made the job's yet), ended here.
    Nothing { ended: Vec<(i32, String)> },
    /// Processes of the restore that run the job's program, with their names.
    Job(Vec<(i32, String)>),
    /// Processes that still run CRIU's program while the job runs, or do not end, long after
    /// CRIU ended.
    Stuck(Vec<(i32, String)>),
    /// This process is not a subreaper: what a killed CRIU left is not known here.
    Unknown,
}

/// Makes this process the subreaper of what it runs from now on.
pub fn adopt() -> Adopter {
    let me = rustix::process::getpid();
    Adopter {
        adopts: rustix::process::set_child_subreaper(Some(me)).is_ok(),
    }
}

impl Adopter {
    /// Once `criu` has ended (and was reaped; `program`: the program it ran as, where seen): waits for the plugin's guardian to finish, then
    /// for what the CRIU forked to run its program no more, reaps what died, and says what is
    /// left. With nothing of the job running, a process still running CRIU's program can do
    /// nothing without CRIU (a helper it left stopped, a task it had not made the job's yet):
    /// it is ended. While the job runs, one may be putting the job's last pages in place
    /// (patch 0007's helper, which ends by itself): it is waited for.
    pub fn left(&self, criu: &Path, program: Option<&Path>) -> Left {
        if !self.adopts {
            return Left::Unknown;
        }
        let me = std::process::id() as i32;
        let criu = program.map_or_else(
            || criu.canonicalize().unwrap_or_else(|_| criu.to_owned()),
            Path::to_path_buf,
        );
        let deadline = Instant::now() + SETTLE_LIMIT;
        while guardian_runs(me) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let (now, ended) = settle(me, &criu, deadline);
        reap_ended(me);
        let named = |l: Vec<i32>| l.into_iter().map(|p| (p, process::name(p))).collect();
        let criu_own: Vec<i32> = now.criu_own.into_iter().chain(now.dying).collect();
        match (now.job.is_empty(), criu_own.is_empty()) {
            (true, true) => Left::Nothing { ended },
            (_, false) => Left::Stuck(named(criu_own)),
            (false, true) => Left::Job(named(now.job)),
        }
    }
}

/// What was handed to this process, by what it runs.
struct Adopted {
    /// Running another program than CRIU's: the job's.
    job: Vec<i32>,
    /// Running CRIU's program.
    criu_own: Vec<i32>,
    /// On their way out: a thread of theirs has not ended yet.
    dying: Vec<i32>,
}

/// Waits, until `deadline`, for the processes running CRIU's program and the dying ones to end;
/// with nothing of the job running, ends those running CRIU's program. Returns what is left and
/// what it ended.
fn settle(me: i32, criu: &Path, deadline: Instant) -> (Adopted, Vec<(i32, String)>) {
    let mut ended: Vec<(i32, String)> = Vec::new();
    loop {
        let now = adopted(me, criu);
        let settled = now.criu_own.is_empty() && now.dying.is_empty();
        if settled || Instant::now() > deadline {
            return (now, ended);
        }
        if now.job.is_empty() {
            for p in &now.criu_own {
                if !ended.iter().any(|(e, _)| e == p) {
                    ended.push((*p, process::name(*p)));
                    let _ = nix::sys::signal::kill(Pid::from_raw(*p), Signal::SIGKILL);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reaps every child of `me` whose threads have all ended, until none is left (a process's
/// children come to `me` as it dies): their pids are free for the next restore. Only those:
/// never a child someone else waits for.
fn reap_ended(me: i32) {
    loop {
        let done: Vec<i32> = process::children(me)
            .into_iter()
            .filter(|p| all_ended(*p))
            .collect();
        if done.is_empty() {
            return;
        }
        for p in done {
            let _ = waitpid(Pid::from_raw(p), Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// Whether the plugin's guardian, handed to `me`, still runs.
fn guardian_runs(me: i32) -> bool {
    process::children(me)
        .into_iter()
        .any(|p| process::comm(p).as_deref() == Some(GUARDIAN) && !all_ended(p))
}

/// The processes handed to `me`, and theirs, that have not all ended.
fn adopted(me: i32, criu: &Path) -> Adopted {
    let mut a = Adopted {
        job: Vec::new(),
        criu_own: Vec::new(),
        dying: Vec::new(),
    };
    let tree = process::children(me).into_iter().flat_map(process::tree);
    for p in tree.filter(|p| !all_ended(*p)) {
        if process::is_zombie(p) || process::is_dying(p) {
            a.dying.push(p);
        } else if exe(p).as_deref() == Some(criu) {
            a.criu_own.push(p);
        } else {
            a.job.push(p);
        }
    }
    a
}

/// Whether every thread of process `pid` has ended: a zombie leader's other threads may still
/// be on their way out, holding their ids.
fn all_ended(pid: i32) -> bool {
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    !process::exists(pid) || (process::is_zombie(pid) && threads <= 1)
}

fn exe(pid: i32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// Where the guardian's record of this restore starts: its end before CRIU ran.
pub fn guardian_log_end(work: &Path) -> u64 {
    std::fs::metadata(work.join(GUARDIAN_LOG)).map_or(0, |m| m.len())
}

/// The guardian's lines since `from` (it writes them once CRIU is gone), without their stamps.
pub fn guardian_lines(work: &Path, from: u64) -> Vec<String> {
    let text = std::fs::read(work.join(GUARDIAN_LOG)).unwrap_or_default();
    let new = text.get(from as usize..).unwrap_or_default();
    String::from_utf8_lossy(new)
        .lines()
        .map(|l| l.split_once(": ").map_or(l, |(_, text)| text).to_owned())
        .collect()
}
