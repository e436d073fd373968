//! `criu-gpu node checkpoint|drain|restore` and `criu-gpu image`: their arguments turned into
//! the `criu-gpu-node` crate's options, its summary printed, its outcome an exit status. The
//! `node restore --check` verdict is this crate's ([`inspect::verdict`]): the node crate reads
//! no checkpoint and loads no driver.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use criu_gpu_host::settings::Settings;
use criu_gpu_node::kubeconfig::KubeEnv;
use criu_gpu_node::restore::ArchiveCheck;
use criu_gpu_node::{drain, http::Tls, oci, restore, Access, NodeError};

use crate::archive::Checkpoint;
use crate::cli::{KubeArgs, NodeCommand, SelectArgs};
use crate::error::Error;
use crate::{inspect, out};

fn access(k: &KubeArgs, env: &KubeEnv) -> Access {
    Access {
        kubelet: k.kubelet.clone(),
        kubelet_token_file: k.token_file.clone(),
        kubelet_ca: k.cacert.clone(),
        kubelet_insecure: k.insecure,
        kubeconfig: k.kubeconfig.clone(),
        timeout: Duration::from_secs(k.timeout),
        env: env.clone(),
    }
}

fn drain_options(k: &KubeArgs, s: &SelectArgs, env: &KubeEnv, json: bool) -> drain::Options {
    drain::Options {
        access: access(k, env),
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

/// `criu-gpu node ...`: `env` is what the command's environment says about the cluster,
/// `settings` the plugin's on this node (for `node restore --check`).
pub fn command(
    n: NodeCommand,
    env: &KubeEnv,
    settings: &Settings,
    json: bool,
) -> Result<u8, Error> {
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
            ..drain_options(&kube, &select, env, json)
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
            ..drain_options(&kube, &select, env, json)
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
                env: env.clone(),
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
            check: check.then(|| can_restore_here(settings)),
            include_owned,
            dry_run,
            json,
        }),
    };
    summary.print(json);
    Ok(exit(result, json))
}

/// `node restore --check`: the plugin's restore checks on this node, on one archive.
fn can_restore_here(settings: &Settings) -> ArchiveCheck {
    let settings = settings.clone();
    ArchiveCheck(Arc::new(move |archive: &Path| {
        let ck = Checkpoint::open(archive).map_err(|e| e.to_string())?;
        match inspect::verdict(&ck, &settings).reason {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }))
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
fn exit(result: Result<(), NodeError>, json: bool) -> u8 {
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

/// `criu-gpu image`: `archive`, the checkpoint of `container`, as an OCI image layout in
/// `output` named `reference`, and as an OCI archive too if one is named.
pub fn image(
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
