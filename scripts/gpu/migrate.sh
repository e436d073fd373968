#!/bin/bash
# Live migration without a disk (issue 29 item 1) on one machine with two GPUs: two nodes as
# network and UTS namespaces on a bridge of their own (netbed), node A (n0) owning GPU 0 and
# node B (n1) GPU 1. Each job runs on node A in a pid namespace of its own (the nodes share the
# machine's pids; a job on two real machines needs none).
#   move   a GIB GiB gpu-app (8 GiB) moved from GPU 0 on node A to GPU 1 on node B:
#          `criu-gpu restore DIR --listen PORT --device-map A=B` on B, `criu-gpu dump PID DIR
#          --to B:PORT` on A; then the same kind of process moved through a directory (criu-gpu
#          dump into A's directory, cp into B's, criu-gpu restore there); each verified bit for
#          bit after its move. Downtime: the process frozen on A (CRIU's "Dumping processes")
#          until running on B (its "Restore finished successfully"), both read the same way from
#          the CRIU logs and the wall clock at which criu-gpu started each CRIU. Prints the
#          ratio live / directory (goal <= 0.6), ROUNDS times each, alternating.
#   ddp    a two-rank DDP job (scripts/gpu/ddp-job.py --spawn 2, NCCL over each node's loopback)
#          on node A's GPUs 0 and 1, moved to node B onto GPUs 1 and 0; every logged loss,
#          all_reduce check, the parameters, the ballast and the store equal to an uninterrupted
#          run of the same job (ref, first).
# Each part is bounded and prints PASS or FAIL with what it saw; results go to $OUT as they come
# (CRIU's logs of the DDP job's move and of a failed move too: NAME.a.dump.log, NAME.b.restore.log,
# NAME.b.lazy.log; the DDP job's rank logs: ddp.ref.rankN.log, ddp.moved.rankN.log).
# On the GPU machine (needs .carry: PREFIX=<the project's CRIU> scripts/gpu/pack-carry.sh), one
# call of < 10 minutes:
#   OUT=$OUT scripts/gpu/migrate.sh
# --sim: on this machine: the simulated GPU (cuda-sim-app verifies its data every step) and CPU
# torch (gloo), target/debug's binaries, CRIU ($CRIU: the project's, patch 0014), PYTHON a Python
# with torch; small sizes. Its times mean nothing.
# Environment: GIB (8; sim 0.125), ROUNDS (2), STEPS (600; sim 60), BALLAST (GiB per rank: 0.25;
# sim 0), PYTHON (python3), CRIU (sim: /usr/local/sbin/criu).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
sim=0
[ "${1:-}" = --sim ] && { sim=1; shift; }
PARTS=${1:-"move ddp"}
OUT=${OUT:-/tmp/migrate}
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-2}
# A work directory of this run's own: a run beside it (another engineer's) neither removes it nor
# kills its processes (cleanup finds them by it).
W=$(mktemp -d /dev/shm/migrate.XXXXXX) && mkdir -p "$OUT" || exit 1
LOG_FILE=$OUT/migrate.log
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
if [ $sim = 1 ]; then
	GIB=${GIB:-0.125} STEPS=${STEPS:-60} BALLAST=${BALLAST:-0}
	BIN=$root/target/debug CRIU=${CRIU:-/usr/local/sbin/criu} DEVICE=cpu
else
	GIB=${GIB:-8} STEPS=${STEPS:-600} BALLAST=${BALLAST:-0.25}
	BIN=$root/.carry/bin CRIU=$BIN/criu DEVICE=cuda
fi
CRIU_GPU=$BIN/criu-gpu NETBED=$BIN/netbed CTL=$BIN/cuda-checkpoint-ctl
BED=$W/bed NET=10.$((100 + $$ % 100)).0 PORT=7000
ADDR=("$NET.1" "$NET.2")
export PYTHONUNBUFFERED=1
# NCCL and gloo over the loopback of the job's node.
sockets_over lo

fix="PREFIX=<the project's CRIU> scripts/gpu/pack-carry.sh; PYTHON: a Python with torch"
[ $sim = 1 ] && fix="cargo build --workspace; CRIU: the project's CRIU (scripts/install-criu.sh)"
for f in "$CRIU_GPU" "$NETBED" "$CTL" "$CRIU"; do
	[ -x "$f" ] || { echo "migrate.sh: $f is missing ($fix)" >&2; exit 1; }
done
"$CRIU" check --feature lazy_pages_complete >/dev/null 2>&1 ||
	{ echo "migrate.sh: $CRIU cannot stream a move's pages (not the project's CRIU with patch 0014?)" >&2; exit 1; }

