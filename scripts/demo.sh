#!/bin/bash
# The main job, shown end to end: a GPU application holding 256 MiB of device memory is dumped
# to disk by `criu dump` with the installed plugin, killed, brought back by `criu restore`, and
# keeps checking its device data. Runs on the simulated GPU (no GPU needed); with --gpu, runs
# scripts/gpu/gpu-criu-test.sh on the machine's NVIDIA GPU instead.
#
#   sudo scripts/demo.sh [--gpu]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${PREFIX:-/usr/local}
export PATH="$PREFIX/bin:$PREFIX/sbin:$PATH"
if [ "${1:-}" = --gpu ]; then
	exec bash "$root/scripts/gpu/gpu-criu-test.sh" 1 1
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
	true
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
