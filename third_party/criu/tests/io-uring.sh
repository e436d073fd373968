#!/bin/bash
# Patch 0008 (io_uring) with real CRIU: a libuv-like event loop (uring-app.c: an epoll-control
# ring without SQ array, a file ring reading a file and a pipe and running no-ops, a registered
# eventfd) serves requests on a unix socket before a dump and after the restore:
#   plain        dumped, restored, every request answered, its counters going on from the dumped
#                values, the eventfd counting the file ring's completions, the rings mapped at
#                their addresses again
#   sqpoll       the same with the file ring's SQ thread (libuv 1.45-1.48)
#   counters     the file ring at SQ head 3005000 and CQ tail 1005000 (no-ops without CQEs,
#                messages from a helper ring): restored to the same values (the time it took is
#                printed)
#   pending      a read of an empty pipe in flight on the file ring: the dump is refused, naming
#                the pid and the fd, and the process runs on
#   stock        stock 4.2.1 refuses a ring ("Unknown shit")
#   symbol       the patched criu exports criu_dumps_io_uring(), and `criu check --feature
#                io_uring` passes
#
#   sudo third_party/criu/tests/io-uring.sh
# Environment: CRIU (patched, default /usr/local/sbin/criu), CRIU_STOCK (default
# PREFIX/lib/criu-gpu/stock/criu), IMAGES (default /dev/shm).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-/usr/local/sbin/criu}
prefix=$(cd "$(dirname "$CRIU")/.." && pwd)
CRIU_STOCK=${CRIU_STOCK:-$prefix/lib/criu-gpu/stock/criu}
IMAGES=${IMAGES:-/dev/shm}
for c in "$CRIU" "$CRIU_STOCK"; do
	[ -x "$c" ] || { echo "io-uring: $c missing: run scripts/install-criu.sh" >&2; exit 1; }
done

work=$(mktemp -d /tmp/io-uring.XXXXXX)
img=$(mktemp -d "$IMAGES/io-uring.XXXXXX")
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	[ -n "${KEEP:-}" ] || rm -rf "$work" "$img"
}
trap cleanup EXIT
gcc -O2 -Wall -Werror -o "$work/uring-app" "$here/uring-app.c"
echo "data for the io_uring test" >"$work/data"

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
wait_line() { # wait_line FILE REGEX: at most 120 s
	for _ in $(seq 1200); do
		grep -qE "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "  no /$2/ in $1 after 120 s" >&2
	return 1
}
gone() { # gone PID: at most 20 s
	for _ in $(seq 400); do
		[ -d "/proc/$1" ] || return 0
		sleep 0.05
	done
	return 1
}

# start NAME OPTIONS...: an app serving on $work/NAME.sock; sets app.
start() {
	local name=$1
	shift
	setsid "$work/uring-app" serve "$work/$name.sock" "$work/data" "$@" \
		</dev/null >"$work/$name.out" 2>&1 &
	app=$!
	disown "$app"
	pids+=("$app")
	wait_line "$work/$name.out" '^ready'
}
ask() { "$work/uring-app" ask "$work/$1.sock" "$2"; }
serves() { # serves NAME: every request answered right
	ask "$1" read | grep -q '^read 27 data for the io_uring test$' &&
		ask "$1" pipe | grep -q '^pipe word' &&
		ask "$1" nop | grep -q '^nop 0$'
}
file_counters() { ask "$1" state | awk '{ print $6, $7 }'; }
rings() { awk '/anon_inode:\[io_uring\]/ { print $1, $2, $3 }' "/proc/$1/maps"; }

# round NAME OPTIONS...: serve, dump, restore, serve again.
round() {
	local name=$1 dir="$img/$1" before after
	shift
	mkdir -p "$dir"
	check "$name: the app starts and serves" start "$name" "$@"
	check "$name: requests answered before the dump" serves "$name"
	before=$(file_counters "$name")
	rings "$app" >"$work/$name.rings-before"
	check "$name: dump" "$CRIU" dump -t "$app" -D "$dir" --shell-job -v4 -o dump.log
	check "$name: the app is gone after the dump" gone "$app"
	check "$name: restore" "$CRIU" restore -D "$dir" --shell-job -d -v4 -o restore.log
	after=$(file_counters "$name")
	check "$name: the file ring's SQ head and CQ tail are the dumped ones ($before)" \
		test "$after" = "$before"
	rings "$app" >"$work/$name.rings-after" 2>/dev/null || true
	check "$name: the rings are mapped where they were" \
		cmp -s "$work/$name.rings-before" "$work/$name.rings-after"
	check "$name: requests answered after the restore (file, pipe, no-op, epoll control)" serves "$name"
	check "$name: and again" serves "$name"
}

round plain --eventfd
check "plain: the eventfd was registered again" grep -q 'eventfd fd 9 registered' "$img/plain/restore.log"
round sqpoll --sqpoll --eventfd
check "sqpoll: the restored app has its SQ thread" grep -q '^iou-sqp-' /proc/"$app"/task/*/comm
round counters --skip 3000000 --msg 1000000 --nops 5000
# 3005000 and 1005000, and the three requests served before the dump
check "counters: criu brought the file ring to SQ head 3005003, CQ tail 1005003" \
	grep -q 'counters at SQ head 3005003, CQ tail 1005003 after 3005003 requests' \
	"$img/counters/restore.log"
sed -n 's/.*\(counters at SQ head 3005003.*\)/  restore cost (SQPOLL off): \1/p' "$img/counters/restore.log"

mkdir -p "$img/pending"
check "pending: the app starts with a read in flight" start pending --pending
if "$CRIU" dump -t "$app" -D "$img/pending" --shell-job -v4 -o dump.log 2>/dev/null; then
	check "pending: the dump is refused" false
else
	check "pending: the dump is refused" true
fi
check "pending: the error names the pid, the fd and the request in flight" \
	grep -q "pid $app fd 8: io_uring with 1 request(s) in flight" "$img/pending/dump.log"
check "pending: the app runs on" serves pending

mkdir -p "$img/stock"
check "stock: the app starts" start stock
if "$CRIU_STOCK" dump -t "$app" -D "$img/stock" --shell-job -v4 -o dump.log 2>/dev/null; then
	check "stock: stock 4.2.1 refuses a ring" false
else
	check "stock: stock 4.2.1 refuses a ring" grep -q 'anon_inode:\[io_uring\]' "$img/stock/dump.log"
fi
check "stock: the app runs on" serves stock

check "symbol: criu exports criu_dumps_io_uring" sh -c "nm -D '$CRIU' | grep -q ' T criu_dumps_io_uring$'"
check "symbol: stock criu does not" sh -c "! nm -D '$CRIU_STOCK' | grep -q criu_dumps_io_uring"
check "check: criu check --feature io_uring" "$CRIU" check --feature io_uring

echo "io-uring: $passed passed, $failed failed"
[ "$failed" = 0 ]
