#!/bin/bash
# A two-rank DDP job training flat out (scripts/gpu/ddp-job.py --sleep 0 --model wide, a log line
# every 10 steps), checkpointed through `criu-gpu` as its users would, on a machine with two GPUs:
#   ref-MODE     an uninterrupted run, the reference
#   chain-MODE   N dumps of one run, each restored (the job goes on from each), at random steps;
#                every dump's lock phase (rounds, seconds) in a table; the run's every line
#                equal to the reference at the end
#   snapshot     a --leave-running snapshot: how long the job stood still (its own step times)
#                and CRIU's phases (-v4 log); the job runs to its end; the snapshot is restored
#                (--truncate-grown: its logs grew) and runs to its end equal to the reference
#   kill-dump    CRIU SIGKILLed in the middle of a dump, once the locks are taken: both ranks go
#                on, equal to the reference (kill-dump-late: later, in CRIU's own work on the
#                tasks, which CRIU cannot survive: docs/known-limits.md)
#   kill-restore CRIU SIGKILLed in the middle of a restore: the images restore again, equal
#   rank-dies    a rank SIGKILLed while the dump locks: the dump fails, the other rank is put
#                back (running)
#   four         four ranks, two per GPU (if NCCL takes them)
# MODE is spawn (torch.multiprocessing; NCCL over shared memory without cuMem) or torchrun
# (agent and workers; NCCL over sockets). Each part is bounded and prints what it saw.
#
#   OUT=/tmp/out scripts/gpu/flat-out.sh "ref-spawn chain-spawn snapshot kill-dump"
# Environment: CYCLES (20), STEPS (1500, or more where CYCLES dumps need it: see CHAIN_STEPS),
# BALLAST (GiB per rank, 0.25), LIBUV (plain: the job
# as PyTorch starts it, libuv's io_uring rings and all; off: USE_LIBUV=0, and torchrun started
# with io_uring disabled, as before CRIU patch 0008); to try the script on a
# machine without a GPU: DEVICE=cpu MODEL=mlp PYTHON=/path/to/venv/bin/python3 (gloo, no CUDA).
# Needs .carry (scripts/gpu/pack-carry.sh) in the working tree.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/flat-out}
PARTS=${1:-"ref-spawn chain-spawn snapshot kill-dump rank-dies"}
CYCLES=${CYCLES:-20}
# A chain dumps first at step 60 + 0-39, then every 30 + 0-49 steps (random, so that dumps land
# anywhere in a step); the job must still be running at the last dump, so its steps cover
# CYCLES times the largest gap and some.
FIRST_MAX=99 GAP_MAX=79
CHAIN_STEPS=$((FIRST_MAX + (CYCLES - 1) * GAP_MAX + 100))
STEPS=${STEPS:-$((CHAIN_STEPS > 1500 ? CHAIN_STEPS : 1500))}
BALLAST=${BALLAST:-0.25}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-wide}
PYTHON=${PYTHON:-python3}
LIBUV=${LIBUV:-plain}
TORCHRUN=$(dirname "$(command -v "$PYTHON")")/torchrun
W=/dev/shm/flat-out
export PATH="$root/.carry/bin:$PATH"
PLUG=$root/.carry/plugins
JOB=$here/ddp-job.py
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$W"
LOG_FILE=$OUT/flat-out.log
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
stamp "$PLUG/criu_gpu_plugin.so"
# last_step DIR: the last step both ranks logged (-1: none)
last_step() {
	local a b
	a=$(grep -oE '^step [0-9]+' "$1/rank0.log" 2>/dev/null | tail -1 | cut -d' ' -f2)
	b=$(grep -oE '^step [0-9]+' "$1/rank1.log" 2>/dev/null | tail -1 | cut -d' ' -f2)
	a=${a:--1} b=${b:--1}
	echo $((a < b ? a : b))
}
# wait_step DIR N SECONDS: both ranks logged step N or later
wait_step() {
	local t=0
	while [ "$(last_step "$1")" -lt "$2" ]; do
		t=$((t + 1)); [ $t -ge $(($3 * 10)) ] && return 1
		sleep 0.1
	done
}
finished() { local t=0; while ! { grep -q '^done' "$1/rank0.log" 2>/dev/null && grep -q '^done' "$1/rank1.log" 2>/dev/null; }; do t=$((t + 1)); [ $t -ge $(($2 * 10)) ] && return 1; sleep 0.1; done; }
# same DIR REF: every logged step, loss, all_reduce check, the parameters and the ballast equal
same() {
	local r
	for r in 0 1; do
		diff <(grep -E '^(step|params|ballast|store)' "$2/rank$r.log") <(grep -E '^(step|params|ballast|store)' "$1/rank$r.log") \
			>"$OUT/diff.$(basename "$1").$r" || return 1
	done
	! grep -q BAD "$1"/rank*.log
}

