#!/bin/bash
# The main job, shown end to end: a GPU application holding device memory is dumped to disk by
# `criu dump` with the installed plugin, killed, brought back by `criu restore`, and checks its
# device data afterwards. Runs on the simulated GPU (no GPU needed, 256 MiB).
#
# With --gpu, on the machine's NVIDIA GPU (1 GiB), it needs, and checks first:
#   root; CRIU 4.0 or later (`criu` in PATH, PREFIX/sbin first) with the plugin in CRIU's plugin
#   directory (PLUGINS, /usr/lib/criu): scripts/install.sh or the criu-gpu package;
#   the NVIDIA driver, r570 or later, with a GPU (cuda-checkpoint-ctl --gpus sees it);
#   nvcc (the CUDA toolkit, in PATH or /usr/local/cuda/bin) to build the application,
#   scripts/gpu/gpu-app.cu of this repository.
#
#   sudo scripts/demo.sh [--gpu]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${PREFIX:-/usr/local}
export PATH="$PREFIX/bin:$PREFIX/sbin:$PATH"

# need WHAT FIX: says what is missing and how to get it, and stops.
need() {
	echo "demo.sh --gpu needs $1: $2" >&2
	exit 1
}

# The checks of --gpu, each with its fix; nothing is started before all pass.
gpu_needs() {
	[ "$(id -u)" = 0 ] || need "root" "CRIU dumps and restores processes as root: sudo bash scripts/demo.sh --gpu"
	local v
	v=$(criu --version 2>/dev/null | sed -n 's/^Version: //p') || true
	[ -n "$v" ] || need "CRIU" "no criu in PATH: bash scripts/install.sh (or apt install ./criu-gpu_*.deb)"
	[ "${v%%.*}" -ge 4 ] || need "CRIU 4.0 or later" "$(command -v criu) is CRIU $v: bash scripts/install.sh installs 4.2.1"
	[ -f "$PLUGINS/criu_gpu_plugin.so" ] ||
		need "the plugin" "no criu_gpu_plugin.so in $PLUGINS: bash scripts/install.sh (or set PLUGINS)"
	command -v cuda-checkpoint-ctl >/dev/null ||
		need "cuda-checkpoint-ctl" "bash scripts/install.sh installs it in $PREFIX/bin"
	if ! { cuda-checkpoint-ctl --gpus >"$work/gpus" 2>&1 && grep -q GPU- "$work/gpus"; }; then
		need "an NVIDIA GPU and its driver (r570 or later)" "$(head -1 "$work/gpus") (install the driver; nvidia-smi must list the GPU; without a GPU, run the demo without --gpu)"
	fi
	export PATH="$PATH:/usr/local/cuda/bin"
	command -v nvcc >/dev/null ||
		need "nvcc (the CUDA toolkit) to build its GPU application" "install the CUDA toolkit, or put nvcc in PATH"
	[ -f "$root/scripts/gpu/gpu-app.cu" ] ||
		need "scripts/gpu/gpu-app.cu" "run it from a checkout of the repository"
}

# verify PID STATUS: the application checks all its device data; prints its answer.
verify() {
	local before
	before=$(grep -c '^verified' "$2" || true)
	kill -USR1 "$1"
	for _ in $(seq 600); do
		[ "$(grep -c '^verified' "$2" || true)" -gt "$before" ] && break
		sleep 0.1
	done
	grep '^verified' "$2" | tail -1
}

# The same round trip on the machine's GPU, with the nvcc-built application.
gpu_demo() {
	gpu_needs
	echo "commit $(git -C "$root" describe --dirty --always 2>/dev/null || echo unknown)," \
		"plugin build-id $(readelf -n "$PLUGINS/criu_gpu_plugin.so" 2>/dev/null | awk '/Build ID:/ { print $3 }')"
	nvcc -O2 -o "$work/gpu-app" "$root/scripts/gpu/gpu-app.cu" || need "a working nvcc" "nvcc failed (above)"
	cat "$work/gpus"
	setsid "$work/gpu-app" 1 7 "$work/app.status" </dev/null >"$work/app.out" 2>&1 &
	app=$!
	for _ in $(seq 600); do grep -q '^ready' "$work/app.status" 2>/dev/null && break; sleep 0.1; done
	grep -q '^ready' "$work/app.status" || { echo "the application did not start:"; cat "$work/app.out"; exit 1; }
	echo "before: $(verify "$app" "$work/app.status")"
	mkdir -p "$work/images"
	echo "$ criu dump -t $app -D $work/images --lib $PLUGINS"
	criu dump -t "$app" -D "$work/images" --lib "$PLUGINS" -v4 -o dump.log ||
		{ grep -E 'Error|criu_gpu' "$work/images/dump.log"; exit 1; }
	for _ in $(seq 100); do [ -d "/proc/$app" ] || break; sleep 0.05; done
	echo "$ criu restore -D $work/images -d --lib $PLUGINS"
	criu restore -D "$work/images" -d --lib "$PLUGINS" -v4 -o restore.log ||
		{ grep -E 'Error|criu_gpu' "$work/images/restore.log"; exit 1; }
	grep -h 'criu_gpu:' "$work/images/dump.log" "$work/images/restore.log" | sed 's/^/  log: /'
	local after
	after=$(verify "$app" "$work/app.status")
	echo "after:  $after"
	[[ $after == *"mismatches=0 "* ]] || { echo "FAILED: the application found wrong device data"; exit 1; }
	echo
	echo "OK: pid $app was checkpointed, restored, and found its 1 GiB of device data intact on the GPU."
}

