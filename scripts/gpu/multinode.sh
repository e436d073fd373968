#!/bin/bash
# A job across machines on one machine with two GPUs (issue 28): two nodes as network and UTS
# namespaces on a bridge of their own (netbed), node A (n0) owning GPU 0 and node B (n1) GPU 1, a
# real etcd on a third, and a two-node torchrun DDP job training flat out (scripts/gpu/ddp-job.py,
# one `torchrun --nnodes 2 --rdzv-backend c10d` launch per node, NCCL over sockets between the
# nodes), checkpointed with `criu-gpu dump|restore --nnodes 2 --rdzv etcd://...` inside each node.
#   ref        the uninterrupted run: the reference
#   chain      CYCLES coordinated dumps of one run, each restored; a table (step, dump and
#              restore seconds, lock rounds); every logged loss, all_reduce check, the parameters
#              and the ballast equal to the reference. Within the same run, before the first
#              dump, the preflight's refusals (each refused before anything is frozen): etcd
#              unreachable, another --nnodes, a second dump of the job while one runs; at cycle
#              2's restore, parts refused by name (of another job; node B's of the dump before);
#              at cycle 3, node B's restore started LATE seconds after node A's
#   newaddr    node A's part restored on a spare node at another address (m0), node B's in
#              place: every connection of the job moves with node A (the address map the nodes
#              derive); equal to ref
#   kill-criu  node B's CRIU SIGKILLed once both nodes locked: both dumps fail, the job goes on,
#              equal to ref
#   etcd-stop  etcd stopped at the same point: the same (etcd is started again after)
#   rank-dies  node B's rank SIGKILLed at the same point: both dumps fail, no CUDA process is
#              left locked or checkpointed, node A's rank is running or gone
#   gap        a dump restored GAP seconds later (more than torchrun's 15 s): the restore sets the
#              rendezvous heartbeats fresh before any agent runs, the agents keep them fresh after
#              (read from the store three times), both nodes stay participants; equal to ref
#   mpi        an Open MPI job (tests/mpi/cuda-mpi-app.c: its data on each node's GPU, summed
#              with MPI_Allreduce host-staged over TCP), mpirun on A starting orted on B through
#              netbed's rsh, dumped and restored on both nodes (the GPU machine has no Open MPI:
#              .carry/mpi, Debian's, is used where it is there)
#   one-node   the same job, two ranks on node A (torchrun --standalone) and CYCLES_ONE dumps:
#              the lock rounds, dump and restore times to set the two-node ones against
# Each part is bounded and prints PASS, FAIL or SKIP with what it saw; results go to $OUT as they
# come; at the end a table of the parts (result, seconds) and the times of two nodes against one.
# A part that would not end within BUDGET seconds of the start is skipped, named in the table
# (by default the parts run ref chain one-node newaddr kill-criu etcd-stop rank-dies mpi gap;
# run the skipped ones in a second call with ref: OUT=$OUT scripts/gpu/multinode.sh "ref gap").
# On the GPU machine (2 GPUs; needs .carry: scripts/gpu/pack-carry.sh), one call of < 10 minutes:
#   OUT=$OUT scripts/gpu/multinode.sh
# --sim: on this machine: CPU torch (gloo) on the simulated GPU, target/debug's binaries, the
# installed CRIU and etcd, PYTHON a Python with torch (STEPS, CYCLES smaller by default);
# MPI=carried: the MPI job with .carry/mpi's Open MPI (run it under a mount namespace that
# hides the system's to prove the carry).
# Environment: CYCLES (20; sim 3), CYCLES_ONE (5; sim 2), STEPS (CYCLES x 55 + 300), GAP (20), LATE
# (8), BALLAST (GiB per rank: 0.25; sim 0), BUDGET (seconds: 570; sim 3000), PYTHON (python3).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
sim=0
[ "${1:-}" = --sim ] && { sim=1; shift; }
PARTS=${1:-"ref chain one-node newaddr kill-criu etcd-stop rank-dies mpi gap"}
OUT=${OUT:-/tmp/multinode}
PYTHON=${PYTHON:-python3}
GAP=${GAP:-20} LATE=${LATE:-8}
W=/dev/shm/multinode
mkdir -p "$OUT" "$W"
LOG_FILE=$OUT/multinode.log
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
if [ $sim = 1 ]; then
	CYCLES=${CYCLES:-3} CYCLES_ONE=${CYCLES_ONE:-2} STEPS=${STEPS:-400} BALLAST=${BALLAST:-0} BUDGET=${BUDGET:-3000}
	BIN=$root/target/debug
	CRIU=${CRIU:-/usr/local/sbin/criu} ETCD=${ETCD:-/usr/bin/etcd}
	DEVICE=cpu MODEL=mlp
else
	CYCLES=${CYCLES:-20} CYCLES_ONE=${CYCLES_ONE:-5} BALLAST=${BALLAST:-0.25} BUDGET=${BUDGET:-570}
	BIN=$root/.carry/bin
	CRIU=$BIN/criu ETCD=$BIN/etcd
	DEVICE=cuda MODEL=wide
fi
# The chain's dumps come every 20-39 steps after the preflight's refusals (about 150 steps on
# two H100s): 20 cycles reached step 959 of 1000 and the 20th found no step left. STEPS covers
# CYCLES with room to spare.
STEPS=${STEPS:-$((CYCLES * 55 + 300))}
CRIU_GPU=$BIN/criu-gpu NETBED=$BIN/netbed CTL=$BIN/cuda-checkpoint-ctl
TORCHRUN=$(dirname "$(command -v "$PYTHON")")/torchrun
JOB=$here/ddp-job.py
BED=$W/bed
NET=10.$((100 + $$ % 100)).0
ADDR=("$NET.1" "$NET.2") ETCD_ADDR=$NET.254 PORT=29500 SPARE=$NET.11
# Where each node's criu-gpu runs (newaddr restores node A's part on the spare node m0).
NODES=(n0 n1)
export PYTHONUNBUFFERED=1
# NCCL and gloo over the nodes' eth0, sockets only.
sockets_over eth0

