#!/bin/bash
# Measures, on a machine with two GPUs, what the r580 driver and CRIU do with a two-rank PyTorch
# NCCL job (scripts/gpu/ddp-job.py): each NCCL transport under the driver's checkpoint alone
# (cuda-checkpoint-ctl --suspend/--resume --tree), a restore with the GPUs swapped, and what CRIU
# says when it dumps and restores the job (sockets transport) and a torchrun job. Facts, not a
# test: every part prints what happened and goes on.
#
#   OUT=/tmp/out scripts/experiments/dist-explore.sh [PARTS]      PARTS: default "facts transports swap criu torchrun"
#
# Needs .carry (scripts/gpu/pack-carry.sh) in the working tree.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/dist-explore}
# $OUT takes few files: the log there, everything else in RES, packed into $OUT after each part.
RES=/tmp/dist-explore-results
W=/dev/shm/dist-explore
PARTS=${1:-"facts transports swap criu torchrun"}
export PATH="$root/.carry/bin:$PATH"
CTL=$root/.carry/bin/cuda-checkpoint-ctl
PLUGINS=$root/.carry/plugins
JOB=$here/../gpu/ddp-job.py
# Never NVLink multicast on this machine (it can take the host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$W" "$RES"
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
log() { printf '[%(%T)T] %s\n' -1 "$*" | tee -a "$OUT/explore.log"; }

# every descendant of $1
tree_of() { local p; for p in $(pgrep -P "$1"); do echo "$p"; tree_of "$p"; done; }
kill_tree() {
	local r=$1 all
	all="$r $(tree_of "$r")"
	# shellcheck disable=SC2086 # a list of pids
	kill -9 $all 2>/dev/null
	sleep 0.5
}

# wait_steps DIR N SECONDS: until both ranks logged step N (or done)
wait_steps() {
	local dir=$1 n=$2 limit=$3 t=0
	while :; do
		local ok=0
		for r in 0 1; do grep -qE "^(step $n |done)" "$dir/rank$r.log" 2>/dev/null && ok=$((ok + 1)); done
		[ $ok = 2 ] && return 0
		t=$((t + 1))
		[ $t -ge $((limit * 5)) ] && return 1
		sleep 0.2
	done
}

# job_result DIR: one line on how the job ended
job_result() {
	local dir=$1 r out=""
	for r in 0 1; do
		local f=$dir/rank$r.log steps bad
		steps=$(grep -c '^step ' "$f" 2>/dev/null)
		bad=$(grep -c 'BAD' "$f" 2>/dev/null)
		out+="rank$r: $steps steps, $bad BAD, $(grep -E '^(params|ballast|done)' "$f" 2>/dev/null | tr '\n' ' ') "
	done
	echo "$out"
}

start_job() { # start_job NAME PORT ENV... -> sets JOBPID, JOBDIR
	local name=$1 port=$2
	shift 2
	JOBDIR=$W/$name
	rm -rf "$JOBDIR" && mkdir -p "$JOBDIR"
	env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM,NET,ALLOC \
		setsid python3 "$JOB" --spawn 2 "$JOBDIR" --steps 300 --sleep 0.02 --ballast 1 --port "$port" \
		</dev/null >"$JOBDIR/stdout" 2>&1 &
	JOBPID=$!
}

transports_of() { grep -oE 'via (P2P/[A-Za-z/]+|SHM/[A-Za-z/]+|NET/[A-Za-z0-9/]+)' "$1/stdout" | sort | uniq -c | tr '\n' ';'; }

part_facts() {
	log "== facts"
	{
		uname -r
		nvidia-smi -L
		nvidia-smi topo -m
		python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
		cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag
		command -v iptables nft ss ip || true
		criu --version
		criu check --feature network-lock-nftables 2>&1 | tail -1
		criu check --feature uffd 2>&1 | tail -1
		criu check --feature uffd-noncoop 2>&1 | tail -1
		echo "unprivileged_userfaultfd: $(cat /proc/sys/vm/unprivileged_userfaultfd 2>&1)"
		env | grep -E '^(NCCL|TORCH|NVSHMEM|CUDA)' || true
	} >"$RES/facts.txt" 2>&1
	cat "$RES/facts.txt"
}