# start NAME MODE ENV...: sets JOBPID, DIR
start() {
	local name=$1 mode=$2
	shift 2
	DIR=$W/$name
	rm -rf "$DIR" && mkdir -p "$DIR"
	local a=(--steps "$STEPS" --sleep 0 --model "$MODEL" --log-every 10 --ballast "$BALLAST" --times --device "$DEVICE")
	if [ "$mode" = spawn ]; then
		env "$@" setsid "$PYTHON" "$JOB" --spawn 2 "$DIR" "${a[@]}" --port $((29600 + RANDOM % 300)) \
			</dev/null >"$DIR/stdout" 2>&1 &
	else
		env "$@" setsid "$TORCHRUN" --standalone --nproc-per-node 2 "$JOB" "$DIR" "${a[@]}" \
			</dev/null >"$DIR/stdout" 2>&1 &
	fi
	JOBPID=$!
}

# The job's environment: NCCL's transports as restorable; libuv's TCPStore as PyTorch starts it
# (its io_uring rings are dumped by the project's CRIU, patch 0008) unless LIBUV=off.
env_of() {
	local nccl
	if [ "$1" = spawn ]; then nccl="${NCCL_SHM[*]}"; else nccl="${NCCL_SOCKETS[*]}"; fi
	if [ "$LIBUV" = off ]; then echo "$nccl USE_LIBUV=0"; else echo "$nccl"; fi
}
# LIBUV=off: torchrun's agent holds libuv's io_uring whatever its settings, so it starts with
# io_uring off (the only way before patch 0008)
uring_off() { [ "$1" = torchrun ] && [ "$LIBUV" = off ] && { URING_WAS=$(cat /proc/sys/kernel/io_uring_disabled); echo 2 >/proc/sys/kernel/io_uring_disabled; }; true; }
uring_back() { [ -n "${URING_WAS:-}" ] && echo "$URING_WAS" >/proc/sys/kernel/io_uring_disabled; URING_WAS=; true; }

part_ref() {
	local mode=$1 t0
	log "== $mode: uninterrupted reference run ($STEPS steps flat out)"
	uring_off "$mode"
	t0=$(date +%s.%N)
	# shellcheck disable=SC2046
	start "ref-$mode" "$mode" $(env_of "$mode")
	if finished "$DIR" 240; then
		log "ref-$mode: $STEPS steps in $(since "$t0") s ($(grep '^params' "$DIR/rank0.log"))"
	else
		fail "ref-$mode did not finish: $(tail -3 "$DIR/stdout" | tr '\n' ' ')"
	fi
	uring_back
	kill_job "$JOBPID"
}

# lock_line DIR: the plugin's lock line of the dump log in DIR
lock_line() { grep -oE 'criu_gpu: locked [0-9]+ CUDA process.*' "$1/dump.log" | head -1; }

