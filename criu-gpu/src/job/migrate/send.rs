//! `criu-gpu dump PID DIR --to HOST:PORT`: the sending side of a move. The receiver's preflight
//! answers before anything is frozen; then CRIU dumps the job lazily (`--lazy-pages`): every
//! image but the pages goes into DIR while the job is frozen, CRIU's post-dump action (criu-gpu)
//! sends them to the receiver, whose CRIU starts restoring at once, and CRIU serves the pages
//! over the second connection as the receiver's lazy-pages daemon asks for them. The job ends
//! here only once the receiver said it has every page and its GPU state back (the project's
//! CRIU, patch 0014); whatever fails before that, the dump fails and the job runs on here.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criu_gpu_host::settings::declared::MIGRATE;

use super::net;
use super::preflight::Preflight;
use super::report::{self, Landed, Leaving, Moved};
use super::stage::StageServer;
use super::wire::{Msg, Role, Wire, VERSION};
use super::MigrateError;
use crate::job::{self, plan::Plan, run, JobError, Request};
use crate::out;

/// How long the receiver may take to answer the preflight (it asks NVML).
const PREFLIGHT_WAIT: Duration = Duration::from_secs(60);
/// How long the receiver may take to unpack the images and start its CRIU.
const RESTORING_WAIT: Duration = Duration::from_secs(60);
/// How long the receiver may take to say how its restore ended, once this side's CRIU ended.
const LANDED_WAIT: Duration = Duration::from_secs(120);

/// Moves the job rooted at `pid` to the `criu-gpu restore --listen` at `to`.
pub fn send(pid: i32, to: &str, r: &Request, limit: Duration) -> Result<Moved, JobError> {
    let criu = job::criu(r)?;
    let facts = job::dump::read_job(pid, &r.settings)?;
    let mut plan = job::dump::dump_plan(&facts, &criu);
    plan.problems.extend(super::streams_pages(&criu));
    let plan = job::show_or_refuse(plan)?;
    let addr = net::resolve(to).map_err(MigrateError::Usage)?;
    let id = format!("{}-{}", std::process::id(), report::now());
    let mut wire = hello(addr, &id)?;
    let pre = Preflight::of(&facts, &plan, job::libnvml(&r.settings).as_deref());
    out::line(format!(
        "move: asking {to} to take {} process(es) holding {} of GPU memory",
        pre.processes.len(),
        crate::human::bytes(pre.gpu_bytes())
    ));
    let verdict = ask(&mut wire, pre)?;
    verdict
        .notes
        .iter()
        .for_each(|n| out::line(format!("  {}: {n}", verdict.host)));
    if r.dry_run {
        out::line(format!(
            "move: {} would take the job; nothing was done",
            verdict.host
        ));
        return Ok(Moved::default());
    }
    let pages = net::connect(addr, Duration::from_secs(10))
        .and_then(|s| say_hello(&s, Role::Pages, &id).map(|()| s))
        .map_err(|e| MigrateError::Connect(to.to_owned(), e))?;
    job::dump::record_before_criu(pid, &facts, &plan, &r.dir)?;
    let mut moved = Moved {
        to: format!("{} ({to})", verdict.host),
        ..Moved::default()
    };
    let wire = Arc::new(Mutex::new(wire));
    let sent = Arc::new(Mutex::new(None));
    let server = serve_images(&wire, &sent, &r.dir)?;
    let ran = dump(pid, r, &plan, &criu, &pages, &server, limit);
    drop(pages);
    moved.image_bytes = sent.lock().map_or(0, |s| s.map_or(0, |(b, _)| b));
    let images_sent = sent.lock().ok().and_then(|s| s.map(|(_, t)| t));
    let mut wire = wire
        .lock()
        .map_err(|_| MigrateError::Lost("a thread".into()))?;
    finish(&mut wire, ran, images_sent, &r.dir, &mut moved)?;
    Ok(moved)
}

/// The control connection, greeted.
fn hello(addr: SocketAddr, id: &str) -> Result<Wire, JobError> {
    let to = addr.to_string();
    let s = net::connect(addr, Duration::from_secs(10))
        .map_err(|e| MigrateError::Connect(to.clone(), e))?;
    say_hello(&s, Role::Control, id).map_err(|e| MigrateError::Connect(to.clone(), e))?;
    Ok(Wire::new(s).map_err(|e| MigrateError::Connect(to, e))?)
}

/// The first line on a connection (written in one go: the pages connection carries CRIU's
/// protocol right after it).
fn say_hello(s: &std::net::TcpStream, role: Role, id: &str) -> std::io::Result<()> {
    use std::io::Write;
    let hello = Msg::Hello {
        version: VERSION,
        role,
        id: id.to_owned(),
    };
    let mut line = serde_json::to_string(&hello).map_err(std::io::Error::other)?;
    line.push('\n');
    (&*s).write_all(line.as_bytes())
}

/// The preflight and the receiver's verdict: a refusal stops the move before anything is frozen.
fn ask(wire: &mut Wire, pre: Preflight) -> Result<super::preflight::Verdict, JobError> {
    let lost = |e: std::io::Error| MigrateError::Lost(format!("the preflight: {e}"));
    wire.send(&Msg::Preflight(Box::new(pre))).map_err(lost)?;
    wire.read_limit(Some(PREFLIGHT_WAIT)).map_err(lost)?;
    match wire.recv().map_err(lost)? {
        Msg::Verdict(v) if v.problems.is_empty() => Ok(v),
        Msg::Verdict(v) => Err(MigrateError::Refused {
            host: v.host,
            problems: v.problems,
        }
        .into()),
        other => Err(MigrateError::Lost(format!("unexpected answer {other:?}")).into()),
    }
}