PLUG=$W/plugins
mkdir -p "$PLUG"
daemon=
if [ $sim = 1 ]; then
	cp "$BIN/libcriu_gpu_plugin.so" "$PLUG/criu_gpu_plugin.so"
	mkdir -p "$W/sim"
	cp "$BIN/libcuda.so" "$W/sim/libcuda.so.1"
	cp "$BIN/libcuda.so" "$W/sim/libnvidia-ml.so.1"
	export CUDA_SIM_SOCKET=$W/sim/gpud.sock CUDA_CKPT_LIBCUDA=$W/sim/libcuda.so.1 CUDA_CKPT_LIBNVML=$W/sim/libnvidia-ml.so.1
	"$BIN/cuda-sim-gpud" --socket "$CUDA_SIM_SOCKET" --gpus 2 --memory 4GiB --uuid-seed migrate \
		</dev/null >/dev/null 2>"$W/sim/gpud.log" &
	daemon=$!
	for _ in $(seq 100); do [ -S "$CUDA_SIM_SOCKET" ] && break; sleep 0.1; done
	mapfile -t UUID < <("$CTL" --gpus --json | python3 -c 'import json, sys; [print(g["uuid"]) for g in json.load(sys.stdin)["gpus"]]')
	gpus="simulated GPU (2)"
else
	cp "$root/.carry/plugins/criu_gpu_plugin.so" "$PLUG/"
	nvcc -O2 -o "$W/gpu-app" "$here/gpu-app.cu" || { log "FAIL nvcc"; exit 1; }
	mapfile -t UUID < <(nvidia-smi --query-gpu=uuid --format=csv,noheader | tr -d ' ')
	gpus=$(nvidia-smi -L 2>&1 | tr '\n' ' ')
fi
[ "${#UUID[@]}" -ge 2 ] || { log "FAIL two GPUs needed, found: ${UUID[*]}"; exit 1; }
stamp "$PLUG/criu_gpu_plugin.so"
log "migrate.sh: $gpus"

cleanup() {
	local p
	for p in $(pgrep -f "$W/" 2>/dev/null); do [ "$p" = $$ ] || kill -9 "$p" 2>/dev/null; done
	[ -z "$daemon" ] || kill "$daemon" 2>/dev/null
	"$NETBED" down "$BED" 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT
"$NETBED" down "$BED" 2>/dev/null
"$NETBED" up "$BED" "n0=${ADDR[0]}/24" "n1=${ADDR[1]}/24" || { log "FAIL netbed up"; exit 1; }
# on NODE CMD...: CMD inside NODE (in the foreground; started with &, $! would be a subshell's:
# a job is started with "$NETBED" exec itself, which execs CMD)
on() { local n=$1; shift; "$NETBED" exec "$BED" "$n" -- "$@"; }
# stamped FILE: each line read, prefixed by the wall clock at which it came
stamped() { while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done >"$1"; }
# criu_at OUT LOG TEXT: the wall clock of the first line of CRIU's LOG containing TEXT: the time
# criu-gpu said "running:" (right before it started that CRIU) plus the line's own time stamp
criu_at() {
	local t0 off
	t0=$(grep -m1 ' running: ' "$1" | cut -d' ' -f1)
	off=$(grep -m1 -F "$3" "$2" | sed -nE 's/^\(([ 0-9.]+)\).*/\1/p' | tr -d ' ')
	[ -n "$t0" ] && [ -n "$off" ] && awk -v a="$t0" -v b="$off" 'BEGIN { printf "%.3f", a + b }'
}
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }

