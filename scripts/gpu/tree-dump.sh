#!/bin/bash
# A tree of N processes of MIB MiB each (scripts/gpu/tree-mem.py) dumped and restored by each CRIU
# build named, ROUNDS times, the builds alternated; every restore's data is checked. Measures the
# page phase of a tree's dump (CRIU patch 0006) without a GPU.
#   scripts/gpu/tree-dump.sh N MIB ROUNDS CRIU...     # e.g. 4 3072 3 criu-tasks criu
# Images in /dev/shm/tree-dump.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
N=$1 MIB=$2 ROUNDS=$3
shift 3
IMG=/dev/shm/tree-dump T=/tmp/tree-dump
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
stamp "$here/../../.carry/plugins/criu_gpu_plugin.so"

one() { # one CRIU
	local c=$1 root pids t0 rc p
	rm -rf "$IMG" "$T".* && mkdir -p "$IMG"
	setsid python3 "$here/tree-mem.py" "$N" "$MIB" "$T" </dev/null >/dev/null 2>&1 &
	root=$!
	for _ in $(seq 600); do [ "$(find /tmp -maxdepth 1 -name 'tree-dump.[0-9]*' ! -name '*.res' | wc -l)" = "$N" ] && break; sleep 0.2; done
	pids="$root $(cat /proc/"$root"/task/*/children)"
	t0=$(date +%s.%N)
	"$c" dump -t "$root" -D "$IMG" -o dump.log -v4 --display-stats >"$IMG/stats.out" 2>&1
	rc=$?
	echo "$c: dump rc=$rc in $(since "$t0") s; $(grep 'Memory dump time' "$IMG/stats.out")"
	grep -E 'Error \(' "$IMG/dump.log" | grep -v RLIMIT | head -3
	wait "$root" 2>/dev/null
	for p in $pids; do for _ in $(seq 100); do [ -d "/proc/$p" ] || break; sleep 0.1; done; done
	"$c" restore -D "$IMG" -o restore.log -d
	rc=$?
	echo "$c: restore rc=$rc"
	grep -E 'Error \(' "$IMG/restore.log" | grep -v RLIMIT | head -3
	touch "$T.check"
	for _ in $(seq 300); do [ "$(cat "$T".*.res 2>/dev/null | wc -l)" = "$N" ] && break; sleep 0.2; done
	echo "$c: data: $(cat "$T".*.res 2>/dev/null | sort | uniq -c | tr -s ' \n' ' ')"
	# shellcheck disable=SC2086 # a list of pids
	kill -9 $pids 2>/dev/null
}

for r in $(seq "$ROUNDS"); do
	echo "== round $r"
	for c in "$@"; do one "$c"; done
done
rm -rf "$IMG" "$T".*