/// Serves CRIU's post-dump action: sends the images and waits until the receiver restores.
/// `sent`: their size and when they were sent.
fn serve_images(
    wire: &Arc<Mutex<Wire>>,
    sent: &Arc<Mutex<Option<(u64, f64)>>>,
    dir: &Path,
) -> Result<StageServer, JobError> {
    let (wire, sent, dir) = (wire.clone(), sent.clone(), dir.to_owned());
    StageServer::start(move |stage| {
        if stage != "post-dump" {
            return Ok(());
        }
        super::seal::digests(&dir)?;
        let mut wire = wire
            .lock()
            .map_err(|_| "a thread of criu-gpu died".to_owned())?;
        let bytes = wire
            .send_dir(&dir)
            .map_err(|e| format!("sending the images: {e}"))?;
        *sent.lock().map_err(|_| "a thread of criu-gpu died")? = Some((bytes, report::now()));
        wire.read_limit(Some(RESTORING_WAIT))
            .map_err(|e| e.to_string())?;
        match wire.recv() {
            Ok(Msg::Restoring) => Ok(()),
            Ok(Msg::Landed(l)) => Err(l.error.unwrap_or_default()),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(e) => Err(format!("the receiver did not start its restore: {e}")),
        }
    })
    .map_err(|source| JobError::Io {
        what: "serving CRIU's post-dump action on a unix socket".into(),
        source,
    })
}

/// CRIU's lazy dump, its pages served over `pages`; when CRIU started (wall clock).
fn dump(
    pid: i32,
    r: &Request,
    plan: &Plan,
    criu: &Path,
    pages: &std::net::TcpStream,
    server: &StageServer,
    limit: Duration,
) -> Result<(run::Ran, f64), JobError> {
    let io = |what: &'static str| {
        move |source| JobError::Io {
            what: what.into(),
            source,
        }
    };
    let fd = net::inheritable(pages).map_err(io("handing the pages connection to CRIU"))?;
    let mut args = job::dump::dump_args(pid, false, r, plan)?;
    args.extend(["--lazy-pages", "--ps-socket", &fd.to_string()].map(str::to_owned));
    let env = vec![(MIGRATE.key.to_owned(), server.path.display().to_string())];
    out::line(format!(
        "running: {}",
        job::full_command(criu, &args).join(" ")
    ));
    let started = report::now();
    let log = r.dir.join("dump.log");
    let ran = run::criu(criu, &args, &env, &log, "moving", limit).map_err(io("running criu"))?;
    Ok((ran, started))
}

/// After this side's CRIU: the receiver's outcome, and the move's, said.
fn finish(
    wire: &mut Wire,
    ran: Result<(run::Ran, f64), JobError>,
    images_sent: Option<f64>,
    dir: &Path,
    moved: &mut Moved,
) -> Result<(), JobError> {
    let (ran, started) = match ran {
        Ok(r) => r,
        Err(e) => {
            let _ = wire.send(&Msg::GaveUp { why: e.to_string() });
            return Err(e);
        }
    };
    let log = dir.join("dump.log");
    moved.leaving = Leaving {
        frozen: report::logged_at(&log, started, "Dumping processes"),
        checkpointed: report::logged_at(&log, started, "criu_gpu: checkpointed"),
        images_sent,
    };
    let landed = match images_sent {
        Some(_) => landed(wire),
        None => {
            // The receiver waits for images that will not come.
            let _ = wire.send(&Msg::GaveUp {
                why: "the sender's dump failed before its images were written".into(),
            });
            None
        }
    };
    if let Some(l) = &landed {
        moved.landed = l.clone();
    }
    if !ran.ok {
        return Err(JobError::Failed {
            phase: "dump",
            status: ran.status,
            after: "the job was not moved: it runs on here as it was (the plugin puts its GPU \
                    state back)",
            log: log.display().to_string(),
            errors: with_receiver(ran.errors, landed.as_ref(), images_sent.is_some()),
        });
    }
    moved.downtime = match (moved.leaving.frozen, moved.landed.times.resumed) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    say(moved);
    Ok(())
}

/// The receiver's last word, if it comes in time.
fn landed(wire: &mut Wire) -> Option<Landed> {
    wire.read_limit(Some(LANDED_WAIT)).ok()?;
    loop {
        match wire.recv() {
            Ok(Msg::Landed(l)) => return Some(*l),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

fn with_receiver(mut errors: Vec<String>, landed: Option<&Landed>, sent: bool) -> Vec<String> {
    match landed {
        Some(l) if !l.ok => errors.push(format!(
            "{}: {}; nothing of the job was left there",
            l.host,
            l.error.as_deref().unwrap_or("its restore failed")
        )),
        Some(_) => {}
        None if sent => errors.push("the receiver did not say how its restore ended".into()),
        None => {}
    }
    errors
}

fn say(moved: &Moved) {
    out::line(format!(
        "moved to {}: its root is pid {} there{}",
        moved.to,
        moved.landed.root.map_or("?".into(), |p| p.to_string()),
        moved
            .downtime
            .map_or(String::new(), |d| format!("; downtime {d:.2} s"))
    ));
    moved.lines().iter().for_each(out::line);
}