part_chain() {
	local mode=$1 i at next img rc t0 dt rt lock pids
	log "== $mode: $CYCLES dumps of one run training flat out, each restored"
	[ -d "$W/ref-$mode" ] || { fail "chain-$mode: no reference"; return; }
	if [ "$STEPS" -lt "$CHAIN_STEPS" ]; then
		fail "chain-$mode: STEPS=$STEPS cannot hold $CYCLES dumps up to $GAP_MAX steps apart: STEPS=$CHAIN_STEPS or more (the reference too)"
		return
	fi
	uring_off "$mode"
	# shellcheck disable=SC2046
	start "chain-$mode" "$mode" $(env_of "$mode")
	img=$W/img-chain-$mode
	next=$((60 + RANDOM % (FIRST_MAX - 59)))
	printf '%-5s %-6s %-8s %-9s %-9s %s\n' cycle step dump_s restore_s lock_s rounds >"$OUT/chain-$mode.tsv"
	for i in $(seq 1 "$CYCLES"); do
		if ! wait_step "$DIR" "$next" 120; then fail "chain-$mode: cycle $i: no step $next: $(tail -2 "$DIR/stdout" | tr '\n' ' ')"; break; fi
		at=$(last_step "$DIR")
		pids="$JOBPID $(tree_of "$JOBPID" | tr '\n' ' ')"
		rm -rf "$img"
		t0=$(date +%s.%N)
		timeout 300 criu-gpu dump "$JOBPID" "$img" -- --lib "$PLUG" >"$OUT/chain-$mode.dump.out" 2>&1
		rc=$? dt=$(since "$t0")
		lock=$(lock_line "$img")
		if [ $rc != 0 ]; then
			fail "chain-$mode: cycle $i (step $at): dump rc=$rc: $(grep -E 'Error|problem|GPU work' "$OUT/chain-$mode.dump.out" | head -3 | tr '\n' ' ')"
			gzip -c "$img/dump.log" >"$OUT/chain-$mode.failed-dump.log.gz" 2>/dev/null
			break
		fi
		wait "$JOBPID" 2>/dev/null # our child until the first restore
		# shellcheck disable=SC2086
		wait_gone $pids || log "chain-$mode: cycle $i: the dumped processes are still there"
		t0=$(date +%s.%N)
		rm -rf "$img.work"
		timeout 300 criu-gpu restore "$img" --work-dir "$img.work" -- --lib "$PLUG" >"$OUT/chain-$mode.restore.out" 2>&1
		rc=$? rt=$(since "$t0")
		if [ $rc != 0 ]; then
			fail "chain-$mode: cycle $i: restore rc=$rc: $(grep -E 'Error|problem' "$OUT/chain-$mode.restore.out" | head -3 | tr '\n' ' ')"
			gzip -c "$img.work/restore.log" >"$OUT/chain-$mode.failed-restore.log.gz" 2>/dev/null
			break
		fi
		printf '%-5s %-6s %-8s %-9s %-9s %s\n' "$i" "$at" "$dt" "$rt" \
			"$(echo "$lock" | grep -oE 'in [0-9.]+ (s|ms)' | head -1)" "$lock" >>"$OUT/chain-$mode.tsv"
		log "chain-$mode: cycle $i at step $at: dump $dt s, restore $rt s; $lock"
		next=$((at + 30 + RANDOM % (GAP_MAX - 29)))
	done
	if [ "$i" = "$CYCLES" ] && [ "$rc" = 0 ]; then
		if finished "$DIR" 240 && same "$DIR" "$W/ref-$mode"; then
			pass "chain-$mode: $CYCLES of $CYCLES dumps of the job training flat out, each restored; every logged loss and all_reduce check, the parameters and the ballast equal the uninterrupted run ($(grep '^params' "$DIR/rank0.log"))"
		else
			fail "chain-$mode: after $CYCLES cycles the run differs from the reference or did not finish: $(head -3 "$OUT"/diff.chain-"$mode".* 2>/dev/null | tr '\n' ' ') $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
		fi
	fi
	cat "$OUT/chain-$mode.tsv" >>"$OUT/flat-out.log"
	uring_back
	kill_job "$JOBPID"
	rm -rf "$img"
}

# driver_times FILE: the GPU phases the plugin timed (its gpu-timings-dump.json or
# gpu-timings-restore.json), each as NAME SECONDS s (GiB)
driver_times() {
	"$PYTHON" - "$1" <<'PYEOF' 2>&1
import json, sys
t = json.load(open(sys.argv[1]))["body"]
print(", ".join("%s %.2f s (%.2f GiB, %d processes)" % (p["name"], p["seconds"], p["bytes"] / 2**30, p["processes"]) for p in t["phases"]))
PYEOF
}

# gap DIR: the longest pause between two steps in rank 0's times, and the step after it
gap() { awk 'NR > 1 { d = $2 - t; if (d > m) { m = d; s = $1 } } { t = $2 } END { printf "%.3f s before step %d", m, s }' "$1/rank0.times"; }

