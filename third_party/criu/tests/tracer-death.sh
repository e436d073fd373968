#!/bin/bash
# Patches 0009 and 0010: CRIU SIGKILLed at any stage of its parasite leaves the dumped tree
# running its own code with its data. kill-app.c (3 processes of 3 threads each, every signal's
# action the default one, a TCP connection whose two ends wait in recv) is dumped again and again
# by the patched CRIU (--leave-running and plain dumps in turn), which kills itself at each
# stage (CRIU_KILL_AT, patch 0011): the Nth line of its log holding the stage's text, then a
# short delay. After each kill every process must be alive, hold the descriptors it held, and
# go on checking its data and talking over its connection. A plain dump killed once it began to
# end the tree ("Dumped tasks now die with criu": the images are complete) must leave none of it
# running (the kernel ends the tree with criu): the tree is started again. Parasite memory left
# in a process (a mapping nothing uses, and killed between the two calls that map it, its
# memfd's descriptor) is counted and printed.
#
# One instant is lost by design, and counted apart: the few microseconds in which criu holds a
# socket in TCP repair mode to read its state (patch 0010: from "Turning repair on" to "Repair
# off"). Killed then, criu leaves the socket in repair mode and its task's next recv() fails
# with EPERM (send() with EINVAL) before anything else can take it out: the tracer's death
# resumes the task. A loss counts as such only if criu's log ends inside that window and a
# process's log shows that error; any other loss fails the test.
#
#   sudo third_party/criu/tests/tracer-death.sh
# Environment: CRIU (default /usr/local/sbin/criu), DELAYS (µs after the line, "0 50 400"),
# BEFORE=1: print the counts without failing (for a CRIU without patches 0009 and 0010).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-/usr/local/sbin/criu}
DELAYS=${DELAYS:-0 50 400}
[ -x "$CRIU" ] || { echo "tracer-death: $CRIU missing: run scripts/install-criu.sh" >&2; exit 1; }

STAGES=(
	"Seized task"
	"Set up parasite blob"
	"Putting parasite blob"
	"Putting tsock"
	"switched to daemon mode"
	"Dumping pages"
	"Dumping core (pid"
	"Dumping core for thread"
	"Dumping general registers for"
	"Waiting for"
	"exited trapping"
	"Sent msg to daemon 3 "
	"is going to execute the syscall 15"
	"was stopped"
	"Dumping mm"
	"Turning repair on"
	"Repair off for socket"
	"Writing image inventory"
)

work=$(mktemp -d /tmp/tracer-death.XXXXXX)
pids=()
stop_app() { # kills what is left of the app (its pids, checked to be ours)
	local p
	for p in "${pids[@]}"; do
		grep -qs "$work/app" "/proc/$p/cmdline" && kill -9 "$p" 2>/dev/null
	done
	for p in "${pids[@]}"; do
		for _ in $(seq 100); do [ -d "/proc/$p" ] || break; sleep 0.02; done
	done
	pids=()
}
trap 'stop_app; rm -rf "$work"' EXIT
gcc -O2 -pthread -Wall -Werror -o "$work/kill-app" "$here/kill-app.c"

start_app() {
	rm -rf "$work/app" && mkdir -p "$work/app"
	setsid "$work/kill-app" "$work/app" 3 3 </dev/null >/dev/null 2>&1 &
	disown $!
	for _ in $(seq 200); do
		[ "$(cat "$work"/app/*.log 2>/dev/null | grep -c '^ready')" = 3 ] && break
		sleep 0.02
	done
	mapfile -t pids < <(pgrep -f "^$work/kill-app $work/app" | sort -n)
	[ "${#pids[@]}" = 3 ] || { echo "tracer-death: kill-app did not start" >&2; exit 1; }
	fds=()
	for p in "${pids[@]}"; do fds+=("$(own_fds "$p")"); done
}

# own_fds PID: what PID's descriptors are, but parasite leftovers (leftovers below) and its log,
# which the app opens for each line it writes
own_fds() {
	find "/proc/$1/fd" -mindepth 1 -printf '%l\n' | grep -v "CRIUMFD\|^$work/app/" | sort | paste -sd' '
}

