//! `criu-gpu restore DIR --listen [ADDR:]PORT`: the receiving side of a move. It answers the
//! sender's preflight (GPUs with the room, pids, the directory) before the sender freezes
//! anything; takes the images into DIR; starts CRIU's lazy-pages daemon on the pages connection
//! and CRIU's restore (`--lazy-pages --pages-before-resume`), which restores the tree while the
//! pages arrive and puts every one in place before the tasks resume; the GPU driver's restore
//! reads its data as it comes. The sender's job ends only once this restore got that far; a
//! restore that fails leaves nothing here (CRIU kills what it restored) and the job running
//! there.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criu_gpu_host::settings::declared::DEVICE_MAP;

use super::net;
use super::preflight::{self, Preflight};
use super::report::{self, Landed, Landing};
use super::wire::{Msg, Role, Wire, VERSION};
use super::MigrateError;
use crate::job::record::JobRecord;
use crate::job::{self, run, JobError, Request, RestoreHow};
use crate::out;

/// How long the sender may take to open the pages connection after the preflight.
const PAGES_WAIT: Duration = Duration::from_secs(30);
/// How long CRIU's lazy-pages daemon may take to get ready, or to end after the restore.
const DAEMON_WAIT: Duration = Duration::from_secs(30);

/// Waits on `listen` for one move and restores it into `r.dir`.
pub fn receive(
    listen: &str,
    how: &RestoreHow,
    r: &Request,
    limit: Duration,
) -> Result<Landed, JobError> {
    let criu = job::criu(r)?;
    if let Some(p) = super::streams_pages(&criu) {
        return Err(JobError::Refused(vec![p]));
    }
    let settings = job::restore::with_device_map(how, &r.settings);
    let request = settings
        .get(&DEVICE_MAP)
        .map_err(|e| MigrateError::Usage(e.to_string()))?;
    let addr = net::listen_addr(listen).map_err(MigrateError::Usage)?;
    let listener = TcpListener::bind(addr).map_err(|e| MigrateError::Listen(listen.into(), e))?;
    out::line(format!(
        "move: waiting on {addr} for `criu-gpu dump PID DIR --to THIS-NODE:{}` (at most {} s)",
        addr.port(),
        limit.as_secs()
    ));
    let deadline = Instant::now() + limit;
    let (mut wire, id) = control(&listener, deadline)?;
    let lost = |e: std::io::Error| MigrateError::Lost(e.to_string());
    let pre = match wire.recv().map_err(lost)? {
        Msg::Preflight(p) => p,
        other => return Err(MigrateError::Lost(format!("unexpected {other:?}")).into()),
    };
    let verdict = preflight::check(&pre, &request, job::libnvml(&settings).as_deref(), &r.dir);
    say_offer(&pre, &verdict);
    wire.send(&Msg::Verdict(verdict.clone())).map_err(lost)?;
    if !verdict.problems.is_empty() || r.dry_run {
        return Err(MigrateError::Refused {
            host: verdict.host,
            problems: verdict.problems,
        }
        .into());
    }
    let pages = pages(&listener, &id, Instant::now() + PAGES_WAIT)?;
    let images_in = images(&mut wire, &r.dir, deadline)?;
    // What CRIU restored comes to this process if CRIU dies (SIGKILL included), so that a
    // failed restore leaves nothing of the job here.
    let adopts = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    let landed = restore(
        &criu,
        (&pre, &verdict.device_map),
        how,
        r,
        pages,
        &mut wire,
        limit,
    );
    let landed = landed.map(|mut l| {
        l.times.images_in = Some(images_in);
        l
    });
    let word = match &landed {
        Ok(l) => l.clone(),
        Err(e) => Landed {
            host: verdict.host.clone(),
            error: Some(e.to_string()),
            ..Landed::default()
        },
    };
    if !word.ok {
        leave_nothing(adopts.is_ok());
    }
    let _ = wire.send(&Msg::Landed(Box::new(word.clone())));
    match landed {
        Ok(l) if l.ok => Ok(l),
        Ok(_) => Err(MigrateError::Failed(word.error.unwrap_or_default()).into()),
        Err(e) => Err(e),
    }
}

/// After a failed restore: kills what CRIU left of the tree (a CRIU that was killed leaves its
/// restored tasks to this process, its subreaper; one that failed killed them itself).
fn leave_nothing(adopted: bool) {
    use process_facts::process;
    let me = std::process::id() as i32;
    let left: Vec<i32> = process::children(me)
        .into_iter()
        .flat_map(process::tree)
        .collect();
    for pid in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    if !left.is_empty() {
        out::line(format!(
            "move: killed {} process(es) a failed restore left here",
            left.len()
        ));
    } else if !adopted {
        tracing::warn!("could not become the restore's subreaper: a killed CRIU may leave tasks");
    }
}

