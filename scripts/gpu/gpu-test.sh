#!/bin/bash
# GPU test of cuda-checkpoint-ctl on a machine with an NVIDIA GPU (driver r570 or later):
# real CUDA applications (nvcc-built, and PyTorch) hold pseudo-random data, are toggled out to
# host memory and back with the CLI, and check their data bit for bit on the GPU afterwards.
#
#   scripts/gpu/gpu-test.sh [SIZES_GIB]      default sizes: "1 32"
#
# Environment: CTL (default: cuda-checkpoint-ctl from PATH), WORK (scratch, default
# /tmp/gpu-test), SKIP_TORCH=1 to leave PyTorch out, MULTI="4 4" (processes, GiB each).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CTL=${CTL:-$(command -v cuda-checkpoint-ctl || true)}
WORK=${WORK:-/tmp/gpu-test}
SIZES=${1:-"1 32"}
read -r MULTI_N MULTI_GIB <<<"${MULTI:-4 4}"
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
trap cleanup_apps EXIT

[ -x "$CTL" ] || { echo "cuda-checkpoint-ctl not found: set CTL"; exit 1; }
mkdir -p "$WORK"
say "== machine"
nvidia-smi --query-gpu=name,uuid,driver_version,memory.used,memory.total --format=csv
"$CTL" --gpus || fail "cuda-checkpoint-ctl --gpus"
nvcc -O2 -o "$WORK/gpu-app" "$here/gpu-app.cu" || { echo "nvcc failed"; exit 1; }

# roundtrip NAME GIB CMD...: start, verify, suspend (check state and GPU memory), resume, verify.
roundtrip() {
	local name=$1 gib=$2
	shift 2
	local st="$WORK/$name.status" pid used_before used_ckpt line t0
	start_app "$st" "$@"
	pid=$LAST_PID
	wait_for "$st" '^ready' 600 || { fail "$name: did not start"; return; }
	line=$(ask_verify "$pid" "$st")
	verified_ok "$line" || { fail "$name: first check: $line"; return; }
	used_before=$(gpu_used_mib)
	t0=$(now)
	"$CTL" --suspend --pid "$pid" --timeout 10000 --json >"$WORK/$name.suspend.json" ||
		{ fail "$name: suspend"; cat "$WORK/$name.suspend.json"; return; }
	say "$name: suspended in $(elapsed "$t0") s (lock $(json_ms "$WORK/$name.suspend.json" lock_ms) ms, checkpoint $(json_ms "$WORK/$name.suspend.json" checkpoint_ms) ms)"
	check "$name: state is checkpointed" test "$("$CTL" --get-state --pid "$pid")" = checkpointed
	used_ckpt=$(gpu_used_mib)
	say "$name: GPU memory used ${used_before} MiB -> ${used_ckpt} MiB while checkpointed"
	check "$name: GPU memory released" test "$used_ckpt" -lt $((used_before - gib * 1024 / 2))
	check "$name: no /dev/nvidia* fds left" bash -c "! ls -l /proc/$pid/fd | grep -q /dev/nvidia"
	t0=$(now)
	"$CTL" --resume --pid "$pid" --json >"$WORK/$name.resume.json" ||
		{ fail "$name: resume"; cat "$WORK/$name.resume.json"; return; }
	say "$name: resumed in $(elapsed "$t0") s (restore $(json_ms "$WORK/$name.resume.json" restore_ms) ms, unlock $(json_ms "$WORK/$name.resume.json" unlock_ms) ms)"
	check "$name: state is running" test "$("$CTL" --get-state --pid "$pid")" = running
	line=$(ask_verify "$pid" "$st")
	say "$name: after resume: $line"
	check "$name: data intact bit for bit" verified_ok "$line"
	kill -9 "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
}

for gib in $SIZES; do
	say "== nvcc application, $gib GiB"
	roundtrip "nvcc-${gib}g" "$gib" "$WORK/gpu-app" "$gib" 7 "$WORK/nvcc-${gib}g.status"
	if [ -z "${SKIP_TORCH:-}" ]; then
		say "== PyTorch application, $gib GiB"
		roundtrip "torch-${gib}g" "$gib" python3 "$here/torch-app.py" "$gib" 7 "$WORK/torch-${gib}g.status"
	fi
done

