# shellcheck shell=bash disable=SC2034 # sourced: LAST_PID, kids and parent are read by the scripts that source it
# The one helper library of the GPU-machine scripts (sourced, not run): the stamp every run
# prints first, PASS/FAIL counting, waits, the applications the measurements start, and the
# distributed jobs' process trees.
# Expects: WORK (scratch directory) for the applications; LOG_FILE (optional), a file every
# line also goes to.

PASS=0
FAIL=0
APPS=()

# NCCL on these machines. Never NVLink multicast (KINDS.md: it stays off); the transports a
# checkpoint takes, as `env` arguments (P2P and cuMem are refused: docs/known-limits.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NCCL_SHM=(NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0)
NCCL_SOCKETS=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0)
# sockets_over IFNAME: NCCL and gloo over IFNAME's sockets alone, for every job started after.
sockets_over() {
	export NCCL_SOCKET_IFNAME=$1 GLOO_SOCKET_IFNAME=$1 NCCL_IB_DISABLE=1 "${NCCL_SOCKETS[@]}"
}

say() { if [ -n "${LOG_FILE:-}" ]; then printf '%s\n' "$*" | tee -a "$LOG_FILE"; else printf '%s\n' "$*"; fi; }
log() { say "$(printf '[%(%T)T] ' -1)$*"; }
pass() { PASS=$((PASS + 1)); log "PASS $*"; }
fail() { FAIL=$((FAIL + 1)); log "FAIL $*"; }
check() { # check DESCRIPTION COMMAND...: PASS if the command succeeds
	local what=$1
	shift
	if "$@"; then pass "$what"; else fail "$what"; fi
}

# stamp PLUGIN: what every GPU run prints first: the commit of the tree (git describe --dirty;
# .carry/describe where the tree travelled without .git) and the build-id of the plugin it runs,
# so that each log names the code it ran (docs/gpu-runs/README.md).
stamp() {
	local top plugin=$1 describe id
	top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
	describe=$(git -C "$top" describe --always --dirty 2>/dev/null) ||
		describe="$(cat "$top/.carry/describe" 2>/dev/null || echo unknown) (from .carry/describe)"
	if command -v readelf >/dev/null && [ -f "$plugin" ]; then
		id=$(readelf -n "$plugin" | awk '/Build ID/ { print $3 }')
	else
		id="$(cat "$top/.carry/plugin-build-id" 2>/dev/null || echo unknown) (from .carry/plugin-build-id)"
	fi
	[ -f "$top/.carry/describe" ] && describe="$describe; .carry packed from $(cat "$top/.carry/describe")"
	say "commit: $describe"
	say "plugin build-id: ${id:-none} ($plugin)"
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
since() { elapsed "$1"; }

# wait_for FILE REGEX SECONDS [PID]: waits until a line of FILE matches; with PID, only while
# that process lives (a writer that died will not write it).
wait_for() {
	local file=$1 re=$2 limit=$3 pid=${4:-} t=0
	while ! grep -qE "$re" "$file" 2>/dev/null; do
		if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
			say "process $pid ended before /$re/ in $file"
			return 1
		fi
		sleep 0.2
		t=$((t + 1))
		if [ $t -ge $((limit * 5)) ]; then
			say "timeout waiting for /$re/ in $file"
			tail -3 "$file" 2>/dev/null
			return 1
		fi
	done
}

# count FILE REGEX: number of matching lines.
count() { grep -cE "$2" "$1" 2>/dev/null || true; }

gpu_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' '; }

# start_app STATUS CMD...: starts a test application in its own session, records its pid.
start_app() {
	local status=$1
	shift
	: >"$status"
	setsid "$@" </dev/null >"$status.out" 2>&1 &
	APPS+=("$!")
	LAST_PID=$!
}

# start_app_tree N GIB STATUS_PREFIX SECONDS: starts N gpu-app processes of GIB GiB each under
# one parent shell in its own session; the status of process i is STATUS_PREFIX$i.status. Sets
# `parent` and `kids` (in order of i), records them for cleanup_apps, and fails if a process is
# not ready within SECONDS.
start_app_tree() {
	local n=$1 gib=$2 prefix=$3 limit=$4 i ready=0
	: >"$WORK/tree.pids"
	setsid bash -c "for i in \$(seq 1 $n); do '$WORK/gpu-app' $gib \$i '$prefix'\$i'.status' & echo \$! >>'$WORK/tree.pids'; done; wait" </dev/null >/dev/null 2>&1 &
	parent=$!
	APPS+=("$parent")
	sleep 1
	for i in $(seq 1 "$n"); do wait_for "$prefix$i.status" '^ready' "$limit" || ready=1; done
	mapfile -t kids <"$WORK/tree.pids"
	APPS+=("${kids[@]}")
	return $ready
}

# ask_verify PID STATUS: makes the application check its data; waits for the answer.
ask_verify() {
	local pid=$1 status=$2 before
	before=$(count "$status" '^verified')
	kill -USR1 "$pid"
	local t=0
	while [ "$(count "$status" '^verified')" -le "$before" ]; do
		sleep 0.2
		t=$((t + 1))
		if [ $t -ge 1500 ]; then
			say "no verification answer from $pid"
			return 1
		fi
	done
	tail -1 "$status"
}

# verified_ok LINE: the application found its data intact.
verified_ok() { [[ $1 =~ mismatches=0( |$) || $1 == *"equal=True"* ]]; }

cleanup_apps() {
	for p in "${APPS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	APPS=()
}

# json_ms FILE FIELD: the largest value of a timing field over the processes of a
# cuda-checkpoint-ctl --json output (the concurrent processes' wall time).
json_ms() {
	python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
v = [p["timings"].get(sys.argv[2]) for p in d["processes"]]
print("%.1f" % max([x for x in v if x is not None] or [0]))' "$1" "$2"
}

# tree_of PID: its descendants, parents first
tree_of() { local p; for p in $(pgrep -P "$1"); do echo "$p"; tree_of "$p"; done; }
# shellcheck disable=SC2086 # a list of pids
kill_job() { local all; all="$1 $(tree_of "$1")"; kill -9 $all 2>/dev/null; wait "$1" 2>/dev/null; }
# wait_gone PIDS...: until no process of the list exists (CRIU restores pids), at most 30 s
wait_gone() { local p; for _ in $(seq 300); do for p in "$@"; do [ -d "/proc/$p" ] && { sleep 0.1; continue 2; }; done; return 0; done; return 1; }

summary() {
	say "----"
	say "passed: $PASS  failed: $FAIL"
	[ "$FAIL" -eq 0 ]
}