/// The sender's control connection, greeted.
fn control(listener: &TcpListener, deadline: Instant) -> Result<(Wire, String), JobError> {
    let s = net::accept(listener, deadline).map_err(|e| MigrateError::NoSender(e.to_string()))?;
    let hello = read_hello(&s).map_err(|e| MigrateError::Lost(e.to_string()))?;
    let (role, id) = hello;
    if role != Role::Control {
        return Err(
            MigrateError::Lost("the first connection was not the control one".into()).into(),
        );
    }
    Ok((
        Wire::new(s).map_err(|e| MigrateError::Lost(e.to_string()))?,
        id,
    ))
}

/// The pages connection of move `id`.
fn pages(listener: &TcpListener, id: &str, deadline: Instant) -> Result<TcpStream, JobError> {
    let s = net::accept(listener, deadline).map_err(|e| MigrateError::NoSender(e.to_string()))?;
    match read_hello(&s) {
        Ok((Role::Pages, got)) if got == id => Ok(s),
        Ok(_) => Err(MigrateError::Lost("a connection of another move came in".into()).into()),
        Err(e) => Err(MigrateError::Lost(e.to_string()).into()),
    }
}

/// The hello line, read a byte at a time: what follows on the pages connection is CRIU's.
fn read_hello(mut s: &TcpStream) -> std::io::Result<(Role, String)> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 4096 {
        s.read_exact(&mut b)?;
        if b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
    }
    s.set_read_timeout(None)?;
    match serde_json::from_slice(&line) {
        Ok(Msg::Hello { version, role, id }) if version == VERSION => Ok((role, id)),
        Ok(Msg::Hello { version, .. }) => Err(std::io::Error::other(format!(
            "the sender speaks version {version} of the move, this criu-gpu {VERSION}: run the \
             same release on both nodes"
        ))),
        _ => Err(std::io::Error::other("not a criu-gpu move")),
    }
}

fn say_offer(pre: &Preflight, v: &preflight::Verdict) {
    out::line(format!(
        "move: {} offers {} process(es) holding {} of GPU memory",
        pre.host,
        pre.processes.len(),
        crate::human::bytes(pre.gpu_bytes())
    ));
    v.notes.iter().for_each(|n| out::line(format!("  {n}")));
    v.problems
        .iter()
        .for_each(|p| out::line(format!("problem: {p}")));
}

/// The images, once the sender froze the job and wrote them; when they were in.
fn images(wire: &mut Wire, dir: &Path, deadline: Instant) -> Result<f64, JobError> {
    let lost = |e: std::io::Error| MigrateError::Lost(e.to_string());
    let left = deadline.saturating_duration_since(Instant::now());
    wire.read_limit(Some(left.max(Duration::from_secs(1))))
        .map_err(lost)?;
    let bytes = match wire.recv().map_err(lost)? {
        Msg::Images { bytes } => bytes,
        Msg::GaveUp { why } => return Err(MigrateError::GaveUp(why).into()),
        other => return Err(MigrateError::Lost(format!("unexpected {other:?}")).into()),
    };
    std::fs::create_dir_all(dir).map_err(|source| JobError::Io {
        what: "creating the image directory".into(),
        source,
    })?;
    let files = wire.recv_dir(bytes, dir).map_err(lost)?;
    out::line(format!(
        "move: {files} image files in {} ({}); the pages follow",
        dir.display(),
        crate::human::bytes(bytes)
    ));
    Ok(report::now())
}