fix="scripts/gpu/pack-carry.sh; PYTHON: a Python with torch"
[ $sim = 1 ] && fix="cargo build --workspace; PYTHON: a Python with torch (CPU is enough)"
for f in "$CRIU_GPU" "$NETBED" "$CTL" "$CRIU" "$ETCD" "$TORCHRUN"; do
	[ -x "$f" ] || { echo "multinode.sh: $f is missing ($fix)" >&2; exit 1; }
done

# The plugin, and on --sim the simulated GPU (two GPUs, one per node).
PLUG=$W/plugins
rm -rf "$PLUG" && mkdir -p "$PLUG"
daemon=
if [ $sim = 1 ]; then
	cp "$BIN/libcriu_gpu_plugin.so" "$PLUG/criu_gpu_plugin.so"
	mkdir -p "$W/sim"
	cp "$BIN/libcuda.so" "$W/sim/libcuda.so.1"
	cp "$BIN/libcuda.so" "$W/sim/libnvidia-ml.so.1"
	export CUDA_SIM_SOCKET=$W/sim/gpud.sock CUDA_CKPT_LIBCUDA=$W/sim/libcuda.so.1 CUDA_CKPT_LIBNVML=$W/sim/libnvidia-ml.so.1
	rm -f "$CUDA_SIM_SOCKET"
	"$BIN/cuda-sim-gpud" --socket "$CUDA_SIM_SOCKET" --gpus 2 --memory 4GiB --uuid-seed multinode \
		</dev/null >/dev/null 2>"$W/sim/gpud.log" &
	daemon=$!
else
	cp "$root/.carry/plugins/criu_gpu_plugin.so" "$PLUG/"
fi
gpus="simulated GPU (2), CPU torch" && [ $sim = 0 ] && gpus=$(nvidia-smi -L 2>&1 | tr '\n' ' ')
stamp "$PLUG/criu_gpu_plugin.so"
log "multinode.sh: $gpus"
log "$("$PYTHON" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")' 2>&1 | tail -1)"