say "== $MULTI_N processes of $MULTI_GIB GiB under one parent, toggled as a tree"
start_app_tree "$MULTI_N" "$MULTI_GIB" "$WORK/multi." 300 || fail "multi: applications did not start"
for i in $(seq 1 "$MULTI_N"); do ask_verify "${kids[$((i - 1))]}" "$WORK/multi.$i.status" >/dev/null; done
if "$CTL" --suspend --tree "$parent" --timeout 10000 --json >"$WORK/multi.suspend.json"; then
	pass "multi: suspend --tree"
else
	fail "multi: suspend --tree"
	cat "$WORK/multi.suspend.json"
fi
"$CTL" --get-state --tree "$parent"
check "multi: all $MULTI_N checkpointed" test "$("$CTL" --get-state --tree "$parent" | grep -c checkpointed)" -eq "$MULTI_N"
if "$CTL" --resume --tree "$parent" --json >"$WORK/multi.resume.json"; then
	pass "multi: resume --tree"
else
	fail "multi: resume --tree"
	cat "$WORK/multi.resume.json"
fi
for i in $(seq 1 "$MULTI_N"); do
	line=$(ask_verify "${kids[$((i - 1))]}" "$WORK/multi.$i.status")
	check "multi: process $i data intact ($line)" verified_ok "$line"
done
cleanup_apps

say "== cuda-checkpoint command line, step by step"
st="$WORK/compat.status"
start_app "$st" "$WORK/gpu-app" 1 11 "$st"
pid=$LAST_PID
wait_for "$st" '^ready' 120
tid=$("$CTL" --get-restore-tid --pid "$pid")
check "get-restore-tid prints a thread of the process ($tid)" test -d "/proc/$pid/task/$tid"
check "get-state: running" test "$("$CTL" --get-state --pid "$pid")" = running
for step in "lock:locked" "checkpoint:checkpointed" "restore:locked" "unlock:running"; do
	a=${step%%:*} s=${step##*:}
	extra=()
	[ "$a" = lock ] && extra=(--timeout 5000)
	[ "$a" = restore ] && extra=(--device-map "$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)")
	"$CTL" --action "$a" --pid "$pid" "${extra[@]}"
	check "--action $a ${extra[*]} -> $s" test "$("$CTL" --get-state --pid "$pid")" = "$s"
done
"$CTL" --toggle --pid "$pid" && "$CTL" --toggle --pid "$pid"
check "toggle twice: running again" test "$("$CTL" --get-state --pid "$pid")" = running
line=$(ask_verify "$pid" "$st")
check "data intact after the step-by-step cycle" verified_ok "$line"

say "== what the driver answers in corner cases (facts for the simulation)"
sleep 300 &
plain=$!
for op in "--get-restore-tid" "--get-state" "--action lock"; do
	# shellcheck disable=SC2086 # $op is an option and its value
	out=$("$CTL" $op --pid "$plain" 2>&1)
	say "non-CUDA process, $op: exit $? : $out"
done
out=$("$CTL" --get-state --pid 999999 2>&1)
say "no such process, --get-state: exit $? : $out"
out=$("$CTL" --action unlock --pid "$pid" 2>&1)
say "unlock while running: exit $? : $out"
kill -STOP "$pid"
t0=$(now)
"$CTL" --action lock --pid "$pid" --timeout 2000 >"$WORK/stopped-lock.out" 2>&1 &
locker=$!
sleep 10
if kill -0 "$locker" 2>/dev/null; then
	say "lock of a SIGSTOPped process (timeout 2000 ms): still waiting after 10 s; sending SIGCONT"
	kill -CONT "$pid"
	wait "$locker"
	say "  ... the lock returned $? after $(elapsed "$t0") s, once the process ran: $(cat "$WORK/stopped-lock.out")"
else
	wait "$locker"
	say "lock of a SIGSTOPped process (timeout 2000 ms): exit $? after $(elapsed "$t0") s: $(cat "$WORK/stopped-lock.out")"
fi
say "state now: $("$CTL" --get-state --pid "$pid")"
kill -CONT "$pid"
sleep 1
"$CTL" --recover --pid "$pid"
say "after --recover: $("$CTL" --get-state --pid "$pid")"
line=$(ask_verify "$pid" "$st")
check "data intact after the corner cases" verified_ok "$line"
kill "$plain" 2>/dev/null
summary
