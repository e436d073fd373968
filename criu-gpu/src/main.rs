//! `criu-gpu`: the operator's command. See `criu-gpu --help`; the modules of the library do
//! the work, this file turns the command line into calls and errors into exit statuses.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use clap::Parser;

use criu_gpu::archive::Checkpoint;
use criu_gpu::cli::{Cli, Command};
use criu_gpu::error::Error;
use criu_gpu::{check, cli, doctor, inspect, job, node, out, runtime_conf, snapshots, thp};
use criu_gpu_host::settings::declared::{KUBECONFIG, KUBELET_TOKEN};
use criu_gpu_host::settings::Settings;
use criu_gpu_node::kubeconfig::KubeEnv;
use snapshot_store::Compression;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    // CRIU runs `criu-gpu` as the action script of `criu-gpu dump`: no arguments, the action in
    // the environment.
    if args.len() == 1 {
        if let Ok(action) = std::env::var("CRTOOLS_SCRIPT_ACTION") {
            return if job::action_script(&action, &Settings::load()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
    }
    // Installed as criu-gpu-check too: the old name of `criu-gpu check`.
    if args.first().is_some_and(|a| {
        Path::new(a)
            .file_name()
            .is_some_and(|n| n == "criu-gpu-check")
    }) {
        args.insert(1, "check".into());
    }
    let json = args.iter().any(|a| a == "--json");
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            out::line(e.to_string().trim_end());
            return ExitCode::SUCCESS;
        }
        Err(e) => return report(&Error::Usage(e.to_string().trim().to_owned()), json),
    };
    let level = match cli.verbose {
        0 => tracing::Level::WARN,
        1 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_max_level(level)
        .try_init();
    match run(cli.command, cli.json, cli.verbose > 0) {
        Ok(code) => ExitCode::from(code),
        Err(e) => report(&e, json),
    }
}

/// Says what went wrong (as JSON on stdout with `--json`, always on stderr) and exits.
fn report(e: &Error, json: bool) -> ExitCode {
    if json {
        out::json(&serde_json::json!({"error": e.to_string(), "kind": e.kind()}));
    }
    eprintln!("criu-gpu: {e}");
    ExitCode::from(e.exit_code())
}

/// The plugin's settings on this node (its driver libraries, the device map, ...), read once per
/// command.
static SETTINGS: OnceLock<Settings> = OnceLock::new();

fn settings() -> &'static Settings {
    SETTINGS.get_or_init(Settings::load)
}

fn run(command: Command, json: bool, verbose: bool) -> Result<u8, Error> {
    match command {
        Command::Dump {
            pid,
            dir,
            common,
            store,
            compress,
            leave_running,
            to,
            moving,
        } => {
            let (r, across) = job_request(dir.unwrap_or_default(), common, verbose)?;
            if let Some(to) = to {
                return move_command(pid, &to, r, &moving, json);
            }
            match store_request(store, compress) {
                Some(s) => {
                    no_store_across(&across)?;
                    stored(snapshots::dump(pid, leave_running, &r, &s)?, json)
                }
                None => dump_command(pid, leave_running, (r, across), json),
            }
        }
        Command::Restore {
            dir,
            common,
            store,
            device_map,
            address_map,
            truncate_grown,
            no_prefetch,
            listen,
            moving,
            work_dir,
        } => {
            let how = job::RestoreHow {
                device_map,
                address_map,
                truncate_grown,
                no_prefetch,
                work_dir,
            };
            let (r, across) = job_request(dir.unwrap_or_default(), common, verbose)?;
            match listen {
                Some(l) => receive_command(&l, &how, r, &moving, json),
                None => restore_from(&how, (r, across), store, json),
            }
        }
        Command::Store(c) => snapshots::command::run(c, settings(), json),
        Command::Check { path } => check::command(&path, settings(), json),
        Command::Thp { command } => thp::with_huge_pages(&command),
        Command::Inspect { path } => inspect_command(&path, json),
        Command::Doctor {
            driver,
            nvml,
            images,
        } => doctor::command(
            &doctor::Options {
                driver,
                nvml,
                image_dirs: images,
            },
            settings(),
            json,
        ),
        Command::RuntimeConfig {
            files,
            template,
            criu,
            dry_run,
        } => runtime_conf::command::run(files, template, criu, dry_run, json),
        Command::Image {
            archive,
            container,
            output,
            reference,
            oci_archive,
        } => node::image(&archive, container, &output, reference, oci_archive, json),
        Command::Node(n) => node::command(n, &kube_env(), settings(), json),
    }
}

/// The store a dump or restore goes through, if one was named.
fn store_request(a: cli::StoreArgs, compression: Compression) -> Option<snapshots::StoreRequest> {
    Some(snapshots::StoreRequest {
        store: a.store?,
        snapshot: a.snapshot?,
        stage: a.stage,
        compression,
    })
}

/// A dump into or a restore from the store: its outcome as JSON when asked.
fn stored(outcome: impl serde::Serialize, json: bool) -> Result<u8, Error> {
    if json {
        out::json(&outcome);
    }
    Ok(0)
}