etcd_pid=
cleanup() {
	local p
	for p in $(pgrep -f "$W/(ref|chain|gap|kill|etcd|rank|one|newaddr|mpi)" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
	[ -z "$etcd_pid" ] || kill "$etcd_pid" 2>/dev/null
	[ -z "$daemon" ] || kill "$daemon" 2>/dev/null
	"$NETBED" down "$BED" 2>/dev/null
	rm -rf "$W"/img-*
}
trap cleanup EXIT
"$NETBED" down "$BED" 2>/dev/null
"$NETBED" up "$BED" "n0=${ADDR[0]}/24" "n1=${ADDR[1]}/24" "m0=$SPARE/24" "etcd=$ETCD_ADDR/24" || { log "FAIL netbed up"; exit 1; }
# on NODE CMD...: CMD inside NODE (netbed execs it: started with &, $! is CMD's pid)
on() { local n=$1; shift; "$NETBED" exec "$BED" "$n" -- "$@"; }
start_etcd() {
	"$NETBED" exec "$BED" etcd -- "$ETCD" --data-dir "$W/etcd-data" --listen-client-urls "http://$ETCD_ADDR:2379" \
		--advertise-client-urls "http://$ETCD_ADDR:2379" --listen-peer-urls "http://$ETCD_ADDR:2380" \
		</dev/null >>"$OUT/etcd.log" 2>&1 &
	etcd_pid=$!
	for _ in $(seq 100); do on n0 bash -c "echo > /dev/tcp/$ETCD_ADDR/2379" 2>/dev/null && return 0; sleep 0.2; done
	log "FAIL etcd did not come up"; return 1
}
start_etcd || exit 1
RDZV=etcd://$ETCD_ADDR:2379

# last_step DIR: the last step both ranks logged (-1: none); wait_step DIR N SECONDS;
# finished DIR SECONDS: both ranks wrote "done" (as flat-out.sh)
last_step() {
	local a b
	a=$(grep -oE '^step [0-9]+' "$1/rank0.log" 2>/dev/null | tail -1 | cut -d' ' -f2)
	b=$(grep -oE '^step [0-9]+' "$1/rank1.log" 2>/dev/null | tail -1 | cut -d' ' -f2)
	a=${a:--1} b=${b:--1}
	echo $((a < b ? a : b))
}
wait_step() { local t=0; while [ "$(last_step "$1")" -lt "$2" ]; do t=$((t + 1)); [ $t -ge $(($3 * 10)) ] && return 1; sleep 0.1; done; }
finished() { local t=0; while ! { grep -q '^done' "$1/rank0.log" 2>/dev/null && grep -q '^done' "$1/rank1.log" 2>/dev/null; }; do t=$((t + 1)); [ $t -ge $(($2 * 10)) ] && return 1; sleep 0.1; done; }
# same DIR [N]: every logged step, loss, all_reduce check, the parameters and the ballast equal
# ref's; with N, the steps up to N only (the run is stopped there)
same() {
	local r lines=(grep -E '^(step|params|ballast|store)')
	# shellcheck disable=SC2016 # awk's own variables
	[ -n "${2:-}" ] && lines=(awk -v n="$2" '$1 == "step" && $2 <= n')
	for r in 0 1; do
		diff <("${lines[@]}" "$W/ref/rank$r.log") <("${lines[@]}" "$1/rank$r.log") >"$OUT/diff.$(basename "$1").$r" || return 1
	done
	! grep -q BAD "$1"/rank*.log
}

# start NAME: the two-node job (one torchrun per node); sets DIR and AGENT[0..1]
declare -a AGENT
start() {
	local r host
	DIR=$W/$1
	rm -rf "$DIR" && mkdir -p "$DIR"
	for r in 0 1; do
		host=false && [ $r = 0 ] && host=true
		"$NETBED" exec "$BED" "n$r" -- env CUDA_VISIBLE_DEVICES=$r setsid "$TORCHRUN" --nnodes 2 --nproc-per-node 1 \
			--rdzv-backend c10d --rdzv-endpoint "${ADDR[0]}:$PORT" --rdzv-id "$1" --rdzv-conf "is_host=$host" \
			--local-addr "${ADDR[$r]}" "$JOB" "$DIR" --steps "$STEPS" --sleep 0 --model "$MODEL" --log-every 10 \
			--ballast "$BALLAST" --times --device "$DEVICE" </dev/null >"$DIR/stdout$r" 2>&1 &
		AGENT[r]=$!
	done
}
stop_job() { kill_job "${AGENT[0]}"; kill_job "${AGENT[1]}"; }

# both OUTFILE ARGS...: `criu-gpu ARGS` on both nodes at once (NODE in ARGS: 0 or 1; AGENT: the
# node's torchrun; DELAY[R]: seconds node R starts late); OUTFILE.R gets each node's output;
# RC[R] its exit status, SECS[R] its seconds
declare -a RC SECS DELAY=(0 0)
both() {
	local out=$1 r a pids=() t0
	shift
	t0=$(date +%s.%N)
	for r in 0 1; do
		a=("${@//NODE/$r}")
		a=("${a[@]//AGENT/${AGENT[$r]}}")
		{ sleep "${DELAY[r]}"; on "${NODES[$r]}" "$CRIU_GPU" "${a[@]}" --criu "$CRIU" -- --lib "$PLUG"; } >"$out.$r" 2>&1 &
		pids+=($!)
	done
	for r in 0 1; do
		wait "${pids[$r]}"
		RC[r]=$?
		SECS[r]=$(grep -oE '(dumped|restored) .* in [0-9.]+ s' "$out.$r" | grep -oE '[0-9.]+ s' | tail -1 | cut -d' ' -f1)
	done
	log "$(basename "$out"): rc ${RC[0]} ${RC[1]} in $(since "$t0") s"
}
dump_both() { both "$1" dump --nnodes 2 --node-rank NODE --rdzv "$RDZV/$2" --rdzv-timeout 120 AGENT "$W/img-$2-NODE"; }
restore_both() { both "$1" restore --nnodes 2 --rdzv "$RDZV/$2" --rdzv-timeout 120 "$W/img-$2-NODE"; }
rounds() { grep -oE 'after [0-9]+ round\(s\) in [0-9.]+ s' "$1" | head -1; }
# gone PIDS...: the processes of the job (dumped) are gone
tree_pids() { echo "${AGENT[0]} ${AGENT[1]} $(tree_of "${AGENT[0]}") $(tree_of "${AGENT[1]}")" | tr '\n' ' '; }

part_ref() {
	local t0
	log "== the uninterrupted two-node run ($STEPS steps flat out)"
	t0=$(date +%s.%N)
	start ref
	if finished "$DIR" 400; then
		log "ref: $STEPS steps in $(since "$t0") s ($(grep '^params' "$DIR/rank0.log"))"
	else
		fail "ref did not finish: $(tail -2 "$DIR/stdout0" | tr '\n' ' ')"
	fi
	stop_job
}

# cycle NAME JOBNAME I: one coordinated dump and restore of the running job; a row of TABLE
cycle() {
	local name=$1 job=$2 i=$3 at pids dt rt
	at=$(last_step "$DIR")
	pids=$(tree_pids)
	# Node B's part of the dump before stays (refused by name at cycle 2).
	rm -rf "$W/img-$job-0" "$W/img-$job-before-1"
	[ -d "$W/img-$job-1" ] && mv "$W/img-$job-1" "$W/img-$job-before-1"
	dump_both "$OUT/$name.dump" "$job"
	if [ "${RC[0]}" != 0 ] || [ "${RC[1]}" != 0 ]; then
		fail "$name: cycle $i (step $at): dump rc ${RC[*]}: $(grep -hE 'stopped|Error|problem' "$OUT/$name.dump".[01] | head -3 | tr '\n' ' ')"
		return 1
	fi
	dt="${SECS[0]}/${SECS[1]}"
	wait "${AGENT[0]}" "${AGENT[1]}" 2>/dev/null # our children until the first restore
	# shellcheck disable=SC2086
	wait_gone $pids || log "$name: cycle $i: the dumped processes are still there"
	[ "$name" = chain ] && [ "$i" = 2 ] && refused_parts "$job"
	[ "$name" = chain ] && [ "$i" = 3 ] && DELAY=(0 "$LATE")
	restore_both "$OUT/$name.restore" "$job"
	if [ "${DELAY[1]}" != 0 ]; then
		DELAY=(0 0)
		late_seen "$OUT/$name.restore"
	fi
	if [ "${RC[0]}" != 0 ] || [ "${RC[1]}" != 0 ]; then
		fail "$name: cycle $i: restore rc ${RC[*]}: $(grep -hE 'stopped|Error|problem' "$OUT/$name.restore".[01] | head -3 | tr '\n' ' ')"
		return 1
	fi
	rt="${SECS[0]}/${SECS[1]}"
	printf '%-5s %-6s %-12s %-12s %s\n' "$i" "$at" "$dt" "$rt" "$(rounds "$OUT/$name.dump.0")" >>"$OUT/$name.tsv"
	log "$name: cycle $i at step $at: dump $dt s, restore $rt s; $(rounds "$OUT/$name.dump.0")"
}

# refused NAME OUT RC WANT IMG: a refusal that came with WANT in its words, CRIU never having run
refused() {
	if [ "$3" != 0 ] && grep -q -- "$4" "$2" && ! [ -e "$5/dump.log" ]; then
		pass "$1: refused before anything was frozen: $(grep -m1 -- "$4" "$2" | cut -c1-200)"
	else
		fail "$1: rc $3, wanted '$4': $(tail -2 "$2" | tr '\n' ' ')"
	fi
}

# preflight_refusals JOB: with the job running, the dumps the preflight refuses before any lock
preflight_refusals() {
	local job=$1 first rc
	log "$job: the preflight's refusals, the job running"
	on n0 "$CRIU_GPU" dump --nnodes 2 --node-rank 0 --rdzv "etcd://$ETCD_ADDR:1/$job" "${AGENT[0]}" "$W/img-refused" \
		--criu "$CRIU" -- --lib "$PLUG" >"$OUT/refuse-etcd.out" 2>&1
	refused refuse-etcd "$OUT/refuse-etcd.out" $? "cannot be reached" "$W/img-refused"
	# Node A opens a dump and waits for node B, which does not come (8 s) ...
	on n0 "$CRIU_GPU" dump --nnodes 2 --node-rank 0 --rdzv "$RDZV/$job" --rdzv-timeout 8 "${AGENT[0]}" "$W/img-first" \
		--criu "$CRIU" -- --lib "$PLUG" >"$OUT/refuse-first.out" 2>&1 &
	first=$!
	for _ in $(seq 150); do grep -q "joined the dump" "$OUT/refuse-first.out" && break; sleep 0.1; done
	# ... while a second dump of node A's part, and node B with another --nnodes, are refused.
	on n0 "$CRIU_GPU" dump --nnodes 2 --node-rank 0 --rdzv "$RDZV/$job" "${AGENT[0]}" "$W/img-second" \
		--criu "$CRIU" -- --lib "$PLUG" >"$OUT/refuse-second.out" 2>&1
	refused refuse-second-dump "$OUT/refuse-second.out" $? "is running" "$W/img-second"
	on n1 "$CRIU_GPU" dump --nnodes 3 --node-rank 1 --rdzv "$RDZV/$job" "${AGENT[1]}" "$W/img-nnodes" \
		--criu "$CRIU" -- --lib "$PLUG" >"$OUT/refuse-nnodes.out" 2>&1
	refused refuse-nnodes "$OUT/refuse-nnodes.out" $? "with --nnodes 2" "$W/img-nnodes"
	wait "$first"
	rc=$?
	refused refuse-missing-node "$OUT/refuse-first.out" "$rc" "node(s) 1 of job $job did not join" "$W/img-first"
	rm -rf "$W/img-refused" "$W/img-first" "$W/img-second" "$W/img-nnodes"
}

# refused_parts JOB: the job dumped, its processes gone: parts of another job, and of two dumps,
# are refused by name on both nodes (the images stay as they are: the restore after uses them)
refused_parts() {
	local job=$1 want
	both "$OUT/refuse-job" restore --nnodes 2 --rdzv "$RDZV/other-$job" --rdzv-timeout 30 "$W/img-$job-NODE"
	want="this restore is of job other-$job"
	if [ "${RC[0]}" != 0 ] && [ "${RC[1]}" != 0 ] && grep -q "$want" "$OUT/refuse-job.0" && grep -q "$want" "$OUT/refuse-job.1"; then
		pass "refuse-other-job: $(grep -m1 "$want" "$OUT/refuse-job.1" | cut -c1-200)"
	else
		fail "refuse-other-job: rc ${RC[*]}: $(tail -1 "$OUT/refuse-job.1")"
	fi
	# Node A's part of this dump, node B's of the dump before (whose files grew since: with
	# --truncate-grown, which would cut them back only once the parts are found to be of one dump).
	ln -sfn "$W/img-$job-0" "$W/img-$job-mixed-0"
	ln -sfn "$W/img-$job-before-1" "$W/img-$job-mixed-1"
	both "$OUT/refuse-gen" restore --nnodes 2 --rdzv "$RDZV/$job" --rdzv-timeout 30 --truncate-grown "$W/img-$job-mixed-NODE"
	want="restore parts of one dump on every node"
	if [ "${RC[0]}" != 0 ] && [ "${RC[1]}" != 0 ] && grep -q "$want" "$OUT/refuse-gen.0" && grep -q "$want" "$OUT/refuse-gen.1"; then
		pass "refuse-other-dump: $(grep -m1 "$want" "$OUT/refuse-gen.0" | cut -c1-200)"
	else
		fail "refuse-other-dump: rc ${RC[*]}: $(tail -1 "$OUT/refuse-gen.0")"
	fi
	rm -f "$W/img-$job-mixed-0" "$W/img-$job-mixed-1"
}

# late_seen OUT: node A's restore waited for node B's, which started LATE s after it
late_seen() {
	if grep -q "node 1 not there" "$1.0" && grep -q "all 2 nodes joined" "$1.0" && [ "${RC[0]}${RC[1]}" = 00 ]; then
		pass "late: node B's restore started $LATE s after node A's; node A waited for it (restored in ${SECS[0]}/${SECS[1]} s)"
	else
		fail "late: rc ${RC[*]}: $(grep -m2 'cluster:' "$1.0" | tr '\n' ' ')"
	fi
}

part_chain() {
	local i next ok=1
	log "== $CYCLES coordinated dumps of the two-node job training flat out, each restored"
	[ -d "$W/ref" ] || { fail "chain: no reference (run ref first)"; return; }
	start chain
	printf '%-5s %-6s %-12s %-12s %s\n' cycle step dump_s_A/B restore_s_A/B lock >"$OUT/chain.tsv"
	wait_step "$DIR" 20 240 && preflight_refusals chain
	next=$(($(last_step "$DIR") + 20 + RANDOM % 20))
	for i in $(seq 1 "$CYCLES"); do
		[ "$next" -lt "$STEPS" ] || { fail "chain: cycle $i: step $next is past the run's $STEPS steps: raise STEPS"; ok=0; break; }
		wait_step "$DIR" "$next" 240 || { fail "chain: cycle $i: no step $next: $(tail -2 "$DIR/stdout0" | tr '\n' ' ')"; ok=0; break; }
		cycle chain chain "$i" || { ok=0; break; }
		next=$(($(last_step "$DIR") + 20 + RANDOM % 20))
	done
	if [ $ok = 1 ]; then
		if finished "$DIR" 400 && same "$DIR"; then
			pass "chain: $CYCLES of $CYCLES coordinated dumps of the two-node job, each restored; every logged loss and all_reduce check, the parameters and the ballast equal the uninterrupted run"
		else
			fail "chain: the run differs from the reference or did not finish: $(head -3 "$OUT"/diff.chain.* 2>/dev/null | tr '\n' ' ')"
		fi
	fi
	stop_job
}

# heartbeats RUN_ID [NODE ADDRESS]: the rendezvous state as node A's store holds it (each node's
# heartbeat age)
heartbeats() {
	on "${2:-n0}" "$PYTHON" -c '
import datetime, pickle, sys
from datetime import timedelta, timezone
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
b = C10dRendezvousBackend(TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, timeout=timedelta(seconds=20)), sys.argv[3])
s = pickle.loads(b.get_state()[0])
now = datetime.datetime.now(timezone.utc)
print("participants %d, heartbeat ages %s" % (len(s.participants), " ".join("%.1f" % (now - t).total_seconds() for t in s.last_heartbeats.values())))
' "${3:-${ADDR[0]}}" "$PORT" "$1" 2>/dev/null | tail -1
}

