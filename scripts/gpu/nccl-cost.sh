#!/bin/bash
# What checkpointability costs, on a machine with two GPUs: NCCL all_reduce bus bandwidth and
# the DDP step time (scripts/gpu/nccl-cost.py) with NCCL's defaults and with each transport the
# r580 driver restores, and with settings that might be faster; for each of those, whether r580
# restores it (two ranks of ddp-job.py suspended and resumed by cuda-checkpoint-ctl, the job
# finishing with every all_reduce right), as docs/driver-facts.md F13 and F16 did.
#
#   OUT=/tmp/out scripts/gpu/nccl-cost.sh
# Needs .carry (scripts/gpu/pack-carry.sh) in the working tree.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/nccl-cost}
W=/dev/shm/nccl-cost
export PATH="$root/.carry/bin:$PATH"
export PYTHONUNBUFFERED=1 USE_LIBUV=0
mkdir -p "$OUT" "$W"
LOG_FILE=$OUT/nccl-cost.log
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
stamp "$here/../../.carry/plugins/criu_gpu_plugin.so"

# NAME ENV... (restorable per F13/F16, or a candidate to try)
SETTINGS=(
	"defaults"
	"sockets NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0"
	"sockets-cumem NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
	"shm NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0"
	"sockets-4x4 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_CUMEM_ENABLE=0 NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4"
	"shm-memcpy NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0 NCCL_SHM_USE_CUDA_MEMCPY=1"
	"shm-8ch NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0 NCCL_MIN_NCHANNELS=8"
)
# Tried for restore here: the candidates (the others are F13, F16).
TRY=(sockets-4x4 shm-memcpy shm-8ch)


for s in "${SETTINGS[@]}"; do
	read -r name env <<<"$s"
	log "== $name: $env"
	# shellcheck disable=SC2086
	env NAME="$name" $env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM,NET timeout 120 \
		python3 "$here/nccl-cost.py" --port $((29700 + RANDOM % 200)) >"$W/$name.out" 2>&1
	log "$name: rc=$? transports: $(grep -oE 'via (P2P/[A-Za-z/]+|SHM/[A-Za-z/]+|NET/[A-Za-z0-9/]+)' "$W/$name.out" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
	grep '^{' "$W/$name.out" | tee -a "$OUT/nccl-cost.jsonl" | sed 's/^/  /' | tee -a "$OUT/nccl-cost.log" >/dev/null
done

for name in "${TRY[@]}"; do
	for s in "${SETTINGS[@]}"; do read -r n env <<<"$s"; [ "$n" = "$name" ] && break; done
	log "== does r580 restore $name ($env)?"
	d=$W/try-$name && rm -rf "$d" && mkdir -p "$d"
	# shellcheck disable=SC2086
	env $env setsid python3 "$here/ddp-job.py" --spawn 2 "$d" --steps 300 --sleep 0.02 --ballast 0.25 \
		--port $((29600 + RANDOM % 100)) </dev/null >"$d/stdout" 2>&1 &
	job=$!
	for _ in $(seq 600); do grep -qE '^step 20 ' "$d/rank1.log" 2>/dev/null && break; sleep 0.1; done
	timeout 90 cuda-checkpoint-ctl --suspend --tree "$job" --wait 60 --no-nccl-check >"$d/suspend" 2>&1
	log "$name: suspend rc=$? $(tail -1 "$d/suspend")"
	timeout 90 cuda-checkpoint-ctl --resume --tree "$job" --wait 60 >"$d/resume" 2>&1
	rc=$?
	log "$name: resume rc=$rc $(grep -oE 'FAILED.*' "$d/resume" | head -2 | tr '\n' ' ')"
	ok=0
	for _ in $(seq 600); do [ "$(grep -l '^done' "$d"/rank*.log 2>/dev/null | wc -l)" = 2 ] && { ok=1; break; }; sleep 0.1; done
	if [ $rc = 0 ] && [ $ok = 1 ] && ! grep -q BAD "$d"/rank*.log; then
		log "RESTORES $name: suspended and resumed, the job finished with every all_reduce right"
	else
		log "DOES NOT RESTORE $name: resume rc=$rc, finished=$ok"
	fi
	kill_job "$job"
done
log "done"