part_snapshot() {
	local img=$W/img-snapshot rc t0 at
	log "== a --leave-running snapshot: how long the job stood still; then rolled back to"
	[ -d "$W/ref-spawn" ] || { fail "snapshot: no reference"; return; }
	# shellcheck disable=SC2046
	start snapshot spawn $(env_of spawn)
	wait_step "$DIR" 300 120 || { fail "snapshot: no step 300"; kill_job "$JOBPID"; return; }
	at=$(last_step "$DIR")
	rm -rf "$img"
	t0=$(date +%s.%N)
	timeout 300 criu-gpu dump "$JOBPID" "$img" --leave-running -- --lib "$PLUG" -v4 >"$OUT/snapshot.dump.out" 2>&1
	rc=$?
	log "snapshot: criu-gpu dump --leave-running at step $at: rc=$rc in $(since "$t0") s"
	sed 's/^/  /' "$OUT/snapshot.dump.out" >>"$OUT/flat-out.log"
	[ $rc = 0 ] || { fail "snapshot: dump"; kill_job "$JOBPID"; return; }
	# CRIU's phases, from its log's own clock
	grep -E 'Seizing|Seized task|criu_gpu: (locked|checkpointed|time in)|pages: pid .*(planned|copied|wrote)|Running post-dump|post-dump|Unfreez|Unseiz|Dumping finished|Writing image inventory' \
		"$img/dump.log" | head -60 | sed 's/^/  criu: /' >>"$OUT/flat-out.log"
	gzip -c "$img/dump.log" >"$OUT/snapshot.dump.log.gz"
	log "snapshot: the driver's phases of the dump (gpu-timings-dump.json): $(driver_times "$img/gpu-timings-dump.json")"
	log "snapshot: the images: $(du -sh "$img" | cut -f1)"
	if finished "$DIR" 240; then
		log "snapshot: the job went on and finished; it stood still at most $(gap "$DIR")"
		cp "$DIR/rank0.times" "$OUT/snapshot.rank0.times"
		if same "$DIR" "$W/ref-spawn"; then pass "snapshot: the job that went on equals the uninterrupted run"; else fail "snapshot: the job that went on differs"; fi
	else
		fail "snapshot: the job did not finish after the snapshot"
	fi
	kill_job "$JOBPID"
	timeout 300 criu-gpu restore "$img" -- --lib "$PLUG" >"$OUT/snapshot.restore-refused.out" 2>&1
	rc=$?
	log "snapshot: restore without --truncate-grown: rc=$rc; $(grep -E '^problem' "$OUT/snapshot.restore-refused.out" | head -4 | tr '\n' ' ')"
	if [ $rc != 1 ] || ! grep -q 'grew from' "$OUT/snapshot.restore-refused.out"; then fail "snapshot: the grown logs were not named"; fi
	t0=$(date +%s.%N)
	timeout 300 criu-gpu restore "$img" --truncate-grown -- --lib "$PLUG" >"$OUT/snapshot.restore.out" 2>&1
	rc=$?
	log "snapshot: restore --truncate-grown: rc=$rc in $(since "$t0") s; $(grep -E '^cut ' "$OUT/snapshot.restore.out" | tr '\n' ' ')"
	log "snapshot: the driver's phases of the restore (gpu-timings-restore.json): $(driver_times "$img/gpu-timings-restore.json")"
	if [ $rc = 0 ] && finished "$DIR" 240 && same "$DIR" "$W/ref-spawn"; then
		pass "snapshot: rolled back to after the job had finished: restored with its logs cut back, ran to its end equal to the uninterrupted run"
	else
		fail "snapshot: the rollback: rc=$rc $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
		gzip -c "$img/restore.log" >"$OUT/snapshot.restore.log.gz" 2>/dev/null
	fi
	kill_job "$JOBPID"
	rm -rf "$img"
}