part_gap() {
	local pids i hb ok=1
	log "== a dump restored $GAP s later: torchrun's agents must not find each other dead"
	[ -d "$W/ref" ] || { fail "gap: no reference"; return; }
	start gap
	wait_step "$DIR" 100 240 || { fail "gap: no step 100"; stop_job; return; }
	log "gap: before the dump: $(heartbeats gap)"
	pids=$(tree_pids)
	rm -rf "$W"/img-gap-*
	dump_both "$OUT/gap.dump" gap
	[ "${RC[0]}${RC[1]}" = 00 ] || { fail "gap: dump rc ${RC[*]}"; stop_job; return; }
	wait "${AGENT[0]}" "${AGENT[1]}" 2>/dev/null
	# shellcheck disable=SC2086
	wait_gone $pids
	sleep "$GAP"
	restore_both "$OUT/gap.restore" gap
	[ "${RC[0]}${RC[1]}" = 00 ] || { fail "gap: restore rc ${RC[*]}: $(grep -hE 'stopped|Error|cannot' "$OUT"/gap.restore.? | head -3 | tr '\n' ' ')"; stop_job; return; }
	log "gap: $(grep -h '^torchrun:' "$OUT"/gap.restore.?)"
	for i in 1 2 3; do
		sleep 7
		hb=$(heartbeats gap)
		log "gap: $((i * 7)) s after the restore: $hb"
		# Two participants, every heartbeat younger than torchrun's 15 s.
		echo "$hb" | awk '/participants 2,/ { for (i = 5; i <= NF; i++) if ($i + 0 >= 15) exit 1; ok = 1 } END { exit !ok }' || ok=0
	done
	i=$(last_step "$DIR")
	if [ $ok = 1 ] && [ "$i" -gt 0 ] && same "$DIR" "$i"; then
		pass "gap: restored $GAP s after the dump: the heartbeats were made fresh before any agent ran and stayed fresh, both nodes participants; every step to $i equals the uninterrupted run's"
	else
		fail "gap: heartbeats or the run: $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
	fi
	stop_job
}

