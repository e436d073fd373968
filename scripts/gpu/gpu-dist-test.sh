#!/bin/bash
# Distributed GPU jobs through CRIU on a machine with two GPUs: a two-rank PyTorch DDP job
# (scripts/gpu/ddp-job.py, deterministic) started by torch.multiprocessing and by torchrun, dumped
# mid-run with `criu-gpu dump` and restored with `criu-gpu restore` (also onto swapped GPUs); its
# per-step losses, all_reduce checks, final parameters and GPU ballast are compared line for line
# with an uninterrupted run of the same job. Then what is refused before anything is locked
# (NCCL's own transports, an io_uring), what the driver does with two more transport settings,
# and CRIU killed in the middle of a dump. Each part is bounded and prints what it saw.
#
#   OUT=/tmp/out [RANKS=2] scripts/gpu/gpu-dist-test.sh [PARTS]
#   PARTS default: "spawn torchrun swap refuse facts kill"; RANKS=1 runs spawn, torchrun, refuse
#   and kill on a machine with one GPU (NCCL takes one rank per GPU).
# torchrun's agent (PyTorch 2.11) makes its TCPStore servers on libuv, which holds an io_uring
# that CRIU cannot dump, whatever the launch settings (docs/driver-facts.md, D3): the torchrun
# part starts the job with io_uring off on the node (kernel.io_uring_disabled=2, libuv then
# uses epoll) and puts the setting back.
# Needs .carry (scripts/gpu/pack-carry.sh) in the working tree.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/gpu-dist-test}
PARTS=${1:-"spawn torchrun swap refuse facts kill"}
W=/dev/shm/gpu-dist
RES=/tmp/gpu-dist-results
export PATH="$root/.carry/bin:$PATH"
PLUG=$root/.carry/plugins
JOB=$here/ddp-job.py
STEPS=300
RANKS=${RANKS:-2}
RANK_IDS=$(seq 0 $((RANKS - 1)))
export PYTHONUNBUFFERED=1
rm -rf "$W" "$RES" && mkdir -p "$OUT" "$W" "$RES"
LOG_FILE=$OUT/dist-test.log
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
stamp "$PLUG/criu_gpu_plugin.so"

# wait_step DIR N SECONDS: both ranks logged step N (or done)
wait_step() {
	local dir=$1 n=$2 limit=$3 t=0 ok r
	while :; do
		ok=0
		for r in $RANK_IDS; do grep -qE "^(step $n |done)" "$dir/rank$r.log" 2>/dev/null && ok=$((ok + 1)); done
		[ $ok = "$RANKS" ] && return 0
		t=$((t + 1)); [ $t -ge $((limit * 5)) ] && return 1
		sleep 0.2
	done
}
finished() {
	local r
	wait_step "$1" $((STEPS - 1)) "$2" && sleep 2 || return 1
	for r in $RANK_IDS; do grep -q '^done' "$1/rank$r.log" || return 1; done
}
# healthy DIR: the job goes on to its end with every check right (a job just put back may need
# a while for NCCL's connections to resume)
healthy() { finished "$1" 90 && ! grep -qE 'BAD|Error|error' "$1"/rank*.log; }
# same DIR REF: every step, loss, all_reduce check, the parameters and the ballast check equal
same() {
	local r
	for r in $RANK_IDS; do
		diff <(grep -E '^(step|params|ballast)' "$2/rank$r.log") \
			<(grep -E '^(step|params|ballast)' "$1/rank$r.log") >"$RES/diff.$(basename "$1").$r" || return 1
	done
}

# start NAME MODE ENV...: starts the job (MODE spawn or torchrun); sets JOBPID, DIR
start() {
	local name=$1 mode=$2
	shift 2
	DIR=$W/$name
	rm -rf "$DIR" && mkdir -p "$DIR"
	if [ "$mode" = spawn ]; then
		env "$@" setsid python3 "$JOB" --spawn "$RANKS" "$DIR" --steps $STEPS --sleep 0.02 --ballast 1 \
			--port $((29600 + RANDOM % 300)) </dev/null >"$DIR/stdout" 2>&1 &
	else
		env "$@" setsid torchrun --standalone --nproc-per-node "$RANKS" "$JOB" "$DIR" \
			--steps $STEPS --sleep 0.02 --ballast 1 </dev/null >"$DIR/stdout" 2>&1 &
	fi
	JOBPID=$!
}

# reference NAME MODE ENV...: an uninterrupted run, kept as W/NAME
reference() {
	start "$@"
	if finished "$DIR" 180; then log "reference $1: $(grep -c '^step' "$DIR/rank0.log") steps"; else fail "reference $1 did not finish: $(tail -3 "$DIR/stdout" | tr '\n' ' ')"; fi
	kill_job "$JOBPID"
}

