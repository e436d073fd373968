#!/bin/bash
# Does CUDA run in a pid namespace of its own? scripts/gpu/migrate.sh starts each job under
# `unshare --pid --fork` (two "nodes" of one machine share its pids) without a /proc of that
# namespace; on two H200s every process failed there with cudaErrorOperatingSystem (304) at
# its first allocation and torch's device count. Each way of starting gpu-app (0.1 GiB) and
# torch's device count, with what CUDA answered; strace (where installed) lists the /proc
# paths CUDA opens that fail. Results in $OUT/pidns-cuda.txt. One call of < 1 minute:
#   OUT=$OUT bash scripts/experiments/pidns-cuda.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/pidns-cuda}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$OUT"
exec > >(tee "$OUT/pidns-cuda.txt") 2>&1
echo "commit: $(git -C "$here" describe --always --dirty 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
nvcc -O2 -o "$W/gpu-app" "$here/../gpu/gpu-app.cu" || exit 1
try() {
	local name=$1
	shift
	rm -f "$W/status"
	timeout 30 "$@" "$W/gpu-app" 0.1 7 "$W/status" </dev/null >"$W/out" 2>&1 &
	local p=$!
	for _ in $(seq 1 150); do
		grep -qE '^(ready|error)' "$W/status" 2>/dev/null && break
		kill -0 "$p" 2>/dev/null || break
		sleep 0.1
	done
	echo "$name: gpu-app: $(head -1 "$W/status" 2>/dev/null) $(head -1 "$W/out")"
	pkill -KILL -f "$W/gpu-app"
	wait "$p" 2>/dev/null
	echo "$name: torch: $(timeout 60 "$@" python3 -c 'import torch; print("device_count", torch.cuda.device_count()); torch.zeros(1, device="cuda"); print("allocated")' 2>&1 | grep -E 'device_count|allocated|Error' | tr '\n' ' ')"
}
try plain env
try "unshare --pid --fork" unshare --pid --fork
try "unshare --pid --fork --mount-proc" unshare --pid --fork --mount-proc
if command -v strace >/dev/null; then
	echo "failed opens under unshare --pid --fork:"
	timeout 30 unshare --pid --fork strace -f -e trace=openat,open,readlink -o "$W/trace" "$W/gpu-app" 0.1 7 "$W/status2" </dev/null >/dev/null 2>&1 &
	sleep 15
	pkill -KILL -f "$W/gpu-app"
	wait
	grep -E '= -1' "$W/trace" | grep -E '/proc|/dev|/sys' | awk '{ $1 = ""; print }' | sort | uniq -c | sort -rn | head -20
else
	echo "no strace here"
fi
