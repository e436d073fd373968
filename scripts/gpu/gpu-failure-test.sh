#!/bin/bash
# The failure paths of the CRIU plugin on a machine with an NVIDIA GPU: real CUDA applications
# dumped by real CRIU with the plugin, and CRIU stopped in every way an operator or a runtime
# stops it. Each case must end with the application running and its device data intact
# (checked on the GPU, word by word), or a clear refusal with nothing locked.
#
#   scripts/gpu/gpu-failure-test.sh [GIB]          default 4 (the size of the data-holding app)
#
# Environment: CRIU (default: criu from PATH), PLUGINS (a directory holding criu_gpu_plugin.so,
# default /usr/lib/criu), CTL (cuda-checkpoint-ctl), IMAGES (default /dev/shm/gpu-fail).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
PLUGINS=${PLUGINS:-/usr/lib/criu}
CTL=${CTL:-$(command -v cuda-checkpoint-ctl || true)}
WORK=${WORK:-/tmp/gpu-fail}
IMAGES=${IMAGES:-/dev/shm/gpu-fail}
GIB=${1:-4}
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
trap 'cleanup_apps; rm -rf "$IMAGES"' EXIT
mkdir -p "$WORK" "$IMAGES"
"$CRIU" --version | head -1
nvcc -O2 -o "$WORK/gpu-app" "$here/gpu-app.cu" || exit 1
nvcc -O2 -o "$WORK/gpu-busy" "$here/gpu-busy.cu" || exit 1

state() { timeout 10 "$CTL" --get-state --pid "$1" 2>&1 | tr -d ' \n'; }

# app NAME: a gpu-app of GIB GiB; sets PID and STATUS.
app() {
	STATUS=$WORK/$1.status
	start_app "$STATUS" "$WORK/gpu-app" "$GIB" 7 "$STATUS"
	PID=$LAST_PID
	wait_for "$STATUS" '^ready' 120
}

# busy NAME MS: a gpu-busy whose kernels take MS ms; sets PID and STATUS.
busy() {
	STATUS=$WORK/$1.status
	start_app "$STATUS" "$WORK/gpu-busy" 256 "$2" "$STATUS"
	PID=$LAST_PID
	wait_for "$STATUS" '^ready' 60
}

# intact NAME: the application runs (state running) and its data checks out on the GPU.
intact() {
	local st line
	for _ in $(seq 100); do
		st=$(state "$PID")
		[ "$st" = running ] && break
		sleep 0.2
	done
	line=$(ask_verify "$PID" "$STATUS")
	if [ "$st" = running ] && verified_ok "$line"; then
		pass "$1: the application runs with its data ($line)"
	else
		fail "$1: state '$st', check: $line"
	fi
}

# dump_bg DIR [args]: criu dump in the background; sets CRIU_PID.
dump_bg() {
	local dir=$1
	shift
	rm -rf "$dir" && mkdir -p "$dir"
	"$CRIU" dump -t "$PID" -D "$dir" --lib "$PLUGINS" -v4 -o dump.log "$@" >/dev/null 2>&1 &
	CRIU_PID=$!
}

# kill_at DIR PATTERN DELAY SIGNAL: signals CRIU once PATTERN is in its log.
kill_at() {
	local log=$1/dump.log t=0
	while ! grep -q "$2" "$log" 2>/dev/null; do
		sleep 0.01
		t=$((t + 1))
		[ $t -gt 6000 ] && { say "never saw /$2/"; return 1; }
		kill -0 "$CRIU_PID" 2>/dev/null || { say "CRIU ended before /$2/"; return 1; }
	done
	sleep "$3"
	kill "-$4" "$CRIU_PID"
	wait "$CRIU_PID" 2>/dev/null
	say "  CRIU got SIG$4 after /$2/"
}

# guardian_did DIR: what the guardian wrote, once it has returned the processes.
guardian_did() {
	for _ in $(seq 600); do
		grep -q "returned to its state before the dump\|could not be returned" "$1/gpu-guardian.log" 2>/dev/null && break
		sleep 0.1
	done
	sed 's/^/  guardian: /' "$1/gpu-guardian.log" 2>/dev/null | tail -4
}

case_killed() { # case_killed NAME PATTERN DELAY SIGNAL [busy MS]
	local name=$1 dir=$IMAGES/$1
	if [ "${5:-}" = busy ]; then busy "$name" "$6"; else app "$name"; fi
	local t0
	t0=$(now)
	dump_bg "$dir"
	kill_at "$dir" "$2" "$3" "$4" || { fail "$name: no kill point"; return; }
	guardian_did "$dir"
	say "  back after $(elapsed "$t0") s"
	intact "$name"
	kill -9 "$PID" 2>/dev/null
}