# kill_dump NAME WHEN: CRIU SIGKILLed once criu-gpu's progress shows WHEN ("GPU: locked": before
# CRIU's own work on the tasks; "GPU: checkpointed": in it, with the job's sockets in TCP repair
# and its threads running CRIU's code one after another, which CRIU cannot survive: the job is
# expected to die there, docs/known-limits.md)
kill_dump() {
	local name=$1 when=$2 cg
	log "== CRIU SIGKILLed in the middle of the job's dump, at '$when'"
	# shellcheck disable=SC2046
	start "$name" spawn $(env_of spawn)
	wait_step "$DIR" 200 120 || { fail "$name: no step 200"; kill_job "$JOBPID"; return; }
	criu-gpu dump "$JOBPID" "$W/img-$name" -- --lib "$PLUG" >"$OUT/$name.out" 2>&1 &
	cg=$!
	for _ in $(seq 400); do grep -q "$when" "$OUT/$name.out" && break; sleep 0.01; done
	pkill -9 -x criu.real
	wait $cg 2>/dev/null
	log "$name: $(grep -E 'GPU:|failed' "$OUT/$name.out" | tr '\n' ' ')"
	if finished "$DIR" 60 && same "$DIR" "$W/ref-spawn"; then
		pass "$name: criu killed at '$when'; both ranks were put back and finished equal to the uninterrupted run"
	else
		fail "$name: criu killed at '$when': $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
	fi
	sed 's/^/  guardian: /' "$W/img-$name/gpu-guardian.log" >>"$OUT/flat-out.log" 2>/dev/null
	kill_job "$JOBPID"
	rm -rf "$W/img-$name"
}

part_kill-dump() { kill_dump kill-dump-locked 'GPU: locked'; }
part_kill-dump-late() { kill_dump kill-dump-late 'GPU: checkpointed'; }

part_kill-restore() {
	local img=$W/img-kill-restore cg pids rc
	log "== CRIU SIGKILLed in the middle of the job's restore"
	# shellcheck disable=SC2046
	start kill-restore spawn $(env_of spawn)
	wait_step "$DIR" 200 120 || { fail "kill-restore: no step 200"; kill_job "$JOBPID"; return; }
	pids="$JOBPID $(tree_of "$JOBPID" | tr '\n' ' ')"
	timeout 300 criu-gpu dump "$JOBPID" "$img" -- --lib "$PLUG" >"$OUT/kill-restore.dump.out" 2>&1 || { fail "kill-restore: dump"; kill_job "$JOBPID"; return; }
	wait "$JOBPID" 2>/dev/null
	# shellcheck disable=SC2086
	wait_gone $pids
	criu-gpu restore "$img" -- --lib "$PLUG" >"$OUT/kill-restore.out" 2>&1 &
	cg=$!
	# The moment the driver's restore starts (the plugin's late hook), or CRIU's pages
	for _ in $(seq 400); do grep -qE 'criu_gpu: (restoring|resum)|pages [0-9]+: read' "$img/restore.log" 2>/dev/null && break; sleep 0.01; done
	pkill -9 -x criu.real
	wait $cg 2>/dev/null
	sleep 2
	local left=0 p
	for p in $pids; do [ -d "/proc/$p" ] && left=$((left + 1)); done
	log "kill-restore: criu killed; $left of the job's pids left; guardian: $(tail -2 "$img/gpu-guardian.log" 2>/dev/null | tr '\n' ' ')"
	# shellcheck disable=SC2086
	wait_gone $pids || log "kill-restore: half-restored processes still there"
	timeout 300 criu-gpu restore "$img" -- --lib "$PLUG" >"$OUT/kill-restore.again.out" 2>&1
	rc=$?
	if [ $rc = 0 ] && finished "$DIR" 240 && same "$DIR" "$W/ref-spawn"; then
		pass "kill-restore: a restore killed half-way left no process behind; the same images restored again and the job finished equal to the uninterrupted run"
	else
		fail "kill-restore: restore again rc=$rc $(grep -E 'Error|problem' "$OUT/kill-restore.again.out" | head -3 | tr '\n' ' ')"
	fi
	kill_job "$JOBPID"
	rm -rf "$img"
}