if [ "${1:-}" = --gpu ]; then
	PLUGINS=${PLUGINS:-/usr/lib/criu}
	work=$(mktemp -d /tmp/criu-gpu-demo.XXXXXX)
	app=
	# The images' pages (the GiB of device data) go; the logs stay in $work.
	trap '[ -n "$app" ] && kill -9 "$app" 2>/dev/null; rm -f "$work"/images/pages-*.img; true' EXIT
	gpu_demo
	exit 0
fi
SIM=$PREFIX/lib/criu-gpu/sim
work=$(mktemp -d /tmp/criu-gpu-demo.XXXXXX)
export CUDA_SIM_SOCKET=$work/gpud.sock
export CUDA_CKPT_LIBCUDA=$SIM/libcuda.so.1 CUDA_CKPT_LIBNVML=$SIM/libnvidia-ml.so.1
app=
gpud=
cleanup() {
	[ -n "$app" ] && kill -9 "$app" 2>/dev/null
	[ -n "$gpud" ] && kill "$gpud" 2>/dev/null
	# The images' pages go; the logs stay in $work.
	rm -f "$work"/images/pages-*.img
}
trap cleanup EXIT
steps() {
	local n
	n=$(grep -c ' ok$' "$work/app.log" 2>/dev/null)
	echo "${n:-0}"
}
wait_steps() { # wait_steps N: until the log has N verified steps
	for _ in $(seq 200); do [ "$(steps)" -ge "$1" ] && return 0; sleep 0.1; done
	echo "the application did not advance"; tail -3 "$work/app.log"; return 1
}

echo "simulated GPU (SIMULATED driver: $SIM), work directory $work"
cuda-sim-gpud --gpus 1 --memory 2GiB 2>"$work/gpud.log" &
gpud=$!
for _ in $(seq 100); do [ -S "$CUDA_SIM_SOCKET" ] && break; sleep 0.05; done
LD_LIBRARY_PATH=$SIM setsid cuda-sim-app --mib 256 --log "$work/app.log" </dev/null >/dev/null 2>&1 &
app=$!
wait_steps 3
cuda-checkpoint-ctl --list --pid "$app"
echo
echo "$ criu dump -t $app -D $work/images    (the plugin is picked up from CRIU's plugin directory)"
mkdir -p "$work/images"
t=$(date +%s%N)
criu dump -t "$app" -D "$work/images" -v4 -o dump.log || { grep -E 'Error|criu_gpu' "$work/images/dump.log"; exit 1; }
echo "dumped in $((($(date +%s%N) - t) / 1000000)) ms, image $(du -sh "$work/images" | cut -f1)"
before=$(steps)
for _ in $(seq 100); do [ -d "/proc/$app" ] || break; sleep 0.05; done
echo "the process is gone; the GPU holds nothing for it:"
cuda-checkpoint-ctl --gpus
echo
echo "$ criu restore -D $work/images -d"
criu restore -D "$work/images" -d -v4 -o restore.log || { grep -E 'Error|criu_gpu' "$work/images/restore.log"; exit 1; }
wait_steps $((before + 5))
grep -h 'criu_gpu:' "$work/images/dump.log" "$work/images/restore.log" | sed 's/^/  log: /'
cuda-checkpoint-ctl --list --pid "$app"
if grep -q MISMATCH "$work/app.log"; then
	echo "FAILED: the application found wrong device data"
	exit 1
fi
echo
echo "OK: pid $app was checkpointed at step $before, restored, and verified its 256 MiB of device data at every step since (now step $(steps))."
