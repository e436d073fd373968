#!/bin/bash
# The plugin's fixed cost per process without GPU state: a tree of 4 CUDA processes is dumped
# (--leave-running) with and without 100 plain processes beside them, three times each, in one
# run; the plugin logs the time it spent in its hooks ("time in the plugin: X ms"), and the
# difference divided by the plain processes is the cost of one (goal: <= 0.05 ms; CRIU's C
# cuda_plugin spends about 26 ms per process exec'ing cuda-checkpoint).
#
#   scripts/gpu/bench-plain-tree.sh [PLAIN]          default 100
#
# On a machine without a GPU it uses the simulated GPU (the installed one, as scripts/demo.sh);
# with nvidia-smi present, real CUDA processes (nvcc-built gpu-app, 256 MiB each).
# Environment: CRIU, PLUGINS (directory with criu_gpu_plugin.so), IMAGES (default /dev/shm).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
PLUGINS=${PLUGINS:-/usr/lib/criu}
PLAIN=${1:-100}
IMAGES=${IMAGES:-/dev/shm/bench-plain}
WORK=$(mktemp -d /tmp/bench-plain.XXXXXX)
SIM=/usr/local/lib/criu-gpu/sim
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
stamp "$PLUGINS/criu_gpu_plugin.so"
pids=()
cleanup() {
	for p in "${pids[@]}"; do pkill -9 -s "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
	[ -n "${gpud:-}" ] && kill "$gpud" 2>/dev/null
	rm -rf "$WORK"; [ -n "${KEEP:-}" ] || rm -rf "$IMAGES"
}
trap cleanup EXIT

if command -v nvidia-smi >/dev/null; then
	nvcc -O2 -o "$WORK/gpu-app" "$here/gpu-app.cu" || exit 1
	gpu() { "$WORK/gpu-app" 0.25 "$1" "$WORK/app$1.status"; }
	echo "real GPU: $(nvidia-smi -L | head -1)"
else
	export CUDA_SIM_SOCKET=$WORK/gpud.sock CUDA_CKPT_LIBCUDA=$SIM/libcuda.so.1 \
		CUDA_CKPT_LIBNVML=$SIM/libnvidia-ml.so.1
	cuda-sim-gpud --socket "$CUDA_SIM_SOCKET" --gpus 1 --memory 1GiB >/dev/null 2>&1 &
	gpud=$!
	for _ in $(seq 100); do [ -S "$CUDA_SIM_SOCKET" ] && break; sleep 0.05; done
	gpu() { LD_LIBRARY_PATH=$SIM cuda-sim-app --mib 16 --log "$WORK/app$1.log"; }
	echo "simulated GPU"
fi
export -f gpu
export SIM
export WORK

# tree N_PLAIN: 4 CUDA processes and N_PLAIN sleeping shells under one session leader; sets ROOT.
tree() {
	setsid bash -c "for i in 1 2 3 4; do gpu \$i & done; for i in \$(seq 1 $1); do sleep 1000 & done; wait" \
		</dev/null >/dev/null 2>&1 &
	ROOT=$!
	pids+=("$ROOT")
	for _ in $(seq 300); do
		[ "$(pgrep -P "$ROOT" | wc -l)" -ge $(($1 + 4)) ] && break
		sleep 0.1
	done
	sleep 3 # the CUDA processes set up their GPU state
}

# spent: one --leave-running dump of the tree: the plugin's whole time (ms), its fixed part
# (looking for CUDA in every process, and hooks answered "not mine", ms), and the processes.
spent() {
	rm -rf "$IMAGES" && mkdir -p "$IMAGES"
	"$CRIU" dump -t "$ROOT" -D "$IMAGES" --lib "$PLUGINS" -v4 -o dump.log --leave-running \
		>/dev/null 2>&1 || { echo "dump failed: $(grep Error "$IMAGES/dump.log" | head -3)" >&2; return 1; }
	# "time in the plugin: T ms over C calls; fixed cost: S ms looking for CUDA in N processes
	#  and M ms in K calls about processes without GPU state"
	grep -o 'time in the plugin: .*' "$IMAGES/dump.log" | sed 's/[;,]//g' |
		awk '{ print $5, $12 + $21, $18 }'
}

tree 0
small=$(for _ in 1 2 3; do spent; done | sort -n | sed -n 2p)
pkill -9 -s "$ROOT" 2>/dev/null
tree "$PLAIN"
big=$(for _ in 1 2 3; do spent; done | sort -n | sed -n 2p)
read -r small_total small_fixed small_n <<<"$small"
read -r big_total big_fixed big_n <<<"$big"
echo "4 CUDA processes ($small_n in the tree): $small_total ms in the plugin, $small_fixed ms of it fixed (median of 3 dumps)"
echo "4 CUDA + $PLAIN plain processes ($big_n in the tree): $big_total ms, $big_fixed ms fixed"
awk -v a="$small_total" -v b="$big_total" -v f="$big_fixed" -v n="$big_n" -v p="$PLAIN" 'BEGIN {
	d = f / n
	printf "fixed cost per process: %.4f ms (goal <= 0.05 ms; C cuda_plugin ~26 ms): %s\n", d, (d <= 0.05 ? "ok" : "OVER")
	printf "whole-plugin difference per plain process: %.4f ms (noisy: the GPU work varies)\n", (b - a) / p
	exit (d <= 0.05 ? 0 : 1)
}'