# checkpoint NAME REF MODE [--device-map MAP] ENV...: dump at step 60, restore, compare with REF
checkpoint() {
	local name=$1 ref=$2 mode=$3 map=() t0 pids img
	shift 3
	if [ "${1:-}" = --device-map ]; then map=(--device-map "$2"); shift 2; fi
	start "$name" "$mode" "$@"
	wait_step "$DIR" 60 180 || { fail "$name: no step 60: $(tail -3 "$DIR/stdout" | tr '\n' ' ')"; kill_job "$JOBPID"; return; }
	pids="$JOBPID $(tree_of "$JOBPID" | tr '\n' ' ')"
	img=$W/img-$name
	t0=$(date +%s.%N)
	timeout 300 criu-gpu dump "$JOBPID" "$img" -- --lib "$PLUG" >"$RES/$name.dump.out" 2>&1
	local rc=$?
	log "$name: criu-gpu dump rc=$rc in $(since "$t0") s"
	sed 's/^/  /' "$RES/$name.dump.out" >>"$OUT/dist-test.log"
	if [ $rc != 0 ]; then fail "$name: dump"; kill_job "$JOBPID"; cp "$img/dump.log" "$RES/$name.dump.log" 2>/dev/null; return; fi
	wait "$JOBPID" 2>/dev/null
	# shellcheck disable=SC2086 # a list of pids
	wait_gone $pids || log "$name: the dumped processes are still there"
	t0=$(date +%s.%N)
	timeout 300 criu-gpu restore "$img" "${map[@]}" -- --lib "$PLUG" >"$RES/$name.restore.out" 2>&1
	rc=$?
	log "$name: criu-gpu restore ${map[*]} rc=$rc in $(since "$t0") s"
	sed 's/^/  /' "$RES/$name.restore.out" >>"$OUT/dist-test.log"
	if [ $rc != 0 ]; then
		fail "$name: restore"
		gzip -c "$img/restore.log" >"$RES/$name.restore.log.gz" 2>/dev/null
		gzip -c "$img/dump.log" >"$RES/$name.dump.log.gz" 2>/dev/null
		# shellcheck disable=SC2086
		kill -9 $pids 2>/dev/null
		return
	fi
	if [ ${#map[@]} -gt 0 ]; then
		nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader | sed "s/^/  $name apps: /" | tee -a "$OUT/dist-test.log"
	fi
	if finished "$DIR" 180; then
		if ! grep -q BAD "$DIR"/rank*.log && same "$DIR" "$W/$ref"; then
			pass "$name: dumped at step 60, restored, finished: every loss, all_reduce, the parameters and the GPU ballast equal the uninterrupted run ($(grep '^params' "$DIR/rank0.log"))"
		else
			fail "$name: differs from the uninterrupted run ($(head -3 "$RES"/diff."$name".* | tr '\n' ' '))"
		fi
	else
		fail "$name: did not finish after restore: $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
	fi
	# shellcheck disable=SC2086
	kill -9 $pids 2>/dev/null
	rm -rf "$img"
}

part_spawn() {
	log "== torch.multiprocessing: reference, then dumped and restored"
	reference ref-spawn spawn "${NCCL_SOCKETS[@]}" USE_LIBUV=0
	checkpoint spawn ref-spawn spawn "${NCCL_SOCKETS[@]}" USE_LIBUV=0
}

part_torchrun() {
	log "== torchrun (agent and $RANKS workers): reference, then dumped and restored"
	local was
	was=$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null) || { fail "torchrun: no kernel.io_uring_disabled here"; return; }
	echo 2 >/proc/sys/kernel/io_uring_disabled
	reference ref-torchrun torchrun "${NCCL_SOCKETS[@]}" USE_LIBUV=0
	checkpoint torchrun ref-torchrun torchrun "${NCCL_SOCKETS[@]}" USE_LIBUV=0
	echo "$was" >/proc/sys/kernel/io_uring_disabled
}

part_swap() {
	local u0 u1
	u0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | sed -n 1p)
	u1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | sed -n 2p)
	log "== restored onto the two GPUs swapped ($u0 <-> $u1)"
	[ -d "$W/ref-spawn" ] || reference ref-spawn spawn "${NCCL_SOCKETS[@]}" USE_LIBUV=0
	checkpoint swap ref-spawn spawn --device-map "$u0=$u1,$u1=$u0" "${NCCL_SOCKETS[@]}" USE_LIBUV=0
}

