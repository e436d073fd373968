#!/bin/bash
# A job across machines on one machine with two GPUs (issue 28): two nodes as network and UTS
# namespaces on a bridge of their own (netbed), node A (n0) owning GPU 0 and node B (n1) GPU 1, a
# real etcd on a third, and a two-node torchrun DDP job training flat out (scripts/gpu/ddp-job.py,
# one `torchrun --nnodes 2 --rdzv-backend c10d` launch per node, NCCL over sockets between the
# nodes), checkpointed with `criu-gpu dump|restore --nnodes 2 --rdzv etcd://...` inside each node.
#   ref        the uninterrupted run: the reference
#   chain      CYCLES coordinated dumps of one run, each restored; a table (step, dump and
#              restore seconds, lock rounds); every logged loss, all_reduce check, the parameters
#              and the ballast equal to the reference
#   gap        a dump restored GAP seconds later (more than torchrun's 15 s): the restore sets the
#              rendezvous heartbeats fresh before any agent runs, the agents keep them fresh after
#              (read from the store three times), both nodes stay participants; equal to ref
#   kill-criu  node B's CRIU SIGKILLed once both nodes locked: both dumps fail, the job goes on,
#              equal to ref
#   etcd-stop  etcd stopped at the same point: the same (etcd is started again after)
#   newaddr    node A's part restored on a spare node at another address (m0), node B's in
#              place: every connection of the job moves with node A (the address map the nodes
#              derive); equal to ref
#   one-node   the same job, two ranks on node A (torchrun --standalone) and CYCLES_ONE dumps:
#              the lock rounds, dump and restore times to set the two-node ones against
#   mpi        an Open MPI job (tests/mpi/cuda-mpi-app.c: its data on each node's GPU, summed
#              with MPI_Allreduce host-staged over TCP), mpirun on A starting orted on B through
#              netbed's rsh, dumped and restored on both nodes; needs mpirun and mpicc (skipped
#              where there are none: the GPU machine has no Open MPI)
# Each part is bounded and prints PASS or FAIL with what it saw; results go to $OUT as they come.
# On the GPU machine (needs .carry: scripts/gpu/pack-carry.sh), in calls of < 10 minutes:
#   OUT=$OUT scripts/gpu/multinode.sh "ref chain"
#   OUT=$OUT scripts/gpu/multinode.sh "ref gap kill-criu etcd-stop"
#   OUT=$OUT scripts/gpu/multinode.sh "ref one-node newaddr"
# --sim: on this machine: CPU torch (gloo) on the simulated GPU, target/debug's binaries, the
# installed CRIU and etcd, PYTHON a Python with torch (STEPS, CYCLES smaller by default).
# Environment: CYCLES (20; sim 3), CYCLES_ONE (10; sim 2), STEPS (1500; sim 400), GAP (20),
# BALLAST (GiB per rank: 0.25; sim 0), PYTHON (python3).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
sim=0
[ "${1:-}" = --sim ] && { sim=1; shift; }
PARTS=${1:-"ref chain gap kill-criu etcd-stop one-node"}
OUT=${OUT:-/tmp/multinode}
PYTHON=${PYTHON:-python3}
GAP=${GAP:-20}
W=/dev/shm/multinode
mkdir -p "$OUT" "$W"
LOG_FILE=$OUT/multinode.log
# shellcheck source=scripts/gpu/job-lib.sh
. "$here/job-lib.sh"
if [ $sim = 1 ]; then
	CYCLES=${CYCLES:-3} CYCLES_ONE=${CYCLES_ONE:-2} STEPS=${STEPS:-400} BALLAST=${BALLAST:-0}
	BIN=$root/target/debug
	CRIU=${CRIU:-/usr/local/sbin/criu} ETCD=${ETCD:-/usr/bin/etcd}
	DEVICE=cpu MODEL=mlp
else
	CYCLES=${CYCLES:-20} CYCLES_ONE=${CYCLES_ONE:-10} STEPS=${STEPS:-1500} BALLAST=${BALLAST:-0.25}
	BIN=$root/.carry/bin
	CRIU=$BIN/criu ETCD=$BIN/etcd
	DEVICE=cuda MODEL=wide
fi
CRIU_GPU=$BIN/criu-gpu NETBED=$BIN/netbed
TORCHRUN=$(dirname "$(command -v "$PYTHON")")/torchrun
JOB=$here/ddp-job.py
BED=$W/bed
NET=10.$((100 + $$ % 100)).0
ADDR=("$NET.1" "$NET.2") ETCD_ADDR=$NET.254 PORT=29500 SPARE=$NET.11
# Where each node's criu-gpu runs (newaddr restores node A's part on the spare node m0).
NODES=(n0 n1)
export PYTHONUNBUFFERED=1
# Never NVLink multicast on these machines; NCCL and gloo over the nodes' eth0, sockets only.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0 NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 \
	NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0