# interrupted NAME WHAT [VERDICT]: both nodes dump; once node B's ranks are locked (on the
# simulated GPU, where the CPU job locks nothing: once node B's CRIU is at its pre-dump action,
# held there 5 s), WHAT runs; both dumps must fail and VERDICT hold (went_on: the job goes on to
# its end equal to ref)
interrupted() {
	local name=$1 what=$2 verdict=${3:-went_on} r pids=() mark hold=() a
	[ -d "$W/ref" ] || { fail "$name: no reference"; return; }
	start "$name"
	wait_step "$DIR" 100 240 || { fail "$name: no step 100"; stop_job; return; }
	rm -rf "$W/img-$name"-* "$W/at-pre-dump"
	mark="grep -q 'criu_gpu: locked' $W/img-$name-1/dump.log"
	if [ $sim = 1 ]; then
		# shellcheck disable=SC2016 # the script's own variable
		printf '#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = pre-dump ] && { touch %s; sleep 5; }\nexit 0\n' "$W/at-pre-dump" >"$W/pre-dump.sh"
		chmod +x "$W/pre-dump.sh"
		hold=(--action-script "$W/pre-dump.sh")
		mark="test -e $W/at-pre-dump"
	fi
	for r in 0 1; do
		a=()
		[ $r = 1 ] && a=("${hold[@]}")
		on "n$r" "$CRIU_GPU" dump --nnodes 2 --node-rank "$r" --rdzv "$RDZV/$name" "${AGENT[$r]}" "$W/img-$name-$r" \
			--criu "$CRIU" -- --lib "$PLUG" "${a[@]}" >"$OUT/$name.dump.$r" 2>&1 &
		pids+=($!)
	done
	for _ in $(seq 600); do bash -c "$mark" 2>/dev/null && break; sleep 0.05; done
	$what
	wait "${pids[0]}"; RC[0]=$?
	wait "${pids[1]}"; RC[1]=$?
	log "$name: rc ${RC[*]}; $(grep -h 'cluster: stopped\|cannot pass' "$OUT/$name".dump.? | head -2 | tr '\n' ' ')"
	if [ "${RC[0]}" != 0 ] && [ "${RC[1]}" != 0 ] && $verdict "$name"; then
		pass "$name: both dumps failed; $VERDICT"
	else
		fail "$name: rc ${RC[*]}; $VERDICT; $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
	fi
	stop_job
}
# went_on NAME: every rank went on, AFTER steps past the failed dump, each equal to the
# uninterrupted run's (VERDICT says what held)
AFTER=150
went_on() {
	local upto=$(($(last_step "$DIR") + AFTER))
	[ $upto -gt "$STEPS" ] && upto=$STEPS
	VERDICT="every rank went on; every step to $upto equals the uninterrupted run's"
	wait_step "$DIR" "$upto" 120 && same "$DIR" "$upto"
}
# nothing_held NAME: no CUDA process of either node's part is left locked or checkpointed; node
# A's rank runs (not stopped) or is gone
nothing_held() {
	local rank0 st r
	rank0=$(grep -oE 'pid=[0-9]+' "$DIR/rank0.log" | head -1 | cut -d= -f2)
	sleep 1
	st=$(awk '/^State:/ { print $2 }' "/proc/$rank0/status" 2>/dev/null)
	for r in 0 1; do "$CTL" --list --tree "${AGENT[$r]}" 2>&1; done >"$OUT/$1.list"
	VERDICT="node A's rank ($rank0): ${st:-gone}; the parts' CUDA processes: $(grep -vE '^ *PID ' "$OUT/$1.list" | tr -s ' ' | tr '\n' ';' | cut -c1-200)"
	! grep -qE ' (locked|checkpointed) ' "$OUT/$1.list" && [ "$st" != T ] && [ "$st" != t ]
}
kill_b_rank() { kill -9 "$(grep -oE 'pid=[0-9]+' "$DIR/rank1.log" | head -1 | cut -d= -f2)"; }
part_rank-dies() { log "== node B's rank SIGKILLed in the middle of the dump"; interrupted rank-dies kill_b_rank nothing_held; }
kill_b_criu() { pkill -9 -f "criu(.real)? dump .*-D $W/img-kill-criu-1( |$)"; }
stop_etcd() { kill "$etcd_pid"; wait "$etcd_pid" 2>/dev/null; etcd_pid=; }
part_kill-criu() { log "== node B's CRIU SIGKILLed in the middle of the dump"; interrupted kill-criu kill_b_criu; }
part_etcd-stop() {
	log "== etcd stopped in the middle of the dump"
	interrupted etcd-stop stop_etcd
	start_etcd
}