# lives: every process is alive, holds as many descriptors as it did, has no error in its log,
# and logs two more checks of its data.
lives() {
	local i p st now n=() ok
	for i in "${!pids[@]}"; do
		p=${pids[$i]}
		st=$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null) || st=
		if [ -z "$st" ] || [ "$st" = Z ]; then why="process $p is gone"; return 1; fi
		n+=("$(grep -c '^ok' "$work/app/$p.log")")
	done
	for _ in $(seq 200); do
		ok=1
		for i in "${!pids[@]}"; do
			[ "$(grep -c '^ok' "$work/app/${pids[$i]}.log")" -ge $((n[i] + 2)) ] || ok=0
		done
		[ $ok = 1 ] && break
		sleep 0.02
	done
	if grep -h '^MISMATCH\|^ERROR' "$work"/app/*.log; then why="an error"; return 1; fi
	[ $ok = 1 ] || { why="a process stopped"; return 1; }
	for i in "${!pids[@]}"; do
		now=$(own_fds "${pids[$i]}")
		if [ "$now" != "${fds[$i]}" ]; then
			why="process ${pids[$i]} holds other descriptors: [$now], where it held [${fds[$i]}]"
			return 1
		fi
	done
}

# tree_ended: no process of the app is left (within 2 s)
tree_ended() {
	local p running
	for _ in $(seq 100); do
		running=0
		for p in "${pids[@]}"; do
			[ "$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null || echo Z)" = Z ] || running=1
		done
		[ $running = 0 ] && return 0
		sleep 0.02
	done
	return 1
}

# in_repair_window: criu's own log ends between "Turning repair on" and "Repair off" for a
# socket, and a process failed on a socket in repair mode (recv EPERM, send EINVAL).
in_repair_window() {
	grep -v '^pie: ' "$work/img/dump.log" | tail -1 | grep -q 'tcp: .Turning repair on for socket' &&
		grep -qh '^ERROR tcp recv: Operation not permitted\|^ERROR tcp send: Invalid argument' \
			"$work"/app/*.log
}

leftovers() { # the parasite's mappings and memfd descriptors in the app's processes
	local p found=0
	for p in "${pids[@]}"; do
		found=$((found + $(cat "/proc/$p/maps" <(find "/proc/$p/fd" -mindepth 1 -printf '%l\n') 2>/dev/null |
			grep -c CRIUMFD || true)))
	done
	echo $found
}

start_app
kills=0 survivors=0 missed=0 left=0 in_window=0 lost=()
i=0
for stage in "${STAGES[@]}"; do
	for nth in 1 3; do
		for delay in $DELAYS; do
			i=$((i + 1))
			at="$stage#$nth+$delay"
			mode=(--leave-running)
			[ $((i % 3)) = 0 ] && mode=()
			before=$(leftovers)
			rm -rf "$work/img" && mkdir -p "$work/img"
			# (in a shell of its own, which says "Killed", not this one)
			rc=$( (CRIU_KILL_AT=$at timeout 60 "$CRIU" dump -t "${pids[0]}" -D "$work/img" -v4 \
				-o dump.log --tcp-established --network-lock skip "${mode[@]}" >/dev/null 2>&1
			echo $?) 2>/dev/null)
			if [ "$rc" != 137 ]; then
				missed=$((missed + 1))
				[ "$rc" = 0 ] && [ ${#mode[@]} = 0 ] && { stop_app; start_app; }
				continue
			fi
			kills=$((kills + 1))
			if lives; then
				survivors=$((survivors + 1))
				if [ "$(leftovers)" -gt "$before" ]; then
					left=$((left + 1))
					[ -z "${VERBOSE:-}" ] || echo "parasite memory left at $at (${mode[*]:-dump})"
				fi
			elif [ ${#mode[@]} = 0 ] && grep -q 'Dumped tasks now die with criu' "$work/img/dump.log"; then
				# killed once it began to end the dumped tree: all of it ends
				if tree_ended; then
					survivors=$((survivors + 1))
				else
					lost+=("$at (dump): a process of the dumped tree runs on")
					echo "LOST at $at (dump): a process of the dumped tree runs on"
				fi
				stop_app
				start_app
			elif in_repair_window; then
				in_window=$((in_window + 1))
				echo "killed in a socket's repair window at $at (${mode[*]:-dump}): $why"
				stop_app
				start_app
			else
				lost+=("$at (${mode[*]:-dump}): $why")
				echo "LOST at $at (${mode[*]:-dump}): $why; CRIU's log ends: $(tail -1 "$work/img/dump.log")"
				stop_app
				start_app
			fi
		done
	done
done
echo "tracer-death: $CRIU killed $kills times, $survivors times the tree lived on" \
	"($missed instants not reached; $left kills left parasite memory in a process;" \
	"$in_window kills in a socket's repair window)"
[ -n "${BEFORE:-}" ] && exit 0
if [ ${#lost[@]} != 0 ] || [ $kills != $((survivors + in_window)) ] || [ $kills -lt 50 ]; then
	echo "FAIL tracer-death: ${#lost[@]} lost" >&2
	exit 1
fi
echo "PASS tracer-death"