# refused NAME ENV...: criu-gpu dump and plain criu dump are refused before any lock; the job runs on
refused() {
	local name=$1 rc
	shift
	start "$name" spawn "$@"
	wait_step "$DIR" 40 180 || { fail "$name: no step 40"; kill_job "$JOBPID"; return; }
	timeout 120 criu-gpu dump "$JOBPID" "$W/img-$name" -- --lib "$PLUG" >"$RES/$name.out" 2>&1
	rc=$?
	log "$name: criu-gpu dump rc=$rc"
	grep -E '^(problem|  fix)' "$RES/$name.out" | sed 's/^/  /' | tee -a "$OUT/dist-test.log"
	mkdir -p "$W/plain-$name"
	timeout 120 criu dump -t "$JOBPID" -D "$W/plain-$name" --lib "$PLUG" --tcp-established --network-lock nftables \
		--ghost-limit 256M -v3 -o dump.log >/dev/null 2>&1
	local prc=$?
	grep -E 'criu_gpu: (locked|Error)' "$W/plain-$name/dump.log" | head -3 | sed "s/^/  plain criu: /" | tee -a "$OUT/dist-test.log"
	if [ $rc = 1 ] && [ $prc != 0 ] && ! grep -q 'criu_gpu: locked' "$W/plain-$name/dump.log" && healthy "$DIR"; then
		pass "$name: refused by criu-gpu and by the plugin under plain criu, nothing locked, the job finished with every all_reduce right"
	else
		fail "$name: rc=$rc plain=$prc; $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
	fi
	kill_job "$JOBPID"
}

part_refuse() {
	log "== refused before anything is locked"
	# One rank talks to no other: NCCL's defaults are no reason to refuse it.
	[ "$RANKS" -ge 2 ] && refused refuse-nccl-defaults USE_LIBUV=0
	refused refuse-io-uring "${NCCL_SOCKETS[@]}"
}

# driver NAME ENV...: what r580 does with a transport: suspend and resume both ranks (no CRIU)
driver() {
	local name=$1 rc
	shift
	start "$name" spawn "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM,NET
	wait_step "$DIR" 20 180 || { log "$name: no step 20"; kill_job "$JOBPID"; return; }
	log "$name: transports: $(grep -oE 'via (P2P/[A-Za-z/]+|SHM/[A-Za-z/]+|NET/[A-Za-z0-9/]+)' "$DIR/stdout" | sort | uniq -c | tr '\n' ';')"
	timeout 90 cuda-checkpoint-ctl --suspend --tree "$JOBPID" --wait 60 --no-nccl-check >"$RES/$name.suspend" 2>&1
	log "$name: suspend rc=$? $(tail -3 "$RES/$name.suspend" | tr '\n' ' ')"
	timeout 90 cuda-checkpoint-ctl --resume --tree "$JOBPID" --wait 60 >"$RES/$name.resume" 2>&1
	rc=$?
	log "$name: resume rc=$rc $(tail -3 "$RES/$name.resume" | tr '\n' ' ')"
	if [ $rc = 0 ] && healthy "$DIR"; then log "$name: the job finished with every all_reduce right"; else log "$name: the job did not come back"; fi
	kill_job "$JOBPID"
}

part_facts() {
	log "== what r580 does with two more transport settings (driver only)"
	driver facts-sockets-cumem USE_LIBUV=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
	driver facts-shm-nocumem USE_LIBUV=0 NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0
}

part_kill() {
	log "== CRIU SIGKILLed in the middle of the dump"
	start kill spawn "${NCCL_SOCKETS[@]}" USE_LIBUV=0
	wait_step "$DIR" 60 180 || { fail "kill: no step 60"; kill_job "$JOBPID"; return; }
	criu-gpu dump "$JOBPID" "$W/img-kill" -- --lib "$PLUG" >"$RES/kill.out" 2>&1 &
	local cg=$!
	for _ in $(seq 200); do grep -q 'GPU: locked' "$RES/kill.out" && break; sleep 0.05; done
	pkill -9 -x criu.real
	wait $cg 2>/dev/null
	log "kill: $(grep -E 'GPU:|failed' "$RES/kill.out" | tr '\n' ' ')"
	if healthy "$DIR"; then pass "kill: criu killed after the locks; both ranks were put back and finished with every all_reduce right"; else fail "kill: $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"; fi
	cat "$W/img-kill/gpu-guardian.log" >>"$RES/kill.out" 2>/dev/null
	kill_job "$JOBPID"
}

log "$(nvidia-smi -L | tr '\n' ' ')"
log "$(python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' 2>&1)"
for p in $PARTS; do
	"part_$p"
	tar czf "$OUT/results.tgz" -C "$RES" .
done
log "passed: $PASS failed: $FAIL"
