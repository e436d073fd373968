#!/bin/bash
# Set-up, step one (a developer's or CI's machine): installs what the project needs, builds it,
# installs it, and runs the demo (a GPU process checkpointed and restored through CRIU with the
# plugin). A node in production is installed from the packages of scripts/bundle.sh instead: no
# Rust there, no test tooling.
#
#   sudo scripts/install.sh [--with-containers] [--no-demo]
#
# --with-containers: Podman, containerd, runc and zstd from the distribution, which the container
# tests run (scripts/test.sh needs them). Only when asked: on a Kubernetes node they would fight
# the container runtime already there.
#
# Installs:
#   $PREFIX/sbin/criu                 the project's CRIU (4.2.1 + third_party/criu/patches) and
#   $PREFIX/lib/criu-gpu/stock/criu   stock 4.2.1, by scripts/install-criu.sh (builds only when
#                                     they do not match the pinned source; zdtm's needs too)
#   /usr/local/bin/cuda-checkpoint-ctl
#   <CRIU plugin dir>/criu_gpu_plugin.so   (/usr/lib/criu, where criu looks by default)
#   /etc/criu/gpu-plugin.conf          (the plugin's settings, all commented out)
#   /etc/criu/runc.conf, crun.conf     (criu options for container runtimes, if not present; the
#                                       network lock this node can take on a marked line, always)
#   /usr/local/bin/criu-gpu            (the operator's command: dump, restore, check, inspect,
#                                       doctor, runtime-config, image,
#                                       node checkpoint|drain|restore)
#   /usr/local/bin/criu-gpu-check      (its old name for `criu-gpu check`)
#   Podman, containerd, runc, zstd     (Debian packages, with --with-containers only)
#   protobuf-compiler, etcd-server     (Debian packages: etcd's client is generated at build
#                                       time; jobs across machines meet in etcd, and the tests
#                                       run a real one)
#   openmpi-bin, libopenmpi-dev        (Debian packages: the tests run an Open MPI job across
#                                       two namespace nodes)
#   the tests' tools                   (Debian packages: shellcheck lints the scripts, mmdebstrap
#                                       makes the fresh root the packages are installed into)
#   /usr/local/lib/criu-gpu/sim/       the simulated driver (libcuda.so.1, libnvidia-ml.so.1),
#   /usr/local/bin/cuda-sim-gpud, cuda-sim-app   used only when selected explicitly
# Everything is installed stripped; the debug information (line tables: enough for a backtrace
# with file and line) goes to /usr/lib/debug/.build-id/, where gdb and coredumpctl look for it.
# Environment: PREFIX (/usr/local), CRIU_PLUGIN_DIR (/usr/lib/criu), DEBUG_DIR (/usr/lib/debug).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${PREFIX:-/usr/local}
CRIU_PLUGIN_DIR=${CRIU_PLUGIN_DIR:-/usr/lib/criu}
DEBUG_DIR=${DEBUG_DIR:-/usr/lib/debug}
demo=1
containers=0
for a in "$@"; do
	case $a in
	--no-demo) demo=0 ;;
	--with-containers) containers=1 ;;
	--no-containers) containers=0 ;; # the default now; kept for old command lines
	*) echo "install.sh: unknown option $a" >&2; exit 2 ;;
	esac
