#!/bin/bash
# Measures how the CUDA driver's checkpoint API behaves on the failure paths the CRIU plugin
# must survive (the simulated driver copies what this prints). Each experiment has a time limit
# and prints what it saw; nothing here asserts.
#
#   scripts/experiments/driver-facts.sh [OUT_DIR]       (needs nvcc, python3 and cuda-checkpoint-ctl)
#   PART=2 or PART=3 ... runs the second or third set (E9-E12; E13-E15, failed checkpoints and
#   restores, which needs prlimit)
#
# CTL: cuda-checkpoint-ctl (default: from PATH). WORK: scratch (default /tmp/driver-facts).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CTL=${CTL:-$(command -v cuda-checkpoint-ctl)}
WORK=${WORK:-/tmp/driver-facts}
OUT=${1:-$WORK}
mkdir -p "$WORK" "$OUT"
LOG=$OUT/driver-facts.log
: >"$LOG"
t0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
say() { printf '[%6s] %s\n' "$(since "$t0")" "$*" | tee -a "$LOG"; }
ctl() { # ctl ARGS...: runs the CLI, prints its output and exit status on one line
	local out rc
	out=$(timeout 60 "$CTL" "$@" 2>&1)
	rc=$?
	say "ctl $* -> rc=$rc: $(echo "$out" | tr '\n' ' ' | cut -c1-200)"
	return $rc
}
state() { timeout 10 "$CTL" --get-state --pid "$1" 2>&1 | tr '\n' ' '; }
cleanup() { pkill -9 -f "$WORK/gpu-" 2>/dev/null; pkill -9 -f "ptrace-hold" 2>/dev/null; }
trap cleanup EXIT

nvidia-smi -L | tee -a "$LOG"
nvidia-smi --query-gpu=driver_version --format=csv,noheader | tee -a "$LOG"
nvcc -O2 -o "$WORK/gpu-app" "$here/../gpu/gpu-app.cu" || exit 1
nvcc -O2 -o "$WORK/gpu-busy" "$here/../gpu/gpu-busy.cu" || exit 1
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1 | tr -d ' ')
BOGUS=GPU-00000000-1111-2222-3333-444444444444

# start_app NAME GIB: a gpu-app holding GIB GiB; sets PID.
start_app() {
	local st=$WORK/$1.status
	: >"$st"
	setsid "$WORK/gpu-app" "$2" 7 "$st" </dev/null >/dev/null 2>&1 &
	PID=$!
	for _ in $(seq 600); do grep -q ^ready "$st" && break; sleep 0.1; done
	say "$1: pid $PID ready ($(head -1 "$st"))"
}
verify() { # verify NAME PID: one verification step, prints it
	local st=$WORK/$1.status n
	n=$(grep -c verified "$st")
	kill -USR1 "$2"
	for _ in $(seq 300); do [ "$(grep -c verified "$st")" -gt "$n" ] && break; sleep 0.1; done
	say "$1: $(grep verified "$st" | tail -1) state=$(state "$2")"
}
# hold_thread TID SECONDS: a debugger (ptrace) stops one thread for SECONDS, then lets it go.
hold_thread() {
	python3 - "$1" "$2" ptrace-hold <<'PY' &
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
tid, secs = int(sys.argv[1]), float(sys.argv[2])
if libc.ptrace(0x4206, tid, 0, 0) != 0:  # PTRACE_SEIZE
    print("seize failed", ctypes.get_errno()); sys.exit(1)
libc.ptrace(0x4207, tid, 0, 0)  # PTRACE_INTERRUPT
os.waitpid(tid, 0x40000000)  # __WALL
print("holding", tid, flush=True)
time.sleep(secs)
libc.ptrace(17, tid, 0, 0)  # PTRACE_DETACH
print("released", tid, flush=True)
PY
	HOLDER=$!
}