say "== 1. a lock that gives up: 8 s kernels, CRIU_GPU_LOCK_TIMEOUT_MS=2000"
busy lock-timeout 8000
dir=$IMAGES/lock-timeout
rm -rf "$dir" && mkdir -p "$dir"
CRIU_GPU_LOCK_TIMEOUT_MS=2000 "$CRIU" dump -t "$PID" -D "$dir" --lib "$PLUGINS" -v4 -o dump.log >/dev/null 2>&1
rc=$?
msg=$(grep 'Error: criu_gpu' "$dir/dump.log" | head -1)
say "  criu exit $rc: ${msg:0:300}"
if [ $rc -ne 0 ] && [[ $msg == *"did not finish within 2000 ms"* ]]; then pass "lock timeout reported plainly"; else fail "lock timeout message"; fi
intact lock-timeout
kill -9 "$PID"

say "== 2. the restore thread held by a debugger: refused, nothing locked"
app held-thread
tid=$("$CTL" --get-restore-tid --pid "$PID")
python3 - "$tid" 30 <<'PY' &
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
tid, secs = int(sys.argv[1]), float(sys.argv[2])
libc.ptrace(0x4206, tid, 0, 0); libc.ptrace(0x4207, tid, 0, 0); os.waitpid(tid, 0x40000000)
time.sleep(secs); libc.ptrace(17, tid, 0, 0)
PY
holder=$!
sleep 1
dir=$IMAGES/held-thread
rm -rf "$dir" && mkdir -p "$dir"
t0=$(now)
"$CRIU" dump -t "$PID" -D "$dir" --lib "$PLUGINS" -v4 -o dump.log >/dev/null 2>&1
rc=$?
msg=$(grep 'Error: criu_gpu' "$dir/dump.log" | head -1)
say "  criu exit $rc after $(elapsed "$t0") s: ${msg:0:300}"
if [ $rc -ne 0 ] && [[ $msg == *"nothing was locked"* ]]; then pass "held thread refused"; else fail "held thread"; fi
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
intact held-thread
kill -9 "$PID"

say "== 3. CRIU SIGKILLed while its lock waits for a 4 s kernel"
case_killed killed-at-lock "criu_gpu' hook 10" 1 KILL busy 4000
say "== 4. CRIU SIGKILLed during the GPU checkpoint ($GIB GiB)"
case_killed killed-at-checkpoint "criu_gpu' hook 11" 0.3 KILL
say "== 5. CRIU SIGKILLed while writing pages"
case_killed killed-at-pages "checkpointed 1 CUDA process" 0.2 KILL
say "== 6. CRIU sent SIGTERM (a runtime's timeout) while writing pages"
case_killed terminated "checkpointed 1 CUDA process" 0.2 TERM

say "== 7. a failing post-dump script"
app post-dump
dir=$IMAGES/post-dump
rm -rf "$dir" && mkdir -p "$dir"
# shellcheck disable=SC2016 # the script expands its own variable
printf '#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] && exit 1\nexit 0\n' >"$WORK/action.sh"
chmod +x "$WORK/action.sh"
"$CRIU" dump -t "$PID" -D "$dir" --lib "$PLUGINS" -v4 -o dump.log --action-script "$WORK/action.sh" >/dev/null 2>&1
say "  criu exit $?"
guardian_did "$dir"
intact post-dump
kill -9 "$PID"

say "== 8. two processes with 4 s kernels, locked together within criu --timeout 6"
dir=$IMAGES/pair
rm -rf "$dir" && mkdir -p "$dir"
: >"$WORK/pt1.status"
: >"$WORK/pt2.status"
setsid bash -c "'$WORK/gpu-busy' 256 4000 '$WORK/pt1.status' & '$WORK/gpu-busy' 256 4000 '$WORK/pt2.status' & wait" </dev/null >/dev/null 2>&1 &
root=$!
APPS+=("$root")
wait_for "$WORK/pt1.status" '^kernel' 60 && wait_for "$WORK/pt2.status" '^kernel' 60
t0=$(now)
"$CRIU" dump -t "$root" -D "$dir" --lib "$PLUGINS" -v4 -o dump.log --timeout 6 >/dev/null 2>&1
rc=$?
say "  criu exit $rc after $(elapsed "$t0") s: $(grep -o 'locked [0-9]* CUDA process(es) at once in [0-9.]* ms' "$dir/dump.log")"
if [ $rc -eq 0 ] && ! grep -q "Timeout reached" "$dir/dump.log"; then pass "two busy processes locked together within --timeout"; else fail "two busy processes: $(grep 'Error' "$dir/dump.log" | tail -2)"; fi
pkill -9 -f "$WORK/gpu-busy" 2>/dev/null

say "== 9. facts: a stopped process, asked for its restore thread and state with nothing pending"
app stopped-facts
kill -STOP "$PID"
t0=$(now)
say "  get-restore-tid: $(timeout 5 "$CTL" --get-restore-tid --pid "$PID" 2>&1 | tr '\n' ' ') ($(elapsed "$t0") s)"
t0=$(now)
say "  get-state: $(timeout 5 "$CTL" --get-state --pid "$PID" 2>&1 | tr '\n' ' ') (rc $?, $(elapsed "$t0") s)"
kill -CONT "$PID"
intact stopped-facts
kill -9 "$PID"

summary
