# shellcheck shell=bash disable=SC2034 # sourced: LAST_PID, kids and parent are read by the scripts that source it
# Shared helpers of the GPU-machine scripts (sourced, not run).
# Expects: CTL (cuda-checkpoint-ctl), WORK (scratch directory).

PASS=0
FAIL=0
APPS=()

say() { printf '%s\n' "$*"; }
pass() { PASS=$((PASS + 1)); say "PASS $*"; }
fail() { FAIL=$((FAIL + 1)); say "FAIL $*"; }
check() { # check DESCRIPTION COMMAND...: PASS if the command succeeds
	local what=$1
	shift
	if "$@"; then pass "$what"; else fail "$what"; fi
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# wait_for FILE REGEX SECONDS: waits until a line of FILE matches.
wait_for() {
	local file=$1 re=$2 limit=$3 t=0
	while ! grep -qE "$re" "$file" 2>/dev/null; do
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

summary() {
	say "----"
	say "passed: $PASS  failed: $FAIL"
	[ "$FAIL" -eq 0 ]
}
