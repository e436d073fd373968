//! `criu-gpu`: the operator's command. See `criu-gpu --help`; the modules of the library do
//! the work, this file turns the command line into calls and errors into exit statuses.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use clap::Parser;

use criu_gpu::archive::Checkpoint;
use criu_gpu::cli::{Cli, Command, KubeArgs, NodeCommand, SelectArgs};
use criu_gpu::error::Error;
use criu_gpu::{cli, doctor, inspect, job, out, snapshots};
use criu_gpu_host::settings::declared::{KUBECONFIG, KUBELET_TOKEN, LIBCUDA, LIBNVML};
use criu_gpu_host::settings::Settings;
use criu_gpu_node::kubeconfig::KubeEnv;
use criu_gpu_node::{drain, http::Tls, oci, restore, Access, NodeError};
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
        Command::Check { path } => check(&path, json),
        Command::Thp { command } => with_huge_pages(&command),
        Command::Inspect { path } => inspect_command(&path, json),
        Command::Doctor {
            driver,
            nvml,
            images,
        } => doctor_command(
            &doctor::Options {
                driver,
                nvml,
                image_dirs: images,
            },
            json,
        ),
        Command::RuntimeConfig {
            files,
            template,
            criu,
            dry_run,
        } => runtime_config(files, template, criu, dry_run, json),
        Command::Image {
            archive,
            container,
            output,
            reference,
            oci_archive,
        } => image_command(&archive, container, &output, reference, oci_archive, json),
        Command::Node(n) => node_command(n, json),
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

/// `criu-gpu doctor`: exit status 1 when a check failed.
fn doctor_command(given: &doctor::Options, json: bool) -> Result<u8, Error> {
    // By default, the libraries the plugin would load.
    let named = |s| settings().get(s).ok().flatten();
    let opts = &doctor::Options {
        driver: given.driver.clone().or_else(|| named(&LIBCUDA)),
        nvml: given.nvml.clone().or_else(|| named(&LIBNVML)),
        image_dirs: given.image_dirs.clone(),
    };
    for (flag, v) in [("--driver", &opts.driver), ("--nvml", &opts.nvml)] {
        if v.as_deref() == Some("") {
            return Err(Error::Usage(format!(
                "{flag} was given an empty path: name the library (e.g. {flag} /usr/lib/x86_64-linux-gnu/{}), or leave the option out to use the system's",
                if flag == "--driver" { "libcuda.so.1" } else { "libnvidia-ml.so.1" }
            )));
        }
    }
    let findings = doctor::run(opts);
    let ready = findings.iter().all(|f| f.status != doctor::Status::Fail);
    if json {
        out::json(&serde_json::json!({"ready": ready, "checks": findings}));
    } else {
        doctor::print(&findings);
    }
    Ok(if ready { 0 } else { 1 })
}

/// `criu-gpu image`: a checkpoint archive as an OCI image (layout, and archive if asked).
fn image_command(
    archive: &Path,
    container: String,
    output: &Path,
    reference: String,
    oci_archive: Option<PathBuf>,
    json: bool,
) -> Result<u8, Error> {
    let spec = oci::ImageSpec {
        reference,
        annotations: [
            (oci::CRIO_CHECKPOINT_NAME.to_owned(), container.clone()),
            ("org.criu.checkpoint.container.name".to_owned(), container),
        ]
        .into(),
        runtime_config: serde_json::json!({}),
    };
    let io = |e: std::io::Error| Error::Refused(format!("writing the image: {e}"));
    let layout = oci::write_layout(output, archive, None, &spec).map_err(io)?;
    if let Some(a) = &oci_archive {
        oci::pack(output, a).map_err(io)?;
    }
    if json {
        out::json(
            &serde_json::json!({"layout": output, "manifest": layout.manifest.digest, "layer": layout.layer.digest, "oci_archive": oci_archive}),
        );
    } else {
        out::line(format!(
            "{}: manifest {}, layer {}",
            output.display(),
            layout.manifest.digest,
            layout.layer.digest
        ));
    }
    Ok(0)
}