fix="scripts/gpu/pack-carry.sh; PYTHON: a Python with torch"
[ $sim = 1 ] && fix="cargo build --workspace; PYTHON: a Python with torch (CPU is enough)"
for f in "$CRIU_GPU" "$NETBED" "$CRIU" "$ETCD" "$TORCHRUN"; do
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
# plugin_id SO: its GNU build-id (the ELF note: namesz 4, descsz 20, type 3, "GNU")
plugin_id() { python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); n = b"\4\0\0\0\x14\0\0\0\3\0\0\0GNU\0"; i = d.find(n); print(d[i + 16:i + 36].hex() if i >= 0 else "none")' "$1"; }
gpus="simulated GPU (2), CPU torch" && [ $sim = 0 ] && gpus=$(nvidia-smi -L 2>&1 | tr '\n' ' ')
log "multinode.sh $(git -C "$root" describe --always --dirty 2>/dev/null); plugin build-id $(plugin_id "$PLUG/criu_gpu_plugin.so"); $gpus"
log "$("$PYTHON" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")' 2>&1 | tail -1)"

etcd_pid=
cleanup() {
	local p
	for p in $(pgrep -f "$W/(ref|chain|gap|kill|etcd|one|newaddr)" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
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
# same DIR: every logged step, loss, all_reduce check, the parameters and the ballast equal ref's
same() {
	local r
	for r in 0 1; do
		diff <(grep -E '^(step|params|ballast|store)' "$W/ref/rank$r.log") <(grep -E '^(step|params|ballast|store)' "$1/rank$r.log") \
			>"$OUT/diff.$(basename "$1").$r" || return 1
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
# node's torchrun); OUTFILE.R gets each node's output; RC[R] its exit status, SECS[R] its seconds
declare -a RC SECS
both() {
	local out=$1 r a pids=() t0
	shift
	t0=$(date +%s.%N)
	for r in 0 1; do
		a=("${@//NODE/$r}")
		a=("${a[@]//AGENT/${AGENT[$r]}}")
		on "${NODES[$r]}" "$CRIU_GPU" "${a[@]}" --criu "$CRIU" -- --lib "$PLUG" >"$out.$r" 2>&1 &
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
	rm -rf "$W/img-$job-0" "$W/img-$job-1"
	dump_both "$OUT/$name.dump" "$job"
	if [ "${RC[0]}" != 0 ] || [ "${RC[1]}" != 0 ]; then
		fail "$name: cycle $i (step $at): dump rc ${RC[*]}: $(grep -hE 'stopped|Error|problem' "$OUT/$name.dump".[01] | head -3 | tr '\n' ' ')"
		return 1
	fi
	dt="${SECS[0]}/${SECS[1]}"
	wait "${AGENT[0]}" "${AGENT[1]}" 2>/dev/null # our children until the first restore
	# shellcheck disable=SC2086
	wait_gone $pids || log "$name: cycle $i: the dumped processes are still there"
	restore_both "$OUT/$name.restore" "$job"
	if [ "${RC[0]}" != 0 ] || [ "${RC[1]}" != 0 ]; then
		fail "$name: cycle $i: restore rc ${RC[*]}: $(grep -hE 'stopped|Error|problem' "$OUT/$name.restore".[01] | head -3 | tr '\n' ' ')"
		return 1
	fi
	rt="${SECS[0]}/${SECS[1]}"
	printf '%-5s %-6s %-12s %-12s %s\n' "$i" "$at" "$dt" "$rt" "$(rounds "$OUT/$name.dump.0")" >>"$OUT/$name.tsv"
	log "$name: cycle $i at step $at: dump $dt s, restore $rt s; $(rounds "$OUT/$name.dump.0")"
}

part_chain() {
	local i next ok=1
	log "== $CYCLES coordinated dumps of the two-node job training flat out, each restored"
	[ -d "$W/ref" ] || { fail "chain: no reference (run ref first)"; return; }
	start chain
	printf '%-5s %-6s %-12s %-12s %s\n' cycle step dump_s_A/B restore_s_A/B lock >"$OUT/chain.tsv"
	next=$((30 + RANDOM % 30))
	for i in $(seq 1 "$CYCLES"); do
		wait_step "$DIR" "$next" 240 || { fail "chain: cycle $i: no step $next: $(tail -2 "$DIR/stdout0" | tr '\n' ' ')"; ok=0; break; }
		cycle chain chain "$i" || { ok=0; break; }
		next=$(($(last_step "$DIR") + 20 + RANDOM % 30))
	done
	if [ $ok = 1 ]; then
		if finished "$DIR" 400 && same "$DIR"; then
			pass "chain: $CYCLES of $CYCLES coordinated dumps of the two-node job, each restored; every logged loss and all_reduce check, the parameters and the ballast equal the uninterrupted run"
		else
			fail "chain: the run differs from the reference or did not finish: $(head -3 "$OUT"/diff.chain.* 2>/dev/null | tr '\n' ' ')"
		fi
	fi
	cat "$OUT/chain.tsv" >>"$LOG_FILE"
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
	if [ $ok = 1 ] && finished "$DIR" 400 && same "$DIR"; then
		pass "gap: restored $GAP s after the dump: the heartbeats were made fresh before any agent ran and stayed fresh, both nodes participants; the run equals the uninterrupted one"
	else
		fail "gap: heartbeats or the run: $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
	fi
	stop_job
}

# interrupted NAME WHAT: both nodes dump; once node B's ranks are locked (on the simulated GPU,
# where the CPU job locks nothing: once node B's CRIU is at its pre-dump action, held there
# 5 s), WHAT runs; both dumps must fail and the job go on to its end equal to ref
interrupted() {
	local name=$1 what=$2 r pids=() mark hold=() a
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
	if [ "${RC[0]}" != 0 ] && [ "${RC[1]}" != 0 ] && finished "$DIR" 400 && same "$DIR"; then
		pass "$name: both dumps failed, every rank went on; the run equals the uninterrupted one"
	else
		fail "$name: rc ${RC[*]}; $(tail -2 "$DIR/rank0.log" | tr '\n' ' ')"
	fi
	stop_job
}
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
	if finished "$DIR" 400 && same "$DIR"; then
		pass "newaddr: node A's part restored on m0 ($SPARE), node B's in place; the run equals the uninterrupted one"
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
	kill_job "${AGENT[0]}"
	cat "$OUT/one-node.tsv" >>"$LOG_FILE"
	# Two nodes against one: the medians of the chain's and this table's times.
	if [ -s "$OUT/chain.tsv" ]; then
		log "dump and restore seconds, median: two nodes (A/B) $(awk 'NR > 1 { print $3 }' "$OUT/chain.tsv" | sort -t/ -k1 -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }') / $(awk 'NR > 1 { print $4 }' "$OUT/chain.tsv" | sort -t/ -k1 -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }'); one node $(awk 'NR > 1 { print $3 }' "$OUT/one-node.tsv" | sort -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }') / $(awk 'NR > 1 { print $4 }' "$OUT/one-node.tsv" | sort -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }')"
	fi
	pass "one-node: $CYCLES_ONE dumps of the job on one node (the baseline: one-node.tsv)"
}

# oks LOG: the steps the MPI rank checked (0 before its log exists)
oks() { local n; n=$(grep -c ' ok$' "$1" 2>/dev/null); echo "${n:-0}"; }
# mpi_roots: the roots of the MPI job's two parts: mpirun (node A) and the session that netbed's
# rshd started for orted (node B)
mpi_roots() { echo "$MPIRUN $(pgrep -P "$RSHD" | head -1)"; }

part_mpi() {
	local app=$W/cuda-mpi-app agent=$W/rsh-agent log=$W/mpi/mpi r roots=() pids
	log "== an Open MPI job, one rank per node, its data on the GPU: dumped and restored across the nodes"
	if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
		log "SKIP mpi: no Open MPI (mpirun, mpicc) on this machine (docs/known-limits.md)"
		return
	fi
	rm -rf "$W/mpi" && mkdir -p "$W/mpi"
	mpicc -O2 -o "$app" "$root/tests/mpi/cuda-mpi-app.c" -ldl || { fail "mpi: mpicc"; return; }
	# shellcheck disable=SC2016 # the agent's own variables
	printf '#!/bin/sh\nhost=$1\nshift\nexec %s rsh "$host:7777" "$@"\n' "$NETBED" >"$agent" && chmod +x "$agent"
	# The simulated driver for the ranks of both nodes (orted's environment is rshd's).
	[ $sim = 1 ] && export LD_LIBRARY_PATH=$W/sim
	"$NETBED" rshd "$BED" n1 7777 </dev/null >"$OUT/rshd.log" 2>&1 &
	RSHD=$!
	"$NETBED" exec "$BED" n0 -- setsid mpirun --allow-run-as-root --mca plm_rsh_agent "$agent" --mca btl tcp,self \
		--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 --mca shmem mmap \
		-np 1 -H "${ADDR[0]}" "$app" "$log" 100000 20 0 : -np 1 -H "${ADDR[1]}" "$app" "$log" 100000 20 1 \
		</dev/null >"$OUT/mpirun.log" 2>&1 &
	MPIRUN=$!
	unset LD_LIBRARY_PATH
	for _ in $(seq 600); do [ "$(oks "$log.rank1")" -ge 20 ] && break; sleep 0.1; done
	read -r -a roots <<<"$(mpi_roots)"
	if [ "${#roots[@]}" != 2 ] || [ "$(oks "$log.rank1")" -lt 20 ]; then
		fail "mpi: the job did not start: $(head -3 "$OUT/mpirun.log" | tr '\n' ' ')"
		kill "$RSHD" "$MPIRUN" 2>/dev/null
		return
	fi
	AGENT=("${roots[@]}")
	pids="${roots[*]} $(tree_of "${roots[0]}") $(tree_of "${roots[1]}")"
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

for p in $PARTS; do
	case $p in
	ref | chain | gap | kill-criu | etcd-stop | newaddr | one-node | mpi) "part_$p" ;;
	*) log "unknown part $p" ;;
	esac
done
log "passed: $PASS failed: $FAIL"
[ "$FAIL" = 0 ]