# one transport configuration under the driver alone
transport() { # transport NAME PORT ENV...
	local name=$1 port=$2 t0
	shift 2
	start_job "$name" "$port" "$@"
	if ! wait_steps "$JOBDIR" 20 120; then
		log "$name: job did not reach step 20: $(tail -3 "$JOBDIR/stdout" | tr '\n' ' ')"
		kill_tree "$JOBPID"
		return
	fi
	log "$name: transports: $(transports_of "$JOBDIR")"
	t0=$(date +%s.%N)
	timeout 90 "$CTL" --suspend --tree "$JOBPID" --wait 60 >"$JOBDIR/suspend.out" 2>&1
	local rc=$?
	log "$name: suspend rc=$rc in $(since "$t0") s: $(tail -4 "$JOBDIR/suspend.out" | tr '\n' ' ')"
	timeout 20 "$CTL" --list --tree "$JOBPID" 2>&1 | sed "s/^/  $name list: /" | tee -a "$OUT/explore.log"
	sleep 1
	t0=$(date +%s.%N)
	timeout 90 "$CTL" --resume --tree "$JOBPID" --wait 60 ${MAP:+--device-map "$MAP"} >"$JOBDIR/resume.out" 2>&1
	rc=$?
	log "$name: resume${MAP:+ (map $MAP)} rc=$rc in $(since "$t0") s: $(tail -4 "$JOBDIR/resume.out" | tr '\n' ' ')"
	if [ -n "${MAP:-}" ]; then
		nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader 2>&1 | sed "s/^/  $name apps: /" | tee -a "$OUT/explore.log"
	fi
	wait_steps "$JOBDIR" 299 90 || log "$name: job did not finish after resume"
	sleep 2
	log "$name: $(job_result "$JOBDIR")"
	grep -E 'NCCL WARN|Error|error' "$JOBDIR/stdout" | head -5 | sed "s/^/  $name: /" | tee -a "$OUT/explore.log"
	kill_tree "$JOBPID"
	cp "$JOBDIR/stdout" "$RES/$name.stdout" 2>/dev/null
}

part_transports() {
	log "== transports (driver only, cuda-checkpoint-ctl --suspend/--resume --tree)"
	transport default 29601
	transport cumem-off 29602 NCCL_CUMEM_ENABLE=0
	transport shm 29603 NCCL_P2P_DISABLE=1
	transport sockets-cumem-off 29606 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0
}

part_swap() {
	log "== swap (resume with the two GPUs swapped)"
	local u0 u1
	u0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | sed -n 1p)
	u1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | sed -n 2p)
	MAP="$u0=$u1,$u1=$u0" transport swap-sockets 29611 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0
	MAP="$u0=$u1,$u1=$u0" transport swap-default 29612
}

