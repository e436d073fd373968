#!/bin/bash
# Patch 0003 in a pid namespace: a task being restored reads its pages with threads of its own,
# before it forks its children and before its restorer creates its threads with the numbers
# they had. Those threads must take numbers the tree never asks for: a thread's number is free
# again only some time after the thread is gone (the kernel flushes its /proc entries first, and
# may reschedule there), and when the first one took 2 in the fresh namespace, the fork of task
# 2 or the clone3() of thread 2 failed with EEXIST, now and then: while something reads
# /proc/PID/task (ps, top, a monitoring agent), 15% of the restores of a threaded init and 70%
# of those of an init with a child failed on this 2-CPU VM. Real CRIU dumps, once each, two
# trees that are the init of their own pid namespace, with 256 MiB of data:
#   threads   the init and 2 threads (numbers 2 and 3)
#   child     the init, a child forked first (2) and 2 threads (3 and 4)
# and restores each RESTORES (30) times with 2 page I/O threads while a loop reads
# /proc/*/task/*/stat; every restore must succeed, the restored tree must have its threads, its
# child and its data word for word, and the log must say that the page I/O threads were
# numbered above every number of the tree.
#
#   sudo third_party/criu/tests/pidns-page-threads.sh
# Environment: CRIU (patched, default /usr/local/sbin/criu), IMAGES (default /dev/shm),
# RESTORES (default 30).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-/usr/local/sbin/criu}
IMAGES=${IMAGES:-/dev/shm}
RESTORES=${RESTORES:-30}
[ -x "$CRIU" ] || { echo "pidns-page-threads: $CRIU missing: run scripts/install-criu.sh" >&2; exit 1; }

work=$(mktemp -d /tmp/pidns-page-threads.XXXXXX)
img=$(mktemp -d "$IMAGES/pidns-page-threads.XXXXXX")
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	[ -n "${KEEP:-}" ] || rm -rf "$work" "$img"
}
trap cleanup EXIT
gcc -O2 -Wall -Werror -pthread -o "$work/pidns-app" "$here/pidns-app.c"

passed=0
failed=0
check() { # check DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@"; then
		passed=$((passed + 1))
		echo "PASS $what"
	else
		failed=$((failed + 1))
		echo "FAIL $what"
	fi
}

# wait_line FILE REGEX: waits (at most 30 s) for a line of FILE to match.
wait_line() {
	for _ in $(seq 300); do
		grep -qE "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "  no /$2/ in $1 after 30 s" >&2
	return 1
}

gone() { # gone PID: waits (at most 10 s) until the process has gone
	for _ in $(seq 200); do [ -d "/proc/$1" ] || return 0; sleep 0.05; done
	return 1
}

# What makes an exiting thread reschedule before its number is free: its /proc entries exist.
bash -c 'while :; do cat /proc/[0-9]*/task/*/stat >/dev/null 2>&1; done' &
pids+=("$!")
disown "$!"

# numbered_above LOG: the restore's page I/O threads took numbers above every number of the tree
numbered_above() {
	local above last
	read -r above last < <(sed -n 's/.*page I\/O threads numbered above \([0-9]*\) (the tree.s end at \([0-9]*\)).*/\1 \2/p' "$1" | head -1)
	[ -n "$above" ] && [ "$above" -ge "$last" ]
}

# run_tree NAME THREADS [--with-child]: dumps the tree once and restores it RESTORES times.
run_tree() {
	local name=$1 threads=$2 dir=$img/$1 status=$work/$1.status unshare init ok=0 i pid first_error=
	local want_child=0 verified=0
	[ "${3:-}" = --with-child ] && want_child=1
	mkdir -p "$dir"
	unshare --pid --fork setsid "$work/pidns-app" 256 "$threads" "$status" "${@:3}" </dev/null >/dev/null 2>&1 &
	unshare=$!
	pids+=("$unshare")
	wait_line "$status" '^ready pid=1$'
	init=$(cat "/proc/$unshare/task/$unshare/children")
	"$CRIU" dump -t "$init" -D "$dir" -v4 -o dump.log
	check "$name: dumped" gone "$init"
	for i in $(seq "$RESTORES"); do
		rm -f "$dir/pidfile"
		if ! "$CRIU" restore -D "$dir" -d --page-io-threads 2 -v4 -o "restore-$i.log" --pidfile "$dir/pidfile"; then
			[ -n "$first_error" ] || first_error=$(grep 'Error' "$dir/restore-$i.log" | grep -vm1 RLIMIT_NOFILE || true)
			continue
		fi
		pid=$(cat "$dir/pidfile")
		pids+=("$pid")
		: >"$status"
		kill -USR1 "$pid"
		wait_line "$status" '^verified' || true
		if grep -qx "verified mismatches=0 threads=$((threads + 1)) child=$want_child" "$status"; then
			verified=$((verified + 1))
		fi
		numbered_above "$dir/restore-$i.log" && ok=$((ok + 1))
		kill -9 "$pid"
		gone "$pid" || true
	done
	[ -z "$first_error" ] || echo "  first failure: $first_error"
	check "$name: $verified of $RESTORES restores have their threads, child and data" test "$verified" = "$RESTORES"
	check "$name: the page I/O threads were numbered above the tree's numbers ($ok of $RESTORES)" \
		test "$ok" = "$RESTORES"
	check "$name: the pages were read with 2 threads" grep -q 'pages: pid 1: read .* 2 threads' "$dir/restore-1.log"
}

run_tree threads 2
run_tree child 2 --with-child

echo "pidns-page-threads: $passed passed, $failed failed"
[ "$failed" = 0 ]
