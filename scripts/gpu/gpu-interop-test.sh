#!/bin/bash
# On a machine with an NVIDIA GPU: CRIU's own C CUDA plugin (cuda_plugin.so, built from the same
# CRIU source by scripts/install-criu.sh) dumps and restores a real CUDA application with
# cuda-checkpoint-ctl standing in for NVIDIA's cuda-checkpoint; and an image it dumped is
# restored by this project's plugin. The application checks its data bit for bit afterwards.
#
#   UPSTREAM_PLUGINS=DIR PLUGINS=DIR scripts/gpu/gpu-interop-test.sh [GIB]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
CTL=${CTL:-$(command -v cuda-checkpoint-ctl || true)}
PLUGINS=${PLUGINS:-/usr/lib/criu}
UPSTREAM_PLUGINS=${UPSTREAM_PLUGINS:-/usr/local/lib/criu-gpu/upstream-cuda}
WORK=${WORK:-/tmp/gpu-interop}
IMAGES=${IMAGES:-/dev/shm/gpu-interop}
GIB=${1:-1}
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
trap 'cleanup_apps; rm -rf "$IMAGES"' EXIT
mkdir -p "$WORK/bin"
ln -sf "$CTL" "$WORK/bin/cuda-checkpoint"
export PATH="$WORK/bin:$PATH"
nvcc -O2 -o "$WORK/gpu-app" "$here/gpu-app.cu" 2>/dev/null || { echo "nvcc failed"; exit 1; }
say "cuda-checkpoint in PATH: $(command -v cuda-checkpoint) -> $CTL"

# one_round NAME DUMP_PLUGINS RESTORE_PLUGINS
one_round() {
	local name=$1 dump_lib=$2 restore_lib=$3 st="$WORK/$1.status" pid line dir="$IMAGES/$1"
	start_app "$st" "$WORK/gpu-app" "$GIB" 21 "$st"
	pid=$LAST_PID
	wait_for "$st" '^ready' 300 || { fail "$name: did not start"; return; }
	ask_verify "$pid" "$st" >/dev/null
	rm -rf "$dir" && mkdir -p "$dir"
	if ! "$CRIU" dump -t "$pid" -D "$dir" --lib "$dump_lib" -v4 -o dump.log; then
		fail "$name: dump"
		grep -E 'Error|cuda_plugin|criu_gpu' "$dir/dump.log" | tail -10
		return
	fi
	grep -hE 'cuda_plugin:|criu_gpu:' "$dir/dump.log" | sed 's/^/  dump: /' | head -8
	for _ in $(seq 200); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
	if ! "$CRIU" restore -D "$dir" -d --lib "$restore_lib" -v4 -o restore.log; then
		fail "$name: restore"
		grep -E 'Error|cuda_plugin|criu_gpu' "$dir/restore.log" | tail -10
		return
	fi
	grep -hE 'cuda_plugin:|criu_gpu:' "$dir/restore.log" | sed 's/^/  restore: /' | head -8
	check "$name: state running" test "$("$CTL" --get-state --pid "$pid")" = running
	line=$(ask_verify "$pid" "$st")
	check "$name: data intact bit for bit ($line)" verified_ok "$line"
	kill -9 "$pid" 2>/dev/null
	for _ in $(seq 200); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
}

say "== CRIU's cuda_plugin with cuda-checkpoint-ctl as cuda-checkpoint, $GIB GiB"
one_round upstream "$UPSTREAM_PLUGINS" "$UPSTREAM_PLUGINS"
say "== dumped by CRIU's cuda_plugin, restored by criu_gpu, $GIB GiB"
one_round mixed "$UPSTREAM_PLUGINS" "$PLUGINS"
summary