/// CRIU's lazy-pages daemon on `pages` and CRIU's restore; how it ended.
fn restore(
    criu: &Path,
    (pre, device_map): (&Preflight, &str),
    how: &RestoreHow,
    r: &Request,
    pages: TcpStream,
    wire: &mut Wire,
    limit: Duration,
) -> Result<Landed, JobError> {
    let io = |what: &'static str| {
        move |source| JobError::Io {
            what: what.into(),
            source,
        }
    };
    let rec = JobRecord::read(&r.dir)?.unwrap_or(JobRecord {
        root: 0,
        members: Vec::new(),
        listeners: Vec::new(),
        restore_args: pre.restore_args.clone(),
        dumped_at: 0,
    });
    let daemon_started = report::now();
    let mut daemon = start_daemon(criu, &r.dir, &pages, r.verbose)
        .map_err(io("starting CRIU's lazy-pages daemon"))?;
    // The daemon holds the connection alone: when it goes, the sender sees it at once.
    drop(pages);
    wire.send(&Msg::Restoring)
        .map_err(|e| MigrateError::Lost(e.to_string()))?;
    // The received images are this node's own copy: the restore writes beside them.
    let mut args = job::restore::restore_args(&rec, r, &r.dir);
    args.extend(["--lazy-pages", "--pages-before-resume"].map(str::to_owned));
    let mut env = Vec::new();
    if !device_map.is_empty() {
        env.push((DEVICE_MAP.key.to_owned(), device_map.to_owned()));
    }
    if let Some(map) = how.address_map.as_ref().filter(|m| !m.is_empty()) {
        env.push(job::restore::address_map_env(map));
    }
    out::line(format!(
        "running: {}",
        job::full_command(criu, &args).join(" ")
    ));
    let _ = std::fs::remove_file(r.dir.join("restore.pid"));
    let started = report::now();
    let log = r.dir.join("restore.log");
    let lazy = r.dir.join("lazy.log");
    let ran = run::criu(criu, &args, &env, &log, "restoring", limit);
    end_daemon(&mut daemon);
    let ran = ran.map_err(io("running criu"))?;
    let root = std::fs::read_to_string(r.dir.join("restore.pid"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    let landed = Landed {
        ok: ran.ok,
        host: super::super::cluster::hostname(),
        root: root.filter(|_| ran.ok),
        error: (!ran.ok).then(|| first_errors(&ran)),
        times: Landing {
            images_in: None,
            restore: Some(started),
            late_hooks: report::logged_at(&log, started, "Run late stage hook"),
            all_in: report::logged_at(&lazy, daemon_started, "after the first request"),
            resumed: report::logged_at(&log, started, "Restore finished successfully"),
        },
        stream: report::logged_line(&lazy, "after the first request")
            .and_then(|l| report::logged_line_from(&l, "lazy-pages: ")),
    };
    say_landed(&landed, &ran, &r.dir);
    Ok(landed)
}

/// `criu lazy-pages` on the pages connection, ready to take the restore's userfaultfds.
fn start_daemon(
    criu: &Path,
    dir: &Path,
    pages: &TcpStream,
    verbose: bool,
) -> std::io::Result<Child> {
    let fd = net::inheritable(pages)?;
    let (ready_r, ready_w): (OwnedFd, OwnedFd) = rustix::pipe::pipe()?;
    rustix::io::fcntl_setfd(&ready_w, rustix::io::FdFlags::empty())?;
    let mut child = Command::new(criu)
        .args(["lazy-pages", "--page-server", "--pages-before-resume", "-D"])
        .arg(dir)
        .args(["--ps-socket", &fd.to_string()])
        .args(["--status-fd", &ready_w.as_raw_fd().to_string()])
        .args([if verbose { "-v4" } else { "-v3" }, "-o", "lazy.log"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    drop(ready_w);
    // The daemon writes one byte once its socket listens, or closes the pipe when it fails.
    let mut poll = [rustix::event::PollFd::new(
        &ready_r,
        rustix::event::PollFlags::IN,
    )];
    let timeout = rustix::time::Timespec {
        tv_sec: DAEMON_WAIT.as_secs() as i64,
        tv_nsec: 0,
    };
    let polled = rustix::event::poll(&mut poll, Some(&timeout)).unwrap_or(0);
    let mut b = [0u8; 1];
    let got = (polled == 1).then(|| std::fs::File::from(ready_r).read(&mut b));
    if !matches!(got, Some(Ok(1))) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other(format!(
            "it did not get ready (its log: {})",
            dir.join("lazy.log").display()
        )));
    }
    Ok(child)
}

/// Once the restore ended: the daemon ends by itself (it committed, or lost the restore);
/// one that does not within [`DAEMON_WAIT`] is stopped.
fn end_daemon(child: &mut Child) {
    let start = Instant::now();
    while start.elapsed() < DAEMON_WAIT {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// What a failed restore's log says first (its last lines only say that it failed), and how
/// CRIU ended.
fn first_errors(ran: &run::Ran) -> String {
    let firsts: Vec<&str> = ran
        .errors
        .iter()
        // Said by every CRIU run without CAP_SYS_RESOURCE, and harmless.
        .filter(|e| !e.contains("RLIMIT_NOFILE"))
        .map(|e| e.split_once("): ").map_or(e.as_str(), |(_, m)| m))
        .take(2)
        .collect();
    format!("criu restore: {}; {}", ran.status, firsts.join("; "))
}

fn say_landed(l: &Landed, ran: &run::Ran, dir: &Path) {
    if l.ok {
        out::line(format!(
            "moved here: the job runs, its root is pid {} ({:.1} s after its images came)",
            l.root.map_or("?".into(), |p| p.to_string()),
            ran.took.as_secs_f64()
        ));
        if let Some(s) = &l.stream {
            out::line(format!("  {s}"));
        }
    } else {
        out::line(format!(
            "the move failed here ({}): nothing of the job was left on this node, and it runs \
             on at the sender. CRIU's logs: {}, {}",
            l.error.as_deref().unwrap_or("?"),
            dir.join("restore.log").display(),
            dir.join("lazy.log").display()
        ));
    }
}