/// `criu-gpu dump`.
fn dump_command(
    pid: i32,
    leave_running: bool,
    (r, across): (job::Request, Option<job::cluster::Across>),
    json: bool,
) -> Result<u8, Error> {
    let o = match across {
        Some(a) => job::cluster::dump::dump(pid, leave_running, &r, &a)?,
        None => job::dump(pid, leave_running, &r)?,
    };
    if json {
        out::json(&o);
    }
    Ok(0)
}

/// `criu-gpu restore`, from a directory or a store.
fn restore_from(
    how: &job::RestoreHow,
    (r, across): (job::Request, Option<job::cluster::Across>),
    store: cli::StoreArgs,
    json: bool,
) -> Result<u8, Error> {
    match store_request(store, Compression::default()) {
        Some(s) => {
            no_store_across(&across)?;
            stored(snapshots::restore(how, &r, &s)?, json)
        }
        None => restore_command(how, (r, across), json),
    }
}

/// `criu-gpu dump PID DIR --to HOST:PORT`.
fn move_command(
    pid: i32,
    to: &str,
    r: job::Request,
    moving: &cli::MoveArgs,
    json: bool,
) -> Result<u8, Error> {
    let limit = Duration::from_secs(moving.move_timeout.max(1));
    let moved = job::migrate::send::send(pid, to, &r, limit)?;
    if json {
        out::json(&moved);
    }
    Ok(0)
}

/// `criu-gpu restore DIR --listen [ADDR:]PORT`.
fn receive_command(
    listen: &str,
    how: &job::RestoreHow,
    r: job::Request,
    moving: &cli::MoveArgs,
    json: bool,
) -> Result<u8, Error> {
    let limit = Duration::from_secs(moving.move_timeout.max(1));
    let landed = job::migrate::receive::receive(listen, how, &r, limit)?;
    if json {
        out::json(&landed);
    }
    Ok(0)
}

/// `criu-gpu restore`.
fn restore_command(
    how: &job::RestoreHow,
    (r, across): (job::Request, Option<job::cluster::Across>),
    json: bool,
) -> Result<u8, Error> {
    let o = match across {
        Some(a) => job::cluster::restore::restore(how, &r, &a)?,
        None => job::restore(how, &r)?,
    };
    if json {
        out::json(&o);
    }
    Ok(0)
}

/// What the environment says about the cluster, read here at the edge and passed down: the
/// declared settings (environment or settings file) and what Kubernetes and the login set.
fn kube_env() -> KubeEnv {
    let text = |key| std::env::var(key).ok();
    let setting = |s| settings().get(s).ok().flatten();
    KubeEnv {
        kubeconfig: setting(&KUBECONFIG).map(Into::into),
        service_host: text("KUBERNETES_SERVICE_HOST"),
        service_port: text("KUBERNETES_SERVICE_PORT"),
        home: std::env::var_os("HOME").map(PathBuf::from),
        kubelet_token: setting(&KUBELET_TOKEN),
    }
}

/// `criu-gpu inspect`.
fn inspect_command(path: &Path, json: bool) -> Result<u8, Error> {
    if snapshots::is_store(path) {
        return snapshots::command::list(&path.display().to_string(), json);
    }
    let c = Checkpoint::open(path)?;
    let r = inspect::report(path, &c, settings());
    if json {
        out::json(&r);
    } else {
        inspect::print_report(&r);
    }
    Ok(0)
}

/// A snapshot store holds one node's part; a job across machines goes to image directories.
fn no_store_across(across: &Option<job::cluster::Across>) -> Result<(), Error> {
    match across {
        Some(_) => Err(Error::Usage(
            "--store with --nnodes is not supported: give each node's part an image directory"
                .into(),
        )),
        None => Ok(()),
    }
}

/// The request, and for a job across machines (`--nnodes`) its nodes' rendezvous.
fn job_request(
    dir: std::path::PathBuf,
    a: cli::JobArgs,
    verbose: bool,
) -> Result<(job::Request, Option<job::cluster::Across>), Error> {
    let across = match (a.across.nnodes, &a.across.rdzv) {
        (Some(nnodes), Some(rdzv)) => Some(job::cluster::Across {
            nnodes,
            node_rank: a.across.node_rank,
            rdzv: rdzv
                .parse()
                .map_err(|e| Error::Usage(format!("--rdzv {e}")))?,
            timeout: Duration::from_secs(a.across.rdzv_timeout.max(1)),
        }),
        _ => None,
    };
    if let Some(a) = &across {
        if a.nnodes == 0 || a.node_rank.is_some_and(|r| r >= a.nnodes) {
            return Err(Error::Usage(format!(
                "--node-rank must be below --nnodes {} (0 to {})",
                a.nnodes,
                a.nnodes.saturating_sub(1)
            )));
        }
    }
    let r = job::Request {
        dir,
        dry_run: a.dry_run,
        criu: a.criu,
        extra: a.extra,
        verbose,
        settings: settings().clone(),
    };
    Ok((r, across))
}