# Part 3: what the driver leaves after a checkpoint or a restore that fails, the rollback the
# plugin then makes (its guardian reads the state and restores and/or unlocks), and whether the
# data survives. Not measured before: the simulation's error faults are taken either before any
# change (ERROR) or after it (ERROR@after), and `failed` loses the state; which one the driver
# does is what this prints (docs/driver-facts.md, "Not measured").
if [ "${PART:-1}" = 3 ]; then
say "commit: $(git -C "$here" describe --always --dirty 2>/dev/null || echo unknown)"
vm_kib() { awk '/^VmSize:/ { print $2 }' "/proc/$1/status"; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
gpu_mib() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$1" '$1 == p { print $2 }'; }
# fail_checkpoint NAME: a locked 4 GiB process whose checkpoint cannot get the host memory it
# moves the device data into (its address space limited to what it has plus 512 MiB; F17: the
# data goes into one new private mapping of the process); the limit is lifted afterwards.
fail_checkpoint() {
	start_app "$1" 4
	ctl --action lock --pid "$PID"
	local limit=$((($(vm_kib "$PID") + 524288) * 1024))
	prlimit --pid "$PID" --as="$limit:$limit"
	say "$1 before: VmSize=$(vm_kib "$PID") kB RSS=$(rss_kib "$PID") kB GPU=$(gpu_mib "$PID") MiB"
	local s
	s=$(date +%s.%N)
	ctl --action checkpoint --pid "$PID"
	say "$1 checkpoint returned after $(since "$s") s; state=$(state "$PID")"
	say "$1 after: VmSize=$(vm_kib "$PID") kB RSS=$(rss_kib "$PID") kB GPU=$(gpu_mib "$PID") MiB"
	prlimit --pid "$PID" --as=unlimited:unlimited
}

say "== E13: a checkpoint that fails for want of host memory, then unlock (the plugin's rollback of a locked process)"
fail_checkpoint e13
ctl --action unlock --pid "$PID"
say "E13 after unlock: state=$(state "$PID")"
verify e13 "$PID"
say "E13 a full cycle afterwards, with memory"
ctl --action lock --pid "$PID"
ctl --action checkpoint --pid "$PID"
ctl --action restore --pid "$PID"
ctl --action unlock --pid "$PID"
verify e13 "$PID"
kill -9 "$PID"

say "== E14: the same failed checkpoint, then restore before unlock (the rollback of a process the driver says is checkpointed)"
fail_checkpoint e14
ctl --action restore --pid "$PID"
say "E14 after restore: state=$(state "$PID")"
ctl --action unlock --pid "$PID"
say "E14 after unlock: state=$(state "$PID")"
verify e14 "$PID"
kill -9 "$PID"

say "== E15: a restore that fails for want of GPU memory (F10, reported only), then again with room"
start_app e15 4
ctl --action lock --pid "$PID"
ctl --action checkpoint --pid "$PID"
VICTIM=$PID
free_gib=$(($(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1) / 1024 - 1))
start_app e15-hog "$free_gib"
HOG=$PID
say "E15 hog holds $free_gib GiB; free now $(nvidia-smi --query-gpu=memory.free --format=csv,noheader | head -1)"
ctl --action restore --pid "$VICTIM"
say "E15 after the failed restore: state=$(state "$VICTIM") GPU=$(gpu_mib "$VICTIM") MiB"
kill -9 "$HOG"
sleep 2
ctl --action restore --pid "$VICTIM"
say "E15 after the second restore: state=$(state "$VICTIM")"
ctl --action unlock --pid "$VICTIM"
say "E15 after unlock: state=$(state "$VICTIM")"
verify e15 "$VICTIM"
kill -9 "$VICTIM"
say "== done"
exit 0
fi

if [ "${PART:-1}" = 2 ]; then
say "== E9: the caller of a checkpoint is killed while the checkpoint runs"
start_app e9 16
ctl --action lock --pid "$PID"
"$CTL" --action checkpoint --pid "$PID" >"$WORK/e9.ckpt" 2>&1 &
C9=$!
sleep 2
kill -9 "$C9" && say "E9 killed the checkpointing caller 2 s in"
for i in $(seq 30); do
	s=$(date +%s.%N)
	st=$(timeout 3 "$CTL" --get-state --pid "$PID" 2>&1 | tr '\n' ' ')
	say "E9 poll $i: state=$st (query took $(since "$s") s)"
	case $st in checkpointed* | failed* | running* | locked*) break ;; esac
done
ctl --action restore --pid "$PID"
ctl --action unlock --pid "$PID"
verify e9 "$PID"
kill -9 "$PID"

say "== E10: a lock waits for a busy GPU; its caller is killed before the kernel ends"
st=$WORK/e10.status
: >"$st"
setsid "$WORK/gpu-busy" 256 8000 "$st" </dev/null >/dev/null 2>&1 &
PID=$!
for _ in $(seq 300); do grep -q ^ready "$st" && break; sleep 0.1; done
sleep 1
"$CTL" --action lock --pid "$PID" --timeout 30000 >"$WORK/e10.lock" 2>&1 &
C10=$!
sleep 1
kill -9 "$C10" && say "E10 killed the locking caller 1 s in"
for i in $(seq 12); do
	sleep 1
	s=$(date +%s.%N)
	say "E10 t+$i s: state=$(timeout 3 "$CTL" --get-state --pid "$PID" 2>&1 | tr '\n' ' ') (query $(since "$s") s) kernels=$(grep -c kernel "$st")"