# The test process -------------------------------------------------------------------------
# start_proc NAME: the test process on node A's GPU 0, the first process of a pid namespace of
# its own; sets APP (its pid here) and STATUS (its log)
start_proc() {
	local holder t0
	# In $OUT: what the process said comes back with the results, also when it never started.
	STATUS=$OUT/$1.status
	t0=$(now)
	log "$1: starting the process ($GIB GiB on node A's GPU 0)"
	: >"$STATUS"
	if [ $sim = 1 ]; then
		"$NETBED" exec "$BED" n0 -- unshare --pid --fork setsid env LD_LIBRARY_PATH="$W/sim" "$BIN/cuda-sim-app" --device 0 \
			--mib "$(awk -v g="$GIB" 'BEGIN { print int(g * 1024) }')" --interval-ms 50 --log "$STATUS" \
			</dev/null >/dev/null 2>&1 &
		holder=$!
		wait_for "$STATUS" '^step=' 120 "$holder" || return 1
	else
		"$NETBED" exec "$BED" n0 -- env CUDA_VISIBLE_DEVICES=0 unshare --pid --fork setsid "$W/gpu-app" "$GIB" 7 "$STATUS" \
			</dev/null >"$STATUS.out" 2>&1 &
		holder=$!
		wait_for "$STATUS" '^ready' 300 "$holder" || return 1
	fi
	APP=$(pgrep -P "$holder")
	[ -n "$APP" ] && log "$1: pid $APP ready in $(since "$t0") s"
}
# verify PID: the process checks every word of its data (sim: three more verified steps)
verify() {
	local n
	if [ $sim = 1 ]; then
		n=$(grep -c ' ok$' "$STATUS")
		for _ in $(seq 600); do [ "$(grep -c ' ok$' "$STATUS")" -ge $((n + 3)) ] && break; sleep 0.1; done
		[ "$(grep -c ' ok$' "$STATUS")" -ge $((n + 3)) ] && ! grep -q MISMATCH "$STATUS"
	else
		n=$(grep -c '^verified' "$STATUS")
		kill -USR1 "$1" || return 1
		for _ in $(seq 1200); do [ "$(grep -c '^verified' "$STATUS")" -gt "$n" ] && break; sleep 0.1; done
		grep '^verified' "$STATUS" | tail -1 | grep -q 'mismatches=0 '
	fi
}
# on_gpu1 PID: the process holds memory on GPU 1 and none on GPU 0
on_gpu1() {
	if [ $sim = 1 ]; then
		"$CTL" --gpus --json | python3 -c 'import json, sys; g = json.load(sys.stdin)["gpus"]; sys.exit(0 if g[0]["memory_used"] == 0 and g[1]["memory_used"] > 0 else 1)'
	else
		nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | tr -d ' ' | grep -qx "$1,${UUID[1]}"
	fi
}
landed_ok() { verify "$1" && on_gpu1 "$1"; }
# listening: node B's criu-gpu listens on PORT (its /proc/net/tcp; a probe would be taken for
# the sender)
listening() { on n1 cat /proc/net/tcp | awk -v p="$(printf ':%04X' $PORT)" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }'; }
wait_listening() { for _ in $(seq 200); do listening && return 0; sleep 0.1; done; return 1; }
# log_of OUT NAME: CRIU's log NAME for the CRIU criu-gpu ran (its work directory, else its -D)
log_of() {
	local cmd
	cmd=$(grep -m1 ' running: ' "$1")
	if [[ $cmd =~ \ (-W|--work-dir)\ ([^ ]+) ]]; then
		echo "${BASH_REMATCH[2]}/$2"
	elif [[ $cmd =~ \ -D\ ([^ ]+) ]]; then
		echo "${BASH_REMATCH[1]}/$2"
	fi
}
# keep_logs NAME: the move's CRIU logs into $OUT (the work directories go at exit)
keep_logs() {
	local side f
	for side in a b; do
		for f in dump.log restore.log lazy.log; do
			[ -f "$(log_of "$OUT/$1.$side" "$f")" ] && cp "$(log_of "$OUT/$1.$side" "$f")" "$OUT/$1.$side.$f"
		done
	done
	return 0
}
DOWN_LIVE=() DOWN_DIR=()

