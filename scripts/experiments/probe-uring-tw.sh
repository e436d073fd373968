#!/bin/bash
# Two facts for distributed jobs, measured on a GPU machine (one GPU is enough):
#  tw:       the kernel destroys TIME_WAIT sockets through sock_diag (CRIU patch 0005 relies on it):
#            a listener without SO_REUSEADDR whose port a TIME_WAIT socket holds is dumped and
#            restored by stock CRIU (expected to fail) and by the project's CRIU (expected to pass).
#  torchrun: which processes of a torchrun job hold an io_uring, under which launch settings, and
#            where the installed PyTorch makes its TCPStore servers.
# Needs .carry (scripts/gpu/pack-carry.sh). Results under $OUT (default /tmp/probe-out).
#   scripts/experiments/probe-uring-tw.sh [PARTS]    # PARTS default: "tw torchrun"
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PATH=$root/.carry/bin:$PATH
OUT=${OUT:-/tmp/probe-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/probe.XXXXXX)
PARTS=${1:-"tw torchrun"}
log() { printf '%s\n' "$*" | tee -a "$OUT/probe.log"; }

part_tw() {
	log "== tw: kernel $(uname -r)"
	cat >"$W/tw.py" <<'PY'
import socket, sys, time
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(8)
port = l.getsockname()[1]
c = socket.create_connection(("127.0.0.1", port)); s, _ = l.accept()
s.close(); time.sleep(0.2); c.close()
open(sys.argv[1], "w").write(str(port))
while True:
    time.sleep(0.5)
PY
	local crit pid port rc
	for crit in criu-stock criu; do
		rm -rf "$W/img-$crit" && mkdir -p "$W/img-$crit"
		setsid python3 "$W/tw.py" "$W/port" </dev/null >/dev/null 2>&1 &
		sleep 1
		pid=$!
		port=$(cat "$W/port")
		log "$crit: listener pid $pid port $port; TIME_WAIT on it: $(grep -c ":$(printf '%04X' "$port") [0-9A-F:]* 06" /proc/net/tcp)"
		timeout 60 "$crit" dump -t "$pid" -D "$W/img-$crit" -o dump.log -v4 || log "$crit: dump failed"
		rc=0
		timeout 60 "$crit" restore -D "$W/img-$crit" -o restore.log -v4 -d || rc=$?
		log "$crit: restore rc=$rc; $(grep -hE 'TIME_WAIT|Can.t bind' "$W/img-$crit/restore.log" | tail -2 | tr '\n' ' ')"
		if [ $rc = 0 ] && python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), timeout=5)"; then
			log "$crit: the restored listener accepts on port $port"
		fi
		pkill -9 -f "$W/tw.py"
		cp "$W/img-$crit/restore.log" "$OUT/tw-$crit-restore.log" 2>/dev/null
		sleep 0.5
	done
}