part_newaddr() {
	local pids hb
	log "== node A's part restored on another node, m0 at $SPARE (as a rescheduled pod)"
	if ! "$CRIU_GPU" restore --help 2>&1 | grep -q -- --address-map; then
		log "SKIP newaddr: this criu-gpu cannot restore onto new addresses (branch mn-addr)"
		return
	fi
	[ -d "$W/ref" ] || { fail "newaddr: no reference"; return; }
	start newaddr
	wait_step "$DIR" 100 240 || { fail "newaddr: no step 100"; stop_job; return; }
	pids=$(tree_pids)
	rm -rf "$W"/img-newaddr-*
	dump_both "$OUT/newaddr.dump" newaddr
	[ "${RC[0]}${RC[1]}" = 00 ] || { fail "newaddr: dump rc ${RC[*]}"; stop_job; return; }
	wait "${AGENT[0]}" "${AGENT[1]}" 2>/dev/null
	# shellcheck disable=SC2086
	wait_gone $pids
	NODES=(m0 n1)
	restore_both "$OUT/newaddr.restore" newaddr
	NODES=(n0 n1)
	[ "${RC[0]}${RC[1]}" = 00 ] || { fail "newaddr: restore rc ${RC[*]}: $(grep -hE 'stopped|Error|problem' "$OUT"/newaddr.restore.? | head -3 | tr '\n' ' ')"; stop_job; return; }
	log "newaddr: $(grep -h 'connections move with' "$OUT/newaddr.restore.0" | head -1)"
	log "newaddr: $(grep -h '^torchrun:' "$OUT"/newaddr.restore.? | head -1)"
	sleep 7
	hb=$(heartbeats newaddr m0 "$SPARE")
	log "newaddr: 7 s after the restore: $hb"
	i=$(($(last_step "$DIR") + AFTER))
	[ $i -gt "$STEPS" ] && i=$STEPS
	if wait_step "$DIR" "$i" 120 && same "$DIR" "$i"; then
		pass "newaddr: node A's part restored on m0 ($SPARE), node B's in place; every step to $i equals the uninterrupted run's"
	else
		fail "newaddr: $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
	fi
	stop_job
}

part_one-node() {
	local i pids next
	log "== the same job, two ranks on node A, $CYCLES_ONE dumps: the one-node baseline"
	DIR=$W/one && rm -rf "$DIR" && mkdir -p "$DIR"
	"$NETBED" exec "$BED" n0 -- env CUDA_VISIBLE_DEVICES=0,1 setsid "$TORCHRUN" --standalone --nproc-per-node 2 \
		--local-addr "${ADDR[0]}" "$JOB" "$DIR" --steps "$STEPS" \
		--sleep 0 --model "$MODEL" --log-every 10 --ballast "$BALLAST" --device "$DEVICE" </dev/null >"$DIR/stdout0" 2>&1 &
	AGENT[0]=$!
	printf '%-5s %-6s %-8s %-9s %s\n' cycle step dump_s restore_s lock >"$OUT/one-node.tsv"
	next=60
	for i in $(seq 1 "$CYCLES_ONE"); do
		wait_step "$DIR" "$next" 240 || { fail "one-node: no step $next"; break; }
		pids="${AGENT[0]} $(tree_of "${AGENT[0]}" | tr '\n' ' ')"
		rm -rf "$W/img-one"
		on n0 "$CRIU_GPU" dump "${AGENT[0]}" "$W/img-one" --criu "$CRIU" -- --lib "$PLUG" >"$OUT/one-node.dump" 2>&1 || { fail "one-node: dump"; break; }
		# shellcheck disable=SC2086
		wait_gone $pids
		on n0 "$CRIU_GPU" restore "$W/img-one" --criu "$CRIU" -- --lib "$PLUG" >"$OUT/one-node.restore" 2>&1 || { fail "one-node: restore"; break; }
		printf '%-5s %-6s %-8s %-9s %s\n' "$i" "$(last_step "$DIR")" \
			"$(grep -oE 'in [0-9.]+ s' "$OUT/one-node.dump" | tail -1 | cut -d' ' -f2)" \
			"$(grep -oE 'in [0-9.]+ s' "$OUT/one-node.restore" | tail -1 | cut -d' ' -f2)" "$(rounds "$OUT/one-node.dump")" >>"$OUT/one-node.tsv"
		next=$(($(last_step "$DIR") + 30))
	done
	i=$(last_step "$DIR")
	kill_job "${AGENT[0]}"
	# The same job on one node: the same steps (as a check of the baseline, not of the dumps).
	if same "$DIR" "$i"; then
		log "one-node: every step to $i equals the two-node reference's"
	else
		log "one-node: its steps differ from the two-node reference's ($OUT/diff.one.0)"
	fi
	pass "one-node: $CYCLES_ONE dumps of the job on one node, each restored (the baseline: one-node.tsv)"
}