done
say() { printf '\n== %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "install.sh: run as root (it installs into $PREFIX and $CRIU_PLUGIN_DIR)" >&2; exit 1; }
command -v cargo >/dev/null || {
	echo "install.sh: cargo not found; install Rust first (https://rustup.rs), then run this again" >&2
	exit 1
}

say "CRIU"
bash "$root/scripts/install-criu.sh"
if [ $containers = 1 ]; then
	say "Podman, containerd, runc, zstd"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq --no-install-recommends podman containerd runc uidmap zstd tar >/dev/null
fi
say "protoc (etcd's client is generated at build time), etcd (the tests run a real one)"
export DEBIAN_FRONTEND=noninteractive
command -v protoc >/dev/null || apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null
command -v etcd >/dev/null || apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
say "Open MPI (the tests run an MPI job across two namespace nodes)"
command -v mpicc >/dev/null || apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null
say "shellcheck, mmdebstrap (the tests lint the scripts, install the packages into a fresh root)"
for tool in shellcheck mmdebstrap; do
	command -v $tool >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $tool >/dev/null
done
export PATH="$PREFIX/sbin:$PATH"

say "building (release)"
cd "$root"
# Only what is installed: a workspace-wide build would let the tests' simulation features into
# the plugin.
cargo build --release --locked -p cuda-checkpoint-ctl -p criu-gpu-plugin -p criu-gpu -p cuda-sim -p cuda-sim-libcuda

say "installing"
install -d "$PREFIX/bin" "$CRIU_PLUGIN_DIR" "$PREFIX/lib/criu-gpu/sim" /etc/criu
# install_stripped FILE DEST: DEST gets FILE without its debug information, which goes to
# $DEBUG_DIR/.build-id/ under the file's build id. A temporary name and a rename: a running
# criu keeps its mapping of the old file intact.
install_stripped() {
	local src=$1 dst=$2 id tmp
	id=$(readelf -n "$src" | awk '/Build ID:/ { print $3 }')
	if [ -n "$id" ]; then
		install -d "$DEBUG_DIR/.build-id/${id:0:2}"
		objcopy --only-keep-debug "$src" "$DEBUG_DIR/.build-id/${id:0:2}/${id:2}.debug"
	fi
	tmp="$(dirname "$dst")/.$(basename "$dst").new"
	install -m 0755 "$src" "$tmp"
	strip --strip-unneeded "$tmp"
	mv -f "$tmp" "$dst"
}
for b in cuda-checkpoint-ctl criu-gpu criu-gpu-check cuda-sim-gpud cuda-sim-app; do
	install_stripped "target/release/$b" "$PREFIX/bin/$b"
done
install_stripped target/release/libcriu_gpu_plugin.so "$CRIU_PLUGIN_DIR/criu_gpu_plugin.so"
for f in libcuda.so.1 libnvidia-ml.so.1; do
	install_stripped target/release/libcuda.so "$PREFIX/lib/criu-gpu/sim/$f"
done
[ -e /etc/criu/gpu-plugin.conf ] || install -m 0644 "$root/container-hooks/gpu-plugin.conf" /etc/criu/gpu-plugin.conf
# CRIU's settings for container runtimes: the project's where a file does not exist, and in any
# case the network lock this node can take, on a marked line of its own (criu-gpu decides as it
# does for `criu-gpu dump`: nftables where this CRIU has it, else iptables; an administrator's
# own network-lock line is left alone, and reported when this node cannot take it).
"$PREFIX/bin/criu-gpu" runtime-config --criu "$PREFIX/sbin/criu" \
	--template "$root/container-hooks/criu/runc.conf" /etc/criu/runc.conf /etc/criu/crun.conf ||
	echo "warning: container checkpoints through runc or crun will fail on this node until the" \
		"network lock above is fixed (criu-gpu doctor)" >&2
echo "cuda-checkpoint-ctl: $PREFIX/bin/cuda-checkpoint-ctl"
echo "criu-gpu:           $PREFIX/bin/criu-gpu (criu-gpu doctor: is this node ready?)"
echo "CRIU plugin:        $CRIU_PLUGIN_DIR/criu_gpu_plugin.so"
echo "simulated driver:   $PREFIX/lib/criu-gpu/sim"
echo "debug information:  $DEBUG_DIR/.build-id (installed files are stripped)"

if [ $demo = 1 ]; then
	say "demo"
	bash "$root/scripts/demo.sh"
fi

# Whether this node is ready, each problem with its fix (a machine without a GPU says so: that
# is no failure of the installation).
say "criu-gpu doctor"
"$PREFIX/bin/criu-gpu" doctor || true