# uring_of PID: the io_uring fds of a process, as "PID(comm): N".
uring_of() { echo "$1($(cat /proc/"$1"/comm 2>/dev/null)): $(find /proc/"$1"/fd -lname '*io_uring*' 2>/dev/null | wc -l)"; }
tree_of() {
	local p c
	for p in "$@"; do
		echo "$p"
		while read -r c; do [ -n "$c" ] && tree_of "$c"; done < <(cat /proc/"$p"/task/*/children 2>/dev/null | tr ' ' '\n')
	done
}

part_torchrun() {
	local torch
	torch=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__), torch.__version__)' 2>&1)
	log "== torchrun: torch at $torch"
	local tdir=${torch%% *}
	grep -rn "TCPStore(\|use_libuv" "$tdir/distributed/elastic" "$tdir/distributed/rendezvous.py" 2>/dev/null |
		grep -v "^\s*#" | head -40 >"$OUT/torch-tcpstore-sites.txt"
	log "$(wc -l <"$OUT/torch-tcpstore-sites.txt") TCPStore/use_libuv sites in torch.distributed (torch-tcpstore-sites.txt)"
	local f
	for f in elastic/rendezvous/dynamic_rendezvous.py:1105,1140 elastic/rendezvous/static_tcp_rendezvous.py:55,80 \
		elastic/rendezvous/c10d_rendezvous_backend.py:140,170; do
		echo "--- ${f%%:*}" >>"$OUT/torch-tcpstore-sites.txt"
		sed -n "${f#*:}p" "$tdir/distributed/${f%%:*}" >>"$OUT/torch-tcpstore-sites.txt"
	done
	grep -rn "TORCH_DISABLE_SHARE_RDZV_TCP_STORE\|def use_agent_store" "$tdir/distributed/elastic" >>"$OUT/torch-tcpstore-sites.txt"
	# A TCPStore server alone, in a plain Python process: rings per setting.
	local v
	for v in "1|" "0|" "1|UV_USE_IO_URING=0"; do
		# shellcheck disable=SC2086 # an env list
		env ${v#*|} python3 -c "
import os, torch.distributed as d
s = d.TCPStore('127.0.0.1', 0, is_master=True, use_libuv=${v%%|*} == 1)
fds = []
for f in os.listdir('/proc/self/fd'):
    try:
        if 'io_uring' in os.readlink('/proc/self/fd/' + f):
            fds.append(f)
    except OSError:  # the fd listdir itself held
        pass
print('TCPStore use_libuv=${v%%|*} ${v#*|}: io_uring fds', len(fds))" 2>&1 | tail -1 | tee -a "$OUT/probe.log"
	done
	cat >"$W/worker.py" <<'PY'
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(60)
PY
	local name args envs agent
	while IFS='|' read -r name envs args; do
		[ -n "$name" ] || continue
		rm -f "$W/ready"
		# shellcheck disable=SC2086 # envs and args are word lists
		env $envs setsid torchrun $args "$W/worker.py" "$W/ready" </dev/null >"$OUT/torchrun-$name.out" 2>&1 &
		agent=$!
		for _ in $(seq 150); do [ -s "$W/ready" ] && break; sleep 0.2; done
		sleep 1
		if [ -s "$W/ready" ]; then
			log "$name [$envs $args]: $(for p in $(tree_of "$agent"); do printf '%s; ' "$(uring_of "$p")"; done)"
		else
			log "$name: the worker never became ready: $(tail -2 "$OUT/torchrun-$name.out" | tr '\n' ' ')"
		fi
		kill -9 -- -"$agent" 2>/dev/null
		sleep 1
	done <<LIST
standalone||--standalone --nproc-per-node 1
standalone-conf||--standalone --nproc-per-node 1 --rdzv-conf use_libuv=0
standalone-env|USE_LIBUV=0 UV_USE_IO_URING=0|--standalone --nproc-per-node 1 --rdzv-conf use_libuv=0
c10d-endpoint|USE_LIBUV=0|--nnodes 1 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29611 --rdzv-conf use_libuv=0
static|USE_LIBUV=0|--nnodes 1 --node-rank 0 --nproc-per-node 1 --rdzv-backend static --master-addr 127.0.0.1 --master-port 29612
static-conf|USE_LIBUV=0|--nnodes 1 --node-rank 0 --nproc-per-node 1 --rdzv-backend static --master-addr 127.0.0.1 --master-port 29613 --rdzv-conf use_libuv=0
noshare|USE_LIBUV=0 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1|--standalone --nproc-per-node 1 --rdzv-conf use_libuv=0
noshare-uv|USE_LIBUV=0 UV_USE_IO_URING=0 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1|--standalone --nproc-per-node 1 --rdzv-conf use_libuv=0
static-noshare|USE_LIBUV=0 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1|--nnodes 1 --node-rank 0 --nproc-per-node 1 --rdzv-backend static --master-addr 127.0.0.1 --master-port 29614
LIST
}

for p in $PARTS; do "part_$p"; done
rm -rf "$W"