part_rank-dies() {
	local cg rank1 rank0 st
	log "== a rank SIGKILLed while the dump locks the job"
	# shellcheck disable=SC2046
	start rank-dies spawn $(env_of spawn)
	wait_step "$DIR" 200 120 || { fail "rank-dies: no step 200"; kill_job "$JOBPID"; return; }
	rank0=$(grep -oE 'pid=[0-9]+' "$DIR/rank0.log" | head -1 | cut -d= -f2)
	rank1=$(grep -oE 'pid=[0-9]+' "$DIR/rank1.log" | head -1 | cut -d= -f2)
	criu-gpu dump "$JOBPID" "$W/img-rank-dies" -- --lib "$PLUG" >"$OUT/rank-dies.out" 2>&1 &
	cg=$!
	for _ in $(seq 400); do grep -q 'GPU: locked' "$OUT/rank-dies.out" && break; sleep 0.01; done
	kill -9 "$rank1"
	wait $cg
	log "rank-dies: criu-gpu dump rc=$? $(grep -E 'GPU:|failed|Error' "$OUT/rank-dies.out" | head -4 | tr '\n' ' ')"
	sleep 1
	# torch.multiprocessing ends the other ranks once one dies; what matters is that no CUDA
	# process is left locked or checkpointed by the dump, and the guardian said so.
	st=$(cuda-checkpoint-ctl --get-state --pid "$rank0" 2>&1)
	cuda-checkpoint-ctl --list >"$OUT/rank-dies.list" 2>&1
	log "rank-dies: rank 0 ($rank0): '$st'; CUDA processes now: $(tail -n +2 "$OUT/rank-dies.list" | tr -s ' ' | tr '\n' ';')"
	log "rank-dies: guardian: $(tail -4 "$W/img-rank-dies/gpu-guardian.log" 2>/dev/null | tr '\n' ' ')"
	if ! grep -qE ' (locked|checkpointed) ' "$OUT/rank-dies.list" && { [ "$st" = running ] || ! [ -d "/proc/$rank0" ]; }; then
		pass "rank-dies: the dump failed; nothing was left locked or checkpointed (rank 0: ${st:0:40})"
	else
		fail "rank-dies: a CUDA process was left locked or checkpointed"
	fi
	kill_job "$JOBPID"
	rm -rf "$W/img-rank-dies"
}

part_four() {
	local img=$W/img-four pids rc
	log "== four ranks, two per GPU"
	DIR=$W/four && rm -rf "$DIR" && mkdir -p "$DIR"
	env "${NCCL_SOCKETS[@]}" USE_LIBUV=0 setsid "$PYTHON" "$JOB" --spawn 4 --gpus 2 "$DIR" --steps 400 --sleep 0 --model "$MODEL" \
		--log-every 10 --ballast "$BALLAST" --port $((29600 + RANDOM % 300)) </dev/null >"$DIR/stdout" 2>&1 &
	JOBPID=$!
	if ! wait_step "$DIR" 100 90; then
		log "four: the job did not reach step 100: $(grep -iE 'error|duplicate|invalid' "$DIR/stdout" | head -3 | tr '\n' ' ')"
		kill_job "$JOBPID"
		return
	fi
	pids="$JOBPID $(tree_of "$JOBPID" | tr '\n' ' ')"
	timeout 300 criu-gpu dump "$JOBPID" "$img" -- --lib "$PLUG" >"$OUT/four.dump.out" 2>&1
	rc=$?
	log "four: dump rc=$rc; $(lock_line "$img")"
	[ $rc = 0 ] || { fail "four: dump: $(grep -E 'Error|problem' "$OUT/four.dump.out" | head -2 | tr '\n' ' ')"; kill_job "$JOBPID"; return; }
	wait "$JOBPID" 2>/dev/null
	# shellcheck disable=SC2086
	wait_gone $pids
	timeout 300 criu-gpu restore "$img" -- --lib "$PLUG" >"$OUT/four.restore.out" 2>&1
	rc=$?
	local t=0
	while [ $t -lt 900 ] && [ "$(grep -l '^done' "$DIR"/rank*.log 2>/dev/null | wc -l)" -lt 4 ]; do sleep 0.2; t=$((t + 1)); done
	if [ $rc = 0 ] && [ "$(grep -l '^done' "$DIR"/rank*.log | wc -l)" = 4 ] && ! grep -q BAD "$DIR"/rank*.log; then
		pass "four: four ranks on two GPUs dumped at step 100, restored, finished with every all_reduce right"
	else
		fail "four: restore rc=$rc"
	fi
	kill_job "$JOBPID"
	rm -rf "$img"
}

log "$(nvidia-smi -L 2>&1 | tr '\n' ' ')"
log "$("$PYTHON" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")' 2>&1)"
for p in $PARTS; do
	case $p in
	ref-*) part_ref "${p#ref-}" ;;
	chain-*) part_chain "${p#chain-}" ;;
	*) "part_$p" ;;
	esac
done
log "passed: $PASS failed: $FAIL"