done
[ "$(state "$PID" | tr -d ' ')" = locked ] && ctl --action unlock --pid "$PID"
kill -9 "$PID"

say "== E11: a lock of a stopped process whose caller dies; nothing else asked; then SIGCONT"
start_app e11 1
kill -STOP "$PID"
"$CTL" --action lock --pid "$PID" --timeout 2000 >"$WORK/e11.lock" 2>&1 &
C11=$!
sleep 2
kill -9 "$C11" && say "E11 killed the locking caller while the process was stopped"
sleep 1
kill -CONT "$PID"
sleep 2
say "E11 2 s after SIGCONT: state=$(state "$PID")"
[ "$(state "$PID" | tr -d ' ')" = locked ] && ctl --action unlock --pid "$PID"
verify e11 "$PID"
kill -9 "$PID"

say "== E12: device maps naming GPUs that are not there"
start_app e12 1
ctl --action lock --pid "$PID"
ctl --action checkpoint --pid "$PID"
ctl --action restore --pid "$PID" --device-map "$UUID=$BOGUS"
ctl --action restore --pid "$PID" --device-map "$BOGUS=$UUID"
ctl --action restore --pid "$PID" --device-map "$UUID=$UUID,$BOGUS=$BOGUS"
say "E12 state=$(state "$PID")"
ctl --action restore --pid "$PID"
ctl --action unlock --pid "$PID"
verify e12 "$PID"
s=$(date +%s.%N)
"$CTL" --action lock --pid "$PID" >/dev/null
"$CTL" --action checkpoint --pid "$PID" >/dev/null &
sleep 0.3
ctl --get-restore-tid --pid "$PID"
say "E12 get-restore-tid during a checkpoint answered after $(since "$s") s"
wait
ctl --action restore --pid "$PID"
ctl --action unlock --pid "$PID"
kill -9 "$PID"
say "== done"
exit 0
fi

say "== E1: one 16 GiB process: state, a second action and a killed caller during a checkpoint"
start_app e1 16
ctl --action lock --pid "$PID"
s=$(date +%s.%N)
"$CTL" --action checkpoint --pid "$PID" >"$WORK/e1.ckpt" 2>&1 &
C1=$!
sleep 0.5
say "E1 during checkpoint: state=$(state "$PID")"
ctl --action unlock --pid "$PID"
ctl --action restore --pid "$PID"
ctl --action checkpoint --pid "$PID"
ctl --get-restore-tid --pid "$PID"
sleep 1
kill -9 "$C1"
say "E1 killed the checkpointing caller (pid $C1) after ~1.5 s"
for i in $(seq 40); do
	say "E1 t+$((i / 2)).$((i % 2 * 5)) s after kill: state=$(state "$PID")"
	case $(state "$PID") in checkpointed* | failed* | running*) break ;; esac
	sleep 0.5
done
ctl --action restore --pid "$PID"
ctl --action unlock --pid "$PID"
verify e1 "$PID"
kill -9 "$PID"

say "== E2: lock of a stopped process; the caller dies; the process continues later"
start_app e2 1
kill -STOP "$PID"
"$CTL" --action lock --pid "$PID" --timeout 2000 >"$WORK/e2.lock" 2>&1 &
C2=$!
sleep 4
say "E2 4 s after a lock with timeout 2000 ms: caller alive=$([ -d /proc/$C2 ] && echo yes || echo no) output=$(cat "$WORK/e2.lock") state=$(state "$PID")"
ctl --action unlock --pid "$PID"
kill -9 "$C2"
sleep 1
say "E2 caller killed; state=$(state "$PID")"
kill -CONT "$PID"
sleep 3
say "E2 3 s after SIGCONT: state=$(state "$PID")"
[ "$(state "$PID" | tr -d ' ')" = locked ] && ctl --action unlock --pid "$PID"
verify e2 "$PID"
kill -9 "$PID"

say "== E3: the target dies during a checkpoint"
start_app e3 16
ctl --action lock --pid "$PID"
s=$(date +%s.%N)
( "$CTL" --action checkpoint --pid "$PID" >"$WORK/e3.ckpt" 2>&1; echo "rc=$? after $(since "$s") s" >>"$WORK/e3.ckpt" ) &
C3=$!
sleep 1
kill -9 "$PID"
say "E3 killed the target 1 s into its checkpoint"
for _ in $(seq 300); do [ -d "/proc/$C3" ] || break; sleep 0.1; done
say "E3 caller: alive=$([ -d /proc/$C3 ] && echo yes || echo no) $(tr '\n' ' ')"
kill -9 "$C3" 2>/dev/null