# median FILE COLUMN: the median of a column of a table (A/B: of the larger of the two)
median() {
	awk -v c="$2" 'NR > 1 { n = split($c, v, "/"); m = v[1]; if (n > 1 && v[2] > m) m = v[2]; print m }' "$1" |
		sort -n | awk '{ a[NR] = $0 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }'
}
# in_one FILE: how many dumps of a table locked in one round, of how many
in_one() { echo "$(grep -c 'after 1 round(s)' "$1") of $(($(wc -l <"$1") - 1))"; }
# compare_times: two nodes against one (the slower node's time per dump; medians)
compare_times() {
	local d2 r2 d1 r1
	d2=$(median "$OUT/chain.tsv" 3) r2=$(median "$OUT/chain.tsv" 4)
	d1=$(median "$OUT/one-node.tsv" 3) r1=$(median "$OUT/one-node.tsv" 4)
	log "median dump / restore seconds: two nodes (the slower) $d2 / $r2, one node $d1 / $r1; ratio $(awk -v a="$d2" -v b="$d1" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }') / $(awk -v a="$r2" -v b="$r1" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')"
	log "the GPU lock in one round: two nodes $(in_one "$OUT/chain.tsv"), one node $(in_one "$OUT/one-node.tsv")"
}

# oks LOG: the steps the MPI rank checked (0 before its log exists)
oks() { local n; n=$(grep -c ' ok$' "$1" 2>/dev/null); echo "${n:-0}"; }
# carried_only PIDS...: the MPI job's processes map no Open MPI or PMIx library or component but
# the carried ones (on this machine the system's Open MPI is there too; on the GPU machine there is none)
carried_only() {
	local p files outside
	files=$(for p in "$@"; do cat "/proc/$p/maps" 2>/dev/null; done | awk '{ print $6 }' | sort -u |
		grep -E '\.so(\.|$)' | grep -E 'openmpi|pmix|libmpi|libopen-(rte|pal)|libhwloc|libevent')
	outside=$(echo "$files" | grep -v "^$OPAL_CARRIED/")
	if [ -z "$outside" ]; then
		pass "mpi-carried: mpirun, orted and both ranks map Open MPI, PMIx and their libraries from $OPAL_CARRIED only ($(echo "$files" | grep -c .) files)"
	else
		fail "mpi-carried: the job maps Open MPI files from outside the carry: $(echo "$outside" | head -3 | tr '\n' ' ')"
	fi
}
# mpi_roots: the roots of the MPI job's two parts: mpirun (node A) and the session that netbed's
# rshd started for orted (node B)
mpi_roots() { echo "$MPIRUN $(pgrep -P "$RSHD" | head -1)"; }