# what a tree holds that CRIU cares about
inventory() { # inventory ROOT FILE
	local r=$1 f=$2 p
	{
		for p in $r $(tree_of "$r"); do
			echo "--- pid $p $(cat /proc/"$p"/comm) ppid $(awk '{print $4}' /proc/"$p"/stat)"
			for fd in /proc/"$p"/fd/*; do readlink "$fd"; done 2>/dev/null | grep -vE 'pipe:|/dev/null|/dev/pts' | sort | uniq -c | head -40
			grep -E 'io_uring|libuv|libcuda|nccl|deleted|/dev/shm' /proc/"$p"/maps 2>/dev/null | awk '{print $6, $7}' | sort | uniq -c | head -20
		done
		echo "--- tcp"
		cat /proc/net/tcp /proc/net/tcp6
	} >"$f" 2>&1
}

criu_roundtrip() { # criu_roundtrip NAME ROOT
	local name=$1 r=$2 dir=$W/img-$1 t0 rc
	rm -rf "$dir" && mkdir -p "$dir"
	inventory "$r" "$RES/$name.inventory"
	t0=$(date +%s.%N)
	timeout 180 criu dump -t "$r" -D "$dir" --lib "$PLUGINS" --tcp-established --network-lock nftables \
		--ghost-limit 256M -v4 -o dump.log
	rc=$?
	log "$name: criu dump rc=$rc in $(since "$t0") s"
	grep -E 'Error|criu_gpu: (locked|checkpointed)|Warn' "$dir/dump.log" | grep -v RLIMIT | tail -12 | sed "s/^/  $name dump: /" | tee -a "$OUT/explore.log"
	grep -E 'inet:|tcp:|sk-inet|sockets:|TCP|Dumping inet' "$dir/dump.log" | head -150 >"$RES/$name.dump-sockets.log"
	gzip -c "$dir/dump.log" >"$RES/$name.dump.log.gz"
	if [ $rc != 0 ]; then kill_tree "$r"; return; fi
	for _ in $(seq 100); do pgrep -f "$JOBDIR" >/dev/null || break; sleep 0.1; done
	t0=$(date +%s.%N)
	timeout 180 criu restore -D "$dir" -d --lib "$PLUGINS" --tcp-established --network-lock nftables -v4 -o restore.log
	rc=$?
	log "$name: criu restore rc=$rc in $(since "$t0") s"
	grep -E 'Error|criu_gpu: restored|Warn' "$dir/restore.log" | grep -v RLIMIT | tail -12 | sed "s/^/  $name restore: /" | tee -a "$OUT/explore.log"
	grep -E 'inet:|tcp:|sk-inet|Restore.*socket|bind' "$dir/restore.log" | head -200 >"$RES/$name.restore-sockets.log"
	gzip -c "$dir/restore.log" >"$RES/$name.restore.log.gz"
	if [ $rc = 0 ]; then
		wait_steps "$JOBDIR" 299 120 || log "$name: job did not finish after restore"
		sleep 2
		log "$name: $(job_result "$JOBDIR")"
		pkill -9 -f "$JOBDIR" 2>/dev/null
	fi
	rm -rf "$dir"
}

part_criu() {
	log "== criu (sockets transport, libuv off)"
	start_job criu-sockets 29621 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0 USE_LIBUV=0 UV_USE_IO_URING=0
	wait_steps "$JOBDIR" 20 120 || { log "criu-sockets: no step 20"; kill_tree "$JOBPID"; return; }
	criu_roundtrip criu-sockets "$JOBPID"
	log "== criu (defaults, libuv on): what CRIU says"
	start_job criu-default 29622
	wait_steps "$JOBDIR" 20 120 || { log "criu-default: no step 20"; kill_tree "$JOBPID"; return; }
	inventory "$JOBPID" "$RES/criu-default.inventory"
	criu_roundtrip criu-default "$JOBPID"
}

part_torchrun() {
	log "== torchrun (sockets transport, libuv off)"
	JOBDIR=$W/torchrun
	rm -rf "$JOBDIR" && mkdir -p "$JOBDIR"
	env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0 USE_LIBUV=0 UV_USE_IO_URING=0 \
		setsid torchrun --standalone --nproc-per-node 2 "$JOB" "$JOBDIR" --steps 300 --sleep 0.02 --ballast 1 \
		</dev/null >"$JOBDIR/stdout" 2>&1 &
	JOBPID=$!
	wait_steps "$JOBDIR" 20 120 || { log "torchrun: no step 20: $(tail -5 "$JOBDIR/stdout" | tr '\n' ' ')"; kill_tree "$JOBPID"; return; }
	ps -o pid,ppid,pgid,sid,comm,args --forest -g "$(ps -o sid= -p "$JOBPID" | tr -d ' ')" | tee -a "$OUT/explore.log"
	criu_roundtrip torchrun "$JOBPID"
}

for p in $PARTS; do
	timeout 300 bash -c "$(declare -f); $(declare -p W OUT RES CTL PLUGINS JOB PATH root here); part_$p" ||
		log "part $p ended with $?"
	tar czf "$OUT/results.tgz" -C "$RES" .
done
rm -rf "$W"
log "explore done"
