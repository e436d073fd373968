//! The command line of `criu-gpu`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "criu-gpu",
    version,
    about = "Checkpoints of GPU processes and containers: dump and restore a GPU job, check, inspect, node readiness, Kubernetes node drain and restore",
    after_help = "Exit status: 0 done or OK; 1 refused or failed (the reason is printed); 2 bad usage or unreadable input.\n\
                  `criu-gpu-check PATH` is the same as `criu-gpu check PATH`."
)]
pub struct Cli {
    /// Machine-readable output on stdout, errors included.
    #[arg(long, global = true)]
    pub json: bool,
    /// More log lines on stderr (-v: debug, -vv: trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Checkpoint a GPU job (a process and its descendants: one process, or the ranks of a
    /// distributed job) with CRIU, choosing the CRIU options it needs from what it holds, after
    /// a preflight that names every problem with its fix.
    Dump {
        /// The job's root process.
        pid: i32,
        /// The image directory to write (with --store: none, the snapshot goes into the store).
        #[arg(required_unless_present = "store")]
        dir: Option<PathBuf>,
        #[command(flatten)]
        common: JobArgs,
        #[command(flatten)]
        store: StoreArgs,
        /// What new chunks are compressed with: zstd[:LEVEL], lz4 or none (kept only where
        /// it saves enough).
        #[arg(long, default_value = "zstd:1", requires = "store")]
        compress: snapshot_store::Compression,
        /// Leave the job running after the checkpoint (a snapshot).
        #[arg(long, conflicts_with = "to")]
        leave_running: bool,
        /// Move the job to the node where `criu-gpu restore DIR --listen PORT` waits: its
        /// pages go over the network while that node restores it (no disk); DIR keeps this
        /// side's logs and the images but the pages. The job ends here only once it runs there.
        #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["nnodes", "store"])]
        to: Option<String>,
        #[command(flatten)]
        moving: MoveArgs,
    },
    /// Restore a job checkpointed with `criu-gpu dump`, with the options it was dumped with.
    Restore {
        /// The image directory (with --store: none, the snapshot is read from the store).
        #[arg(required_unless_present = "store")]
        dir: Option<PathBuf>,
        #[command(flatten)]
        common: JobArgs,
        #[command(flatten)]
        store: StoreArgs,
        /// Restore onto other GPUs: OLD_UUID=NEW_UUID[,...] or `auto` (CRIU_GPU_DEVICE_MAP).
        #[arg(long)]
        device_map: Option<String>,
        /// Restore onto other IP addresses: OLD=NEW[,...]; both ends of the job's TCP
        /// connections move (CRIU_GPU_ADDRESS_MAP). Across nodes (--nnodes) a node's move is
        /// found without it, from its new address in etcd.
        #[arg(long, value_name = "OLD=NEW[,...]")]
        address_map: Option<criu_gpu_image::addrmap::AddressMap>,
        /// Cut the job's files that only grew since the snapshot (logs, appended outputs) back
        /// to their size at the snapshot, where their first bytes are what the snapshot
        /// recorded; without it no file is touched and the restore is refused.
        #[arg(long)]
        truncate_grown: bool,
        /// Do not read the pages images ahead (from a disk) while CRIU starts.
        #[arg(long)]
        no_prefetch: bool,
        /// Take a job moved here by `criu-gpu dump PID DIR --to THIS-NODE:PORT`: wait on
        /// [ADDR:]PORT, answer its preflight, restore it into DIR while its pages arrive.
        #[arg(long, value_name = "[ADDR:]PORT",
              conflicts_with_all = ["nnodes", "truncate_grown", "store"])]
        listen: Option<String>,
        #[command(flatten)]
        moving: MoveArgs,
        /// Where the restore writes (CRIU's --work-dir: its log, stats and pid file, the GPU
        /// timings, the guardian's log); the images are left as they were, and may be read-only.
        /// Default: a new directory criu-gpu-restore.* in the system's temporary directory.
        #[arg(long)]
        work_dir: Option<PathBuf>,
    },

    /// Can this node restore that checkpoint's GPU state? (driver, GPUs, free memory, image integrity)
    Check {
        /// A CRIU image directory, a Podman/CRI-O/kubelet archive (.tar, .tar.gz, .tar.zst),
        /// an extracted one, an OCI checkpoint image (layout or archive), or a containerd
        /// checkpoint image exported with `ctr images export`.
        path: PathBuf,
    },
    /// What is inside a checkpoint: container, CRIU version, image sizes, GPU processes and
    /// memory per GPU, the dumping machine's GPUs and driver, and whether this node can restore it.
    /// Of a snapshot store: each snapshot's size, new and shared bytes (as `store list`).
    Inspect { path: PathBuf },
    /// Is this node ready for GPU checkpoints? Each problem comes with its fix.
    Doctor {
        /// The CUDA driver library (default: the plugin's, CUDA_CKPT_LIBCUDA in the environment or
        /// the settings file, else libcuda.so.1).
        #[arg(long)]
        driver: Option<String>,
        /// The NVML library (default: the plugin's, CUDA_CKPT_LIBNVML in the environment or the
        /// settings file, else libnvidia-ml.so.1).
        #[arg(long)]
        nvml: Option<String>,
        /// Where checkpoint images will be written (repeatable), for the free-space check.
        #[arg(long = "images")]
        images: Vec<PathBuf>,
    },
    /// Write the network lock this node can take into CRIU's settings files for container
    /// runtimes (runc and crun hand CRIU /etc/criu/runc.conf and crun.conf): nftables where this
    /// CRIU has it, else iptables where its tools run. Only a marked line is written: a file
    /// that does not exist starts from the project's settings, an administrator's own
    /// `network-lock` line is left alone (and reported if this node cannot take it).
    RuntimeConfig {
        /// The files (default: /etc/criu/runc.conf and /etc/criu/crun.conf).
        files: Vec<PathBuf>,
        /// What a file that does not exist starts from (default: the project's
        /// container-hooks/criu/runc.conf, built in).
        #[arg(long)]
        template: Option<PathBuf>,
        /// The criu to ask (default: $CRIU, then PATH, then /usr/local/sbin/criu).
        #[arg(long)]
        criu: Option<PathBuf>,
        /// Print what would be written; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// An OCI checkpoint image (the format CRI-O restores from) of a checkpoint archive,
    /// written as an OCI layout directory, without buildah.
    Image {
        archive: PathBuf,
        /// The container's name, as CRI-O's checkpoint annotation wants it.
        #[arg(long)]
        container: String,
        /// The layout directory to write.
        #[arg(long)]
        output: PathBuf,
        /// The image's name in the layout's index.
        #[arg(long, default_value = "localhost/checkpoint:latest")]
        reference: String,
        /// Also pack the layout into this OCI archive (for `podman load`, `ctr images import`).
        #[arg(long)]
        oci_archive: Option<PathBuf>,
    },
    /// Kubernetes: checkpoint, drain and restore the GPU workloads of a node.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Snapshots stored by content: list, read, export, delete, verify, collect garbage.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Runs a command with the node's transparent huge pages at `always`, raised and put back
    /// as the plugin does for a GPU checkpoint (shared with dumps running meanwhile; put back
    /// whatever ends the command). For benchmarks.
    Thp {
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

/// A move between nodes (`dump --to`, `restore --listen`).
#[derive(Debug, Args)]
pub struct MoveArgs {
    /// Seconds a move may take, from the wait for the sender (restore --listen) or the
    /// preflight (dump --to) to the job running on the receiver; past it CRIU is stopped and
    /// the job runs on at the sender.
    #[arg(long, default_value_t = 600)]
    pub move_timeout: u64,
}

#[derive(Debug, Args)]
pub struct JobArgs {
    /// Check and print the CRIU command line; freeze nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The criu to run (default: $CRIU, then PATH, then /usr/local/sbin/criu).
    #[arg(long)]
    pub criu: Option<PathBuf>,
    /// More CRIU options, passed as they are (after `--`).
    #[arg(last = true)]
    pub extra: Vec<String>,
    #[command(flatten)]
    pub across: AcrossArgs,
}

/// A job across machines, as torchrun names it: run the same command on every node.
#[derive(Debug, Args)]
pub struct AcrossArgs {
    /// The job runs on this many nodes: this node's part is dumped or restored together with
    /// the others' (needs --rdzv).
    #[arg(long, requires = "rdzv")]
    pub nnodes: Option<u32>,
    /// This node's rank, 0 to NNODES-1 (a restore takes it from its part).
    #[arg(long, requires = "nnodes")]
    pub node_rank: Option<u32>,
    /// Where the nodes meet: etcd://HOST:PORT[,HOST:PORT...]/JOB (etcd v3; JOB names the job).
    #[arg(long, requires = "nnodes")]
    pub rdzv: Option<String>,
    /// Seconds a node waits for the others to join, and at each barrier.
    #[arg(long, default_value_t = 120)]
    pub rdzv_timeout: u64,
}

/// Where `dump` and `restore` meet a snapshot store.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The snapshot store: a directory of a local or network file system (made by the first
    /// dump into it).
    #[arg(long, requires = "snapshot", conflicts_with = "dir")]
    pub store: Option<String>,
    /// The snapshot's name in the store.
    #[arg(long, requires = "store")]
    pub snapshot: Option<String>,
    /// The staging directory CRIU writes or reads the images in (default: a new one in
    /// /dev/shm, removed once stored; after a restore only its pages images go).
    #[arg(long, requires = "store")]
    pub stage: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// The snapshots: size, what writing each added, what each shares and holds alone.
    List { store: String },
    /// Store an image directory or a container checkpoint archive (Podman --export, CRI-O,
    /// kubelet: tar, tar.gz, tar.zst) as a snapshot.
    Put {
        store: String,
        snapshot: String,
        path: PathBuf,
        #[arg(long, default_value = "zstd:1")]
        compress: snapshot_store::Compression,
    },
    /// Read a snapshot into a new directory (every chunk checked): `criu restore -D DIR`.
    Get {
        store: String,
        snapshot: String,
        dir: PathBuf,
    },
    /// Write one file of a snapshot to standard output (a log, the GPU record), every chunk
    /// checked.
    Cat {
        store: String,
        snapshot: String,
        /// The file's path in the snapshot (e.g. dump.log).
        file: String,
    },
    /// Write a snapshot as a tar archive: `podman container restore --import FILE` for a
    /// container checkpoint, `criu-gpu image FILE` for an OCI checkpoint image.
    Export {
        store: String,
        snapshot: String,
        #[arg(long)]
        output: PathBuf,
    },
    /// Delete snapshots; their chunks go at the next `gc`.
    Delete {
        store: String,
        #[arg(required = true)]
        snapshots: Vec<String>,
    },
    /// Delete the chunks no snapshot names (waits for dumps and restores using the store).
    Gc {
        store: String,
        /// Seconds: chunks written more recently stay.
        #[arg(long, default_value_t = 900)]
        grace: u64,
        /// Seconds to wait for the dumps and restores using the store to end.
        #[arg(long, default_value_t = 600)]
        wait: u64,
        #[arg(long)]
        dry_run: bool,
    },
    /// Read every chunk of the snapshots (all if none named) and check it against its name.
    Verify {
        store: String,
        snapshots: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Checkpoint every running GPU container of the node through its kubelet, all at once.
    Checkpoint {
        #[command(flatten)]
        kube: KubeArgs,
        #[command(flatten)]
        select: SelectArgs,
        /// Copy the archives here and keep manifest.json up to date as each one lands.
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        dry_run: bool,
    },
    /// Cordon the node, checkpoint its GPU containers, then drain it. Uncordons if anything
    /// fails before the first eviction.
    Drain {
        /// The node's name in the API server.
        node: String,
        #[command(flatten)]
        kube: KubeArgs,
        #[command(flatten)]
        select: SelectArgs,
        /// Where the archives and manifest.json go (they must outlive the node).
        #[arg(long, required_unless_present = "dry_run")]
        store: Option<PathBuf>,
        /// Scale the controllers (Deployment, StatefulSet, ReplicaSet) of GPU pods to 0 after
        /// the checkpoint; `node restore` scales them back. Without it, controller-owned GPU
        /// pods are refused (their controller would start a second copy).
        #[arg(long)]
        scale_down: bool,
        /// Also evict pods that no controller will re-create.
        #[arg(long)]
        force: bool,
        /// Seconds the evictions may take.
        #[arg(long, default_value_t = 600)]
        drain_timeout: u64,
        #[arg(long)]
        dry_run: bool,
    },
    /// Build and push a checkpoint image per saved container, re-create the pods from them,
    /// and scale back what the drain scaled down.
    Restore {
        #[arg(long)]
        store: PathBuf,
        /// Where to push the images: [https://|http://]HOST[:PORT][/PREFIX].
        #[arg(long)]
        registry: String,
        /// CA bundle of the registry's certificate.
        #[arg(long)]
        registry_cacert: Option<PathBuf>,
        /// Do not verify the registry's certificate.
        #[arg(long)]
        registry_insecure: bool,
        /// A file with one line `user:password` for the registry.
        #[arg(long)]
        registry_credentials: Option<PathBuf>,
        #[arg(long, default_value = "latest")]
        tag: String,
        /// Pin the restored pods to this node.
        #[arg(long)]
        node: Option<String>,
        /// Run the restore checks on each archive first (run it on the target node).
        #[arg(long)]
        check: bool,
        /// Restore pods whose controller was not scaled down, as bare pods.
        #[arg(long)]
        include_owned: bool,
        /// The API server's kubeconfig (default: $KUBECONFIG, the pod's service account, ~/.kube/config).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Args)]
pub struct KubeArgs {
    /// The node's kubelet API.
    #[arg(long, default_value = "https://127.0.0.1:10250")]
    pub kubelet: String,
    /// Bearer token file for the kubelet (default: $KUBELET_TOKEN, else the kubeconfig's credentials).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// CA bundle of the kubelet's serving certificate.
    #[arg(long)]
    pub cacert: Option<PathBuf>,
    /// Do not verify the kubelet's certificate (kubelets often serve self-signed ones).
    #[arg(long)]
    pub insecure: bool,
    /// The API server's kubeconfig (default: $KUBECONFIG, the pod's service account, ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Seconds one container's checkpoint may take.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

#[derive(Debug, Args)]
pub struct SelectArgs {
    /// Only this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Resource names that mean "a GPU", comma-separated.
    #[arg(long, default_value = "nvidia.com/gpu,amd.com/gpu,gpu.intel.com/i915")]
    pub resources: String,
    /// Checkpoints at a time (0: all at once).
    #[arg(long, default_value_t = 0)]
    pub parallel: usize,
}