fn check(path: &Path, json: bool) -> Result<u8, Error> {
    let c = Checkpoint::open(path)?;
    let gpu = criu_gpu_image::inspect::inspect(&c.images);
    let held = inspect::gpu_lines(&gpu);
    let (code, verdict) = if held.is_empty() {
        (0, None)
    } else {
        let v = inspect::verdict(&c, settings());
        (u8::from(!v.can_restore), Some(v))
    };
    if json {
        out::json(&serde_json::json!({
            "path": path,
            "gpu_state": held,
            "can_restore": verdict.as_ref().is_none_or(|v| v.can_restore),
            "reason": verdict.as_ref().and_then(|v| v.reason.clone()),
        }));
        return Ok(code);
    }
    if held.is_empty() {
        out::line("no GPU state in this checkpoint: nothing to check");
    }
    for line in &held {
        out::line(format!("checkpoint: {line}"));
    }
    match verdict.and_then(|v| v.reason) {
        None if code == 0 && !held.is_empty() => out::line("OK: this node can restore it"),
        Some(why) => out::line(format!("REFUSED: {why}")),
        None => {}
    }
    Ok(code)
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

fn access(k: &KubeArgs) -> Access {
    Access {
        kubelet: k.kubelet.clone(),
        kubelet_token_file: k.token_file.clone(),
        kubelet_ca: k.cacert.clone(),
        kubelet_insecure: k.insecure,
        kubeconfig: k.kubeconfig.clone(),
        timeout: Duration::from_secs(k.timeout),
        env: kube_env(),
    }
}

fn drain_options(k: &KubeArgs, s: &SelectArgs, json: bool) -> drain::Options {
    drain::Options {
        access: access(k),
        namespace: s.namespace.clone(),
        resources: s
            .resources
            .split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::to_owned)
            .collect(),
        parallel: s.parallel,
        json,
        ..drain::Options::default()
    }
}

fn node_command(n: NodeCommand, json: bool) -> Result<u8, Error> {
    criu_gpu_node::screen::install(Box::new(out::Stdout));
    let (summary, result) = match n {
        NodeCommand::Checkpoint {
            kube,
            select,
            store,
            dry_run,
        } => drain::checkpoint(&drain::Options {
            store,
            dry_run,
            ..drain_options(&kube, &select, json)
        }),
        NodeCommand::Drain {
            node,
            kube,
            select,
            store,
            scale_down,
            force,
            drain_timeout,
            dry_run,
        } => drain::drain(&drain::Options {
            node: Some(node),
            store,
            dry_run,
            scale_down,
            force,
            drain_timeout: Duration::from_secs(drain_timeout),
            ..drain_options(&kube, &select, json)
        }),
        NodeCommand::Restore {
            store,
            registry,
            registry_cacert,
            registry_insecure,
            registry_credentials,
            tag,
            node,
            check,
            include_owned,
            kubeconfig,
            dry_run,
        } => restore::restore(&restore::Options {
            access: Access {
                kubeconfig,
                env: kube_env(),
                ..Access::default()
            },
            store,
            registry: Some(registry),
            registry_tls: Tls {
                ca: registry_ca(registry_cacert.as_deref())?,
                insecure: registry_insecure,
                client: None,
            },
            registry_credentials,
            tag,
            node,
            check: check.then_some(can_restore_here),
            include_owned,
            dry_run,
            json,
        }),
    };
    summary.print(json);
    Ok(node_exit(result, json))
}

