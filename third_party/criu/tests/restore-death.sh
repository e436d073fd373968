#!/bin/bash
# Patch 0015: a restore whose CRIU is SIGKILLed while it traces the restored tasks leaves none of
# them running. kill-app.c (3 processes of 3 threads each, a TCP connection whose two ends wait
# in recv) is dumped once, then restored again and again by CRIU, which kills itself
# (CRIU_KILL_AT, patch 0011) at each of its stages between the moment it traces the tasks and
# the moment it lets them go (they wait at their last system call, before the late hooks such as
# a GPU plugin's and the pre-resume scripts). After each kill no
# process of the tree may be left; at the end the images restore and the tree runs on.
# (Killed before it traces them, CRIU leaves the tasks waiting for it for ever; the project's GPU
# plugin's guardian kills those, which `tests/tests/criu_kill_sweep.rs` shows.)
#
#   sudo third_party/criu/tests/restore-death.sh
# Environment: CRIU (default /usr/local/sbin/criu), BEFORE=1: print the counts without failing
# (for a CRIU without patch 0015).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-/usr/local/sbin/criu}
[ -x "$CRIU" ] || { echo "restore-death: $CRIU missing: run scripts/install-criu.sh" >&2; exit 1; }

# CRIU's own lines from the moment it traces the restored tasks until it detaches them, CRIU
# killed as it logs each (without plugins it lets the tasks go within 200 µs of the first).
POINTS=(
	"was trapped#1" "was trapped#6" "was trapped#12"
	"is going to execute the syscall 15#1" "is going to execute the syscall 15#5"
	"is going to execute the syscall 15#9" "was stopped#1" "was stopped#9"
	"is going to execute the syscall 11#1" "Run late stage hook" "Running pre-resume"
)

work=$(mktemp -d /tmp/restore-death.XXXXXX)
pids=()
stop_app() { # kills what is left of the app (its pids, checked to be ours: the app or a CRIU's fork)
	local p
	for p in "${pids[@]}"; do
		grep -qs "$work/" "/proc/$p/cmdline" && kill -9 "$p" 2>/dev/null
	done
	gone 5 || true
}
# gone SECONDS: none of the app's processes is alive (zombies are dead) within SECONDS
gone() {
	local p st alive
	for _ in $(seq $(($1 * 50))); do
		alive=
		for p in "${pids[@]}"; do
			st=$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null) || st=
			[ -n "$st" ] && [ "$st" != Z ] && alive="$alive $p"
		done
		[ -z "$alive" ] && return 0
		sleep 0.02
	done
	left_pids=$alive
	return 1
}
# free: the app's pids are free again (its zombies reaped), for the next restore
free() {
	local p
	for p in "${pids[@]}"; do
		for _ in $(seq 500); do [ -d "/proc/$p" ] || break; sleep 0.02; done
	done
}
trap 'stop_app; rm -rf "$work"' EXIT
gcc -O2 -pthread -Wall -Werror -o "$work/kill-app" "$here/kill-app.c"

mkdir -p "$work/app" "$work/img"
setsid "$work/kill-app" "$work/app" 3 3 </dev/null >/dev/null 2>&1 &
disown $!
for _ in $(seq 200); do
	[ "$(cat "$work"/app/*.log 2>/dev/null | grep -c '^ready')" = 3 ] && break
	sleep 0.02
done
mapfile -t pids < <(pgrep -f "^$work/kill-app $work/app" | sort -n)
[ "${#pids[@]}" = 3 ] || { echo "restore-death: kill-app did not start" >&2; exit 1; }
# No plugins: CRIU alone (a GPU plugin's guardian would kill what CRIU left).
mkdir -p "$work/no-plugins"
opts=(--tcp-established --network-lock skip -v4 -L "$work/no-plugins")
"$CRIU" dump -t "${pids[0]}" -D "$work/img" -o dump.log "${opts[@]}" ||
	{ echo "restore-death: the dump failed: $(tail -3 "$work/img/dump.log")" >&2; exit 1; }
gone 10 || { echo "restore-death: the dumped tree did not end" >&2; exit 1; }
free

kills=0 left=0 missed=0
for at in "${POINTS[@]}"; do
	# (in a shell of its own, which says "Killed", not this one)
	rc=$( (CRIU_KILL_AT=$at timeout 60 "$CRIU" restore -d -D "$work/img" -o restore.log \
		"${opts[@]}" >/dev/null 2>&1
	echo $?) 2>/dev/null)
	[ -z "${VERBOSE:-}" ] || echo "$at: criu ended with $rc"
	if [ "$rc" != 137 ]; then
		missed=$((missed + 1))
		stop_app
		free
		continue
	fi
	kills=$((kills + 1))
	if ! gone 2; then
		left=$((left + 1))
		echo "LEFT at $at: processes$left_pids run on after CRIU died"
		stop_app
	fi
	free
done

# The images restore after all this, and the tree runs on.
"$CRIU" restore -d -D "$work/img" -o restore.log "${opts[@]}" ||
	{ echo "FAIL restore-death: the last restore failed: $(tail -3 "$work/img/restore.log")" >&2; exit 1; }
oks() { cat "$work"/app/*.log | grep -c '^ok' || true; }
n=$(oks)
for _ in $(seq 200); do
	[ "$(oks)" -ge $((n + 6)) ] && break
	sleep 0.02
done
runs=1
[ "$(oks)" -ge $((n + 6)) ] || runs=0
grep -h '^MISMATCH\|^ERROR' "$work"/app/*.log && runs=0

echo "restore-death: $CRIU killed $kills times while it traced the restored tasks, $left times" \
	"processes of the tree were left running ($missed instants not reached); the last restore" \
	"$([ $runs = 1 ] && echo runs || echo does not run)"
[ -n "${BEFORE:-}" ] && exit 0
if [ $left != 0 ] || [ $kills -lt 10 ] || [ $runs != 1 ]; then
	echo "FAIL restore-death" >&2
	exit 1
fi
echo "PASS restore-death"