# One move of each kind ------------------------------------------------------------------
live() {
	local n=live$1 bpid rc new frozen running
	start_proc "$n" || { fail "$n: the process did not start: $(tail -2 "$STATUS"*)"; return 1; }
	verify "$APP" || fail "$n: data before the move"
	on n1 "$CRIU_GPU" restore --listen "$PORT" --device-map "${UUID[0]}=${UUID[1]}" "$W/into-$n" \
		--criu "$CRIU" -- --lib "$PLUG" 2>&1 | stamped "$OUT/$n.b" &
	bpid=$!
	wait_listening || { fail "$n: node B does not listen: $(cut -d' ' -f2- "$OUT/$n.b")"; return 1; }
	on n0 "$CRIU_GPU" dump --to "${ADDR[1]}:$PORT" "$APP" "$W/from-$n" --criu "$CRIU" -- --lib "$PLUG" 2>&1 |
		stamped "$OUT/$n.a"
	rc=${PIPESTATUS[0]}
	wait "$bpid" || rc=1
	new=$(grep -oE 'its root is pid [0-9]+' "$OUT/$n.a" | grep -oE '[0-9]+$')
	if [ "$rc" != 0 ] || [ -z "$new" ]; then
		fail "$n: the move failed: $(grep -hE 'criu-gpu:|Error' "$OUT/$n.a" "$OUT/$n.b" | head -4 | cut -d' ' -f2- | tr '\n' ' ')"
		keep_logs "$n"
		return 1
	fi
	frozen=$(criu_at "$OUT/$n.a" "$(log_of "$OUT/$n.a" dump.log)" "Dumping processes")
	running=$(criu_at "$OUT/$n.b" "$(log_of "$OUT/$n.b" restore.log)" "Restore finished successfully")
	DOWN_LIVE+=("$(sub "$running" "$frozen")")
	grep -E '^\S+ +\+|lazy-pages:' "$OUT/$n.a" | cut -d' ' -f2- | tee -a "$LOG_FILE"
	check "$n: moved to GPU 1 of node B (pid $new), its data verified, downtime ${DOWN_LIVE[-1]} s" \
		landed_ok "$new"
	kill -9 "$new" 2>/dev/null
}
through_dir() {
	local n=dir$1 rc t0 copy new frozen running
	start_proc "$n" || { fail "$n: the process did not start: $(tail -2 "$STATUS"*)"; return 1; }
	verify "$APP" || fail "$n: data before the move"
	on n0 "$CRIU_GPU" dump "$APP" "$W/from-$n" --criu "$CRIU" -- --lib "$PLUG" 2>&1 | stamped "$OUT/$n.a"
	rc=${PIPESTATUS[0]}
	t0=$(date +%s.%N)
	cp -a "$W/from-$n" "$W/into-$n"
	copy=$(since "$t0")
	on n1 "$CRIU_GPU" restore --device-map "${UUID[0]}=${UUID[1]}" "$W/into-$n" --criu "$CRIU" -- --lib "$PLUG" \
		2>&1 | stamped "$OUT/$n.b"
	[ "${PIPESTATUS[0]}" = 0 ] || rc=1
	new=$(cat "$(dirname "$(log_of "$OUT/$n.b" restore.log)")/restore.pid" 2>/dev/null || cat "$W/into-$n/restore.pid")
	if [ "$rc" != 0 ] || [ -z "$new" ]; then
		fail "$n: the move failed: $(grep -hE 'criu-gpu:|Error' "$OUT/$n.a" "$OUT/$n.b" | head -4 | cut -d' ' -f2- | tr '\n' ' ')"
		keep_logs "$n"
		return 1
	fi
	frozen=$(criu_at "$OUT/$n.a" "$(log_of "$OUT/$n.a" dump.log)" "Dumping processes")
	running=$(criu_at "$OUT/$n.b" "$(log_of "$OUT/$n.b" restore.log)" "Restore finished successfully")
	DOWN_DIR+=("$(sub "$running" "$frozen")")
	log "$n: dump, copy ($copy s, $(du -sh "$W/into-$n" | cut -f1)), restore"
	check "$n: moved to GPU 1 of node B through a directory (pid $new), its data verified, downtime ${DOWN_DIR[-1]} s" \
		landed_ok "$new"
	kill -9 "$new" 2>/dev/null
	rm -rf "$W/from-$n" "$W/into-$n"
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

part_move() {
	local i live dir ratio
	log "== an $GIB GiB process moved from GPU 0 on node A to GPU 1 on node B: over the network ($ROUNDS x) and through a directory ($ROUNDS x)"
	for i in $(seq "$ROUNDS"); do
		if [ $((i % 2)) = 1 ]; then live "$i"; through_dir "$i"; else through_dir "$i"; live "$i"; fi
	done
	if [ "${#DOWN_LIVE[@]}" = 0 ] || [ "${#DOWN_DIR[@]}" = 0 ]; then
		fail "move: no downtime to compare"
		return 1
	fi
	live=$(median "${DOWN_LIVE[@]}") dir=$(median "${DOWN_DIR[@]}")
	ratio=$(awk -v a="$live" -v b="$dir" 'BEGIN { printf "%.2f", a / b }')
	log "downtime (s): live ${DOWN_LIVE[*]} (median $live); through a directory ${DOWN_DIR[*]} (median $dir)"
	printf 'gib %s\nlive %s\ndir %s\nratio %s\n' "$GIB" "$live" "$dir" "$ratio" >"$OUT/downtime.txt"
	if [ $sim = 1 ]; then
		log "downtime ratio live / directory: x$ratio (simulated GPU: not the goal's measure)"
	else
		check "downtime ratio live / directory: x$ratio (goal <= 0.6)" awk -v r="$ratio" 'BEGIN { exit !(r <= 0.6) }'
	fi
}

# The DDP job ------------------------------------------------------------------------------
# start_job NAME NODE: the job on NODE in a pid namespace of its own; sets DIR and HOLDER
start_job() {
	DIR=$W/$1
	rm -rf "$DIR" && mkdir -p "$DIR"
	"$NETBED" exec "$BED" "$2" -- env CUDA_VISIBLE_DEVICES=0,1 unshare --pid --fork setsid "$PYTHON" "$here/ddp-job.py" "$DIR" --spawn 2 \
		--gpus 2 --steps "$STEPS" --sleep 0.02 --log-every 10 --ballast "$BALLAST" --device "$DEVICE" \
		</dev/null >"$DIR/stdout" 2>&1 &
	HOLDER=$!
}
last_step() {
	local a b
	a=$(grep -oE '^step [0-9]+' "$1/rank0.log" 2>/dev/null | tail -1 | cut -d' ' -f2)
	b=$(grep -oE '^step [0-9]+' "$1/rank1.log" 2>/dev/null | tail -1 | cut -d' ' -f2)
	a=${a:--1} b=${b:--1}
	echo $((a < b ? a : b))
}
wait_step() { local t=0; while [ "$(last_step "$1")" -lt "$2" ]; do t=$((t + 1)); [ $t -ge $(($3 * 10)) ] && return 1; sleep 0.1; done; }
finished() { local t=0; until grep -q '^store' "$1/rank0.log" 2>/dev/null && grep -q '^store' "$1/rank1.log" 2>/dev/null; do t=$((t + 1)); [ $t -ge $(($2 * 10)) ] && return 1; sleep 0.1; done; }
same() {
	local r
	for r in 0 1; do
		diff <(grep -E '^(step|params|ballast|store)' "$W/ref/rank$r.log") <(grep -E '^(step|params|ballast|store)' "$1/rank$r.log") \
			>"$OUT/ddp.diff.$r" || return 1
	done
	! grep -q BAD "$1"/rank*.log
}

part_ddp() {
	local root bpid rc t0
	log "== a two-rank DDP job ($STEPS steps) moved from node A (GPUs 0, 1) to node B (GPUs 1, 0)"
	t0=$(date +%s.%N)
	start_job ref n0
	finished "$DIR" 400 || { fail "ddp: the reference did not finish: $(tail -2 "$DIR/stdout" | tr '\n' ' ')"; kill_job "$HOLDER"; return 1; }
	log "ddp: reference: $STEPS steps in $(since "$t0") s ($(grep '^params' "$DIR/rank0.log"))"
	wait "$HOLDER" 2>/dev/null
	start_job moved n0
	wait_step "$DIR" $((STEPS / 5)) 300 || { fail "ddp: the job did not get going: $(tail -2 "$DIR/stdout" | tr '\n' ' ')"; kill_job "$HOLDER"; return 1; }
	root=$(pgrep -P "$HOLDER")
	on n1 "$CRIU_GPU" restore --listen "$PORT" --device-map "${UUID[0]}=${UUID[1]},${UUID[1]}=${UUID[0]}" "$W/into-ddp" \
		--criu "$CRIU" -- --lib "$PLUG" 2>&1 | stamped "$OUT/ddp.b" &
	bpid=$!
	wait_listening || { fail "ddp: node B does not listen"; kill_job "$HOLDER"; return 1; }
	log "ddp: moving at step $(last_step "$DIR")"
	on n0 "$CRIU_GPU" dump --to "${ADDR[1]}:$PORT" "$root" "$W/from-ddp" --criu "$CRIU" -- --lib "$PLUG" 2>&1 |
		stamped "$OUT/ddp.a"
	rc=${PIPESTATUS[0]}
	wait "$bpid" || rc=1
	if [ "$rc" != 0 ]; then
		fail "ddp: the move failed: $(grep -hE 'criu-gpu:|Error' "$OUT/ddp.a" "$OUT/ddp.b" | head -4 | cut -d' ' -f2- | tr '\n' ' ')"
		keep_logs ddp
		kill_job "$HOLDER"
		return 1
	fi
	grep -E 'downtime' "$OUT/ddp.a" | cut -d' ' -f2- | tee -a "$LOG_FILE"
	keep_logs ddp
	if finished "$DIR" 400; then
		check "ddp: moved to node B and equal to the uninterrupted run (losses, all_reduce checks, parameters, ballast, store)" same "$DIR"
	else
		fail "ddp: the moved job did not finish: $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
	fi
	for r in 0 1; do cp "$W/ref/rank$r.log" "$OUT/ddp.ref.rank$r.log" && cp "$DIR/rank$r.log" "$OUT/ddp.moved.rank$r.log"; done
}

for part in $PARTS; do
	"part_$part" || true
done
log "----"
log "passed: $PASS  failed: $FAIL"
[ "$FAIL" -eq 0 ]