/// `node restore --check`: the plugin's restore checks on this node, on one archive.
fn can_restore_here(archive: &Path) -> Result<(), String> {
    let ck = Checkpoint::open(archive).map_err(|e| e.to_string())?;
    match inspect::verdict(&ck, settings()).reason {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// The CA bundle `--registry-cacert` names.
fn registry_ca(path: Option<&Path>) -> Result<Option<Vec<u8>>, Error> {
    path.map(|p| {
        std::fs::read(p)
            .map_err(|e| Error::Usage(format!("--registry-cacert {}: {e}", p.display())))
    })
    .transpose()
}

/// A node command's exit status, after its summary: 1 with its error said.
fn node_exit(result: Result<(), NodeError>, json: bool) -> u8 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            // With --json the summary carries the error; stderr gets it for the logs.
            if json {
                eprintln!("criu-gpu: ERROR: {e}");
            } else {
                out::line(format!("ERROR: {e}"));
            }
            1
        }
    }
}

/// `criu-gpu thp -- CMD`: CMD with huge pages at `always`, through the guardians' own raise and
/// put-back (criu_gpu_host::thp), never by writing the knob here.
fn with_huge_pages(command: &[String]) -> Result<u8, Error> {
    use criu_gpu_host::thp::{Thp, Want};
    let thp = Thp::default();
    let me = std::process::id() as i32;
    let raised = thp
        .raise(Want::Always, me)
        .map_err(|e| Error::Usage(format!("transparent huge pages: {e}")))?;
    tracing::info!("transparent huge pages: {raised:?}");
    let status = std::process::Command::new(&command[0])
        .args(&command[1..])
        .status();
    if let Err(e) = thp.lower(me) {
        tracing::warn!("transparent huge pages could not be put back: {e}");
    }
    let status = status.map_err(|e| Error::Usage(format!("{}: {e}", command[0])))?;
    Ok(status.code().map_or(1, |c| c.clamp(0, 255) as u8))
}

/// The request, and for a job across machines (`--nnodes`) its nodes' rendezvous.
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

/// `criu-gpu runtime-config`: exit status 1 when the runtimes' CRIU will not be able to lock a
/// container's network on this node (nothing it can take, or an own setting it cannot take).
fn runtime_config(
    files: Vec<std::path::PathBuf>,
    template: Option<std::path::PathBuf>,
    criu: Option<std::path::PathBuf>,
    dry_run: bool,
    json: bool,
) -> Result<u8, Error> {
    use criu_gpu::runtime_conf;
    use criu_gpu_host::netlock::NodeLocks;
    let criu = criu.or_else(criu_gpu::find_criu).ok_or_else(|| {
        Error::Refused(
            "criu not found ($CRIU, PATH, /usr/local/sbin, /usr/sbin): it is what tells \
                 whether this node can take an nftables lock; install it first \
                 (scripts/install-criu.sh) or name it with --criu"
                .into(),
        )
    })?;
    let template = match template {
        Some(t) => std::fs::read_to_string(&t)
            .map_err(|e| Error::Usage(format!("--template {}: {e}", t.display())))?,
        None => runtime_conf::TEMPLATE.to_owned(),
    };
    let files = if files.is_empty() {
        runtime_conf::RUNTIMES
            .iter()
            .map(|(_, f)| std::path::PathBuf::from(f))
            .collect()
    } else {
        files
    };
    let node = NodeLocks::probe(&criu);
    let done = runtime_conf::apply(&files, &template, node, dry_run)
        .map_err(|e| Error::Refused(format!("writing CRIU's settings: {e}")))?;
    let problem = done.iter().any(|(r, _)| r.outcome.is_problem());
    if json {
        let results: Vec<_> = done.iter().map(|(r, _)| r).collect();
        out::json(&serde_json::json!({
            "node": node,
            "choice": node.choose(),
            "dry_run": dry_run,
            "files": results,
        }));
    } else {
        for (r, new) in &done {
            out::line(r.describe(node));
            if let (true, Some(new)) = (dry_run, new) {
                for l in new.lines() {
                    out::line(format!("  | {l}"));
                }
            }
        }
        if node.choose().is_none() {
            out::line(format!(
                "WARNING: this node can take no network lock: {}",
                NodeLocks::NO_LOCK_FIX
            ));
        }
    }
    Ok(u8::from(problem))
}