say "== E4: lock and checkpoint while only the restore thread is held by a debugger"
start_app e4 2
TID=$("$CTL" --get-restore-tid --pid "$PID")
say "E4 restore tid $TID"
hold_thread "$TID" 6
sleep 0.5
s=$(date +%s.%N)
ctl --action lock --pid "$PID" --timeout 2000
say "E4 lock returned after $(since "$s") s; state=$(state "$PID")"
wait "$HOLDER" 2>/dev/null
[ "$(state "$PID" | tr -d ' ')" = running ] && ctl --action lock --pid "$PID"
hold_thread "$TID" 6
sleep 0.5
s=$(date +%s.%N)
ctl --action checkpoint --pid "$PID"
say "E4 checkpoint returned after $(since "$s") s; state=$(state "$PID")"
wait "$HOLDER" 2>/dev/null
ctl --action restore --pid "$PID"
ctl --action unlock --pid "$PID"
verify e4 "$PID"
kill -9 "$PID"

say "== E5: device maps on a one-GPU machine ($UUID)"
start_app e5 1
ctl --action lock --pid "$PID"
ctl --action checkpoint --pid "$PID"
ctl --action restore --pid "$PID" --device-map "$UUID=$UUID"
[ "$(state "$PID" | tr -d ' ')" = checkpointed ] && {
	ctl --action restore --pid "$PID" --device-map "$UUID=$BOGUS"
	ctl --action restore --pid "$PID" --device-map "$BOGUS=$UUID"
	ctl --action restore --pid "$PID" --device-map "$UUID=$UUID,$BOGUS=$BOGUS"
	ctl --action restore --pid "$PID"
}
say "E5 state=$(state "$PID")"
ctl --action unlock --pid "$PID"
verify e5 "$PID"
kill -9 "$PID"

say "== E6: lock of a process in a frozen cgroup (v2)"
start_app e6 1
CG=/sys/fs/cgroup/driver-facts-e6
if mkdir -p "$CG" 2>/dev/null && echo "$PID" >"$CG/cgroup.procs" 2>/dev/null && echo 1 >"$CG/cgroup.freeze"; then
	sleep 0.5
	say "E6 frozen: $(cat "$CG/cgroup.events" )"
	"$CTL" --action lock --pid "$PID" --timeout 2000 >"$WORK/e6.lock" 2>&1 &
	C6=$!
	sleep 5
	say "E6 5 s after a 2000 ms lock: caller alive=$([ -d /proc/$C6 ] && echo yes || echo no) $(cat "$WORK/e6.lock") state=$(state "$PID")"
	echo 0 >"$CG/cgroup.freeze"
	sleep 2
	say "E6 2 s after thawing: caller alive=$([ -d /proc/$C6 ] && echo yes || echo no) $(cat "$WORK/e6.lock") state=$(state "$PID")"
	[ "$(state "$PID" | tr -d ' ')" = locked ] && ctl --action unlock --pid "$PID"
	verify e6 "$PID"
else
	say "E6 skipped: no writable cgroup v2 here ($(stat -fc %T /sys/fs/cgroup))"
fi
kill -9 "$PID"

say "== E7: a busy GPU (8 s kernels): state, a second lock and an unlock during a lock"
st=$WORK/e7.status
: >"$st"
setsid "$WORK/gpu-busy" 256 8000 "$st" </dev/null >/dev/null 2>&1 &
PID=$!
for _ in $(seq 300); do grep -q ^ready "$st" && break; sleep 0.1; done
sleep 1
s=$(date +%s.%N)
( "$CTL" --action lock --pid "$PID" --timeout 20000 >"$WORK/e7.lock" 2>&1; echo "rc=$? after $(since "$s") s" >>"$WORK/e7.lock" ) &
C7=$!
sleep 1
say "E7 during the lock: state=$(state "$PID")"
ctl --action lock --pid "$PID" --timeout 1000
ctl --action unlock --pid "$PID"
ctl --action checkpoint --pid "$PID"
wait "$C7"
say "E7 first lock: $(tr '\n' ' ' <"$WORK/e7.lock") state=$(state "$PID")"
ctl --action unlock --pid "$PID"
s=$(date +%s.%N)
ctl --action lock --pid "$PID" --timeout 3000
say "E7 a 3000 ms lock returned after $(since "$s") s; state=$(state "$PID")"
kill -9 "$PID"

say "== E8: calls on processes without CUDA, and their cost"
sleep 100 &
SP=$!
ctl --get-state --pid "$SP"
ctl --get-restore-tid --pid "$SP"
ctl --action lock --pid "$SP"
start_app e8 1
s=$(date +%s.%N)
for _ in $(seq 20); do "$CTL" --get-state --pid "$PID" >/dev/null; done
say "E8 20 get-state execs of the CLI took $(since "$s") s"
kill -9 "$PID" "$SP"
say "== done"