part_mpi() {
	local app=$W/cuda-mpi-app agent=$W/rsh-agent log=$W/mpi/mpi r roots=() pids
	log "== an Open MPI job, one rank per node, its data on the GPU: dumped and restored across the nodes"
	local keep_path=$PATH
	rm -rf "$W/mpi" && mkdir -p "$W/mpi"
	# The simulated driver for the ranks of both nodes (orted's environment is rshd's).
	[ $sim = 1 ] && export LD_LIBRARY_PATH=$W/sim
	if [ $sim = 0 ] || [ "${MPI:-}" = carried ]; then
		# The GPU machine has no Open MPI: Debian's, carried (scripts/gpu/pack-carry.sh).
		[ -f "$root/.carry/mpi/env.sh" ] || { fail "mpi: no .carry/mpi (scripts/gpu/pack-carry.sh)"; unset LD_LIBRARY_PATH; return; }
		# shellcheck source=/dev/null
		. "$root/.carry/mpi/env.sh"
		app=$root/.carry/bin/cuda-mpi-app
		log "mpi: the carried Open MPI: $(command -v mpirun), OPAL_PREFIX=$OPAL_PREFIX"
		OPAL_CARRIED=$OPAL_PREFIX
	elif command -v mpirun >/dev/null && command -v mpicc >/dev/null; then
		mpicc -O2 -o "$app" "$root/tests/mpi/cuda-mpi-app.c" -ldl || { fail "mpi: mpicc"; return; }
	else
		log "SKIP mpi: no Open MPI (mpirun, mpicc) on this machine (scripts/install.sh installs it)"
		unset LD_LIBRARY_PATH
		return
	fi
	# shellcheck disable=SC2016 # the agent's own variables
	printf '#!/bin/sh\nhost=$1\nshift\nexec %s rsh "$host:7777" "$@"\n' "$NETBED" >"$agent" && chmod +x "$agent"
	CUDA_VISIBLE_DEVICES=1 "$NETBED" rshd "$BED" n1 7777 </dev/null >"$OUT/rshd.log" 2>&1 &
	RSHD=$!
	# The bed's two nodes are the job's whole allocation: a batch system's is not asked, and
	# orted starts through rsh. (mpirun's words on both GPU machines, "All nodes which are
	# allocated for this job are already filled", are what it says here inside a SLURM job.)
	local sched
	sched=$(env | grep -oE '^(SLURM|PBS|SGE|LSB)_[A-Z_]+' | sort | tr '\n' ' ')
	[ -z "$sched" ] || log "mpi: a batch system's variables, not asked: $sched"
	# Each node shows its rank its own GPU as device 0 (CUDA_VISIBLE_DEVICES, here and in rshd's
	# environment): device 1 on node B was CUDA_ERROR_INVALID_DEVICE on two H200s.
	CUDA_VISIBLE_DEVICES=0 "$NETBED" exec "$BED" n0 -- setsid mpirun --allow-run-as-root --display-allocation --display-map --mca ras ^slurm,gridengine,tm,lsf --mca plm rsh --mca plm_rsh_agent "$agent" --mca btl tcp,self \
		--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 --mca shmem mmap \
		-np 1 -H "${ADDR[0]}" "$app" "$log" 100000 20 0 : -np 1 -H "${ADDR[1]}" "$app" "$log" 100000 20 0 \
		</dev/null >"$OUT/mpirun.log" 2>&1 &
	MPIRUN=$!
	unset LD_LIBRARY_PATH OPAL_PREFIX PMIX_PREFIX PMIX_LIBDIR PMIX_PKGLIBDIR PMIX_DATADIR PMIX_PKGDATADIR
	PATH=$keep_path
	for _ in $(seq 600); do [ "$(oks "$log.rank1")" -ge 20 ] && break; sleep 0.1; done
	read -r -a roots <<<"$(mpi_roots)"
	if [ "${#roots[@]}" != 2 ] || [ "$(oks "$log.rank1")" -lt 20 ]; then
		fail "mpi: the job did not start: $(grep -v "^ *$" "$OUT/mpirun.log" | head -30 | tr '\n' ' ')"
		kill "$RSHD" "$MPIRUN" 2>/dev/null
		return
	fi
	AGENT=("${roots[@]}")
	pids="${roots[*]} $(tree_of "${roots[0]}") $(tree_of "${roots[1]}")"
	# shellcheck disable=SC2086 # a list of pids
	[ -n "${OPAL_CARRIED:-}" ] && carried_only $pids
	rm -rf "$W"/img-mpi-*
	dump_both "$OUT/mpi.dump" mpi
	[ "${RC[0]}${RC[1]}" = 00 ] || { fail "mpi: dump rc ${RC[*]}: $(grep -hE 'stopped|Error' "$OUT"/mpi.dump.? | head -3 | tr '\n' ' ')"; kill "$RSHD" "$MPIRUN" 2>/dev/null; return; }
	wait "$MPIRUN" 2>/dev/null
	# shellcheck disable=SC2086
	wait_gone $pids
	r=$(oks "$log.rank0")
	restore_both "$OUT/mpi.restore" mpi
	[ "${RC[0]}${RC[1]}" = 00 ] || { fail "mpi: restore rc ${RC[*]}"; kill "$RSHD" 2>/dev/null; return; }
	sleep 3
	if [ "$(oks "$log.rank0")" -gt "$r" ] && [ "$(oks "$log.rank1")" -gt "$r" ] && ! grep -q BAD "$log".rank*; then
		pass "mpi: the Open MPI job (mpirun on A, orted on B through rsh) dumped at step $r on both nodes, restored, its ranks' GPU data checked every step since: $(tail -1 "$log.rank0")"
	else
		fail "mpi: after the restore: $(tail -1 "$log.rank0") | $(tail -1 "$log.rank1")"
	fi
	# shellcheck disable=SC2046
	kill -9 $(tree_of "${roots[0]}") $(tree_of "${roots[1]}") "${roots[@]}" "$RSHD" 2>/dev/null
}

# need PART: about the seconds PART takes on the GPU machine (estimates: a two-node run of
# STEPS 35 s, a dump and restore 8 s); a part starts only when it fits what is left of BUDGET
need() {
	case $1 in
	ref) echo 40 ;; chain) echo $((60 + CYCLES * 8)) ;; one-node) echo $((40 + CYCLES_ONE * 7)) ;;
	gap) echo $((50 + GAP)) ;; mpi) echo 25 ;; *) echo 35 ;;
	esac
}
declare -a ROWS
T0=$SECONDS
for p in $PARTS; do
	case $p in
	ref | chain | gap | kill-criu | etcd-stop | rank-dies | newaddr | one-node | mpi) ;;
	*) log "unknown part $p"; continue ;;
	esac
	left=$((BUDGET - (SECONDS - T0)))
	if [ "$(need "$p")" -gt $left ]; then
		log "SKIP $p: $left s of BUDGET left, it needs about $(need "$p") s"
		ROWS+=("$p|SKIP (time)|0")
		continue
	fi
	p0=$PASS f0=$FAIL t=$SECONDS
	"part_$p"
	r="PASS $((PASS - p0))"
	[ "$FAIL" -gt "$f0" ] && r="FAIL $((FAIL - f0)), pass $((PASS - p0))"
	[ "$PASS" = "$p0" ] && [ "$FAIL" = "$f0" ] && r=SKIP
	ROWS+=("$p|$r|$((SECONDS - t))")
done
{
	printf '%-10s %-22s %s\n' part result seconds
	for r in "${ROWS[@]}"; do IFS='|' read -r a b c <<<"$r"; printf '%-10s %-22s %s\n' "$a" "$b" "$c"; done
} >"$OUT/table.txt"
log "the parts ($((SECONDS - T0)) s in all):"
tee -a "$LOG_FILE" <"$OUT/table.txt"
[ -s "$OUT/chain.tsv" ] && { log "chain (two nodes):"; tee -a "$LOG_FILE" <"$OUT/chain.tsv"; }
[ -s "$OUT/one-node.tsv" ] && { log "one-node (the same job on node A):"; tee -a "$LOG_FILE" <"$OUT/one-node.tsv"; }
[ -s "$OUT/chain.tsv" ] && [ -s "$OUT/one-node.tsv" ] && compare_times
log "passed: $PASS failed: $FAIL"
[ "$FAIL" = 0 ]
