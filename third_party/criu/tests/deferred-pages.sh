#!/bin/bash
# Patch 0007 (deferred pages) with real CRIU and no GPU: a test plugin (defer-plugin.c) stands in
# for a GPU plugin, asks criu at restore to let the data of a mem-app arrive while the restore
# goes on, and reads all of it in RESUME_DEVICES_LATE as a GPU driver's restore reads its
# checkpoint data. Each restore is checked word for word (and in a forked child), and:
#   deferred       the data arrived after the restorer (the log says how much), the late reader
#                  saw exactly the data the application holds, and the application's mappings
#                  are those it had before the dump (the kernel merged back what userfaultfd split)
#   late           the fill held until the first fault (fault injection): the late reader's pages arrive
#                  through faults served at once, before the fill reached them
#   one thread     --page-io-threads 1 restores as stock CRIU: nothing deferred
#   failed fill    putting a page in place fails (fault injection): the restore fails naming the
#                  task and the page, kills what it restored, and the same images restore after
#
#   sudo third_party/criu/tests/deferred-pages.sh
# Environment: CRIU (patched, default /usr/local/sbin/criu), CRIU_INCLUDE (its criu-plugin.h,
# default PREFIX/include/criu), IMAGES (default /dev/shm).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-/usr/local/sbin/criu}
IMAGES=${IMAGES:-/dev/shm}
[ -x "$CRIU" ] || { echo "deferred-pages: $CRIU missing: run scripts/install-criu.sh" >&2; exit 1; }
include=${CRIU_INCLUDE:-$(cd "$(dirname "$CRIU")/.." && pwd)/include/criu}
[ -e "$include/criu-plugin.h" ] || { echo "deferred-pages: no $include/criu-plugin.h" >&2; exit 1; }

work=$(mktemp -d /tmp/deferred-pages.XXXXXX)
img=$(mktemp -d "$IMAGES/deferred-pages.XXXXXX")
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	[ -n "${KEEP:-}" ] || rm -rf "$work" "$img"
}
trap cleanup EXIT
mkdir -p "$work/plugins"
gcc -O2 -Wall -o "$work/mem-app" "$here/mem-app.c"
gcc -O2 -Wall -Werror -shared -fPIC -I"$include" -o "$work/plugins/defer-plugin.so" "$here/defer-plugin.c" -ldl
criu=("$CRIU" --lib "$work/plugins" --page-io-threads 4)

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
wait_line() { # wait_line FILE REGEX: at most 60 s
	for _ in $(seq 600); do
		grep -qE "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "  no /$2/ in $1 after 60 s" >&2
	return 1
}
gone() { # gone PID...: at most 10 s
	local p
	for _ in $(seq 200); do
		for p in "$@"; do
			[ -d "/proc/$p" ] && { sleep 0.05; continue 2; }
		done
		return 0
	done
	return 1
}

setsid "$work/mem-app" 0.5 21 "$work/a.status" </dev/null >/dev/null 2>&1 &
app=$!
disown "$app"
pids=("$app")
wait_line "$work/a.status" '^ready'
addr=$(sed -n 's/^ready .*addr=0x\([0-9a-f]*\).*/\1/p' "$work/a.status")
bytes=$((512 << 20))
range=$(printf '%d:%x-%x' "$app" "$((16#$addr))" "$((16#$addr + bytes))")
step=0

# data_ok: the application finds its data intact (and advances it), and so does a forked child.
data_ok() {
	kill -USR1 "$app" 2>/dev/null || return 1
	wait_line "$work/a.status" "^verified step=$step " || return 1
	grep -q "^verified step=$step mismatches=0 " "$work/a.status" || return 1
	kill -USR2 "$app" 2>/dev/null || return 1
	wait_line "$work/a.status" "^forked-child step=$((step + 1)) " || return 1
	grep -q "^forked-child step=$((step + 1)) mismatches=0" "$work/a.status" || return 1
	step=$((step + 1))
}
sum_now() { sed -n "s/^verified step=$((step - 1)) .* sum=\([0-9a-f]*\)$/\1/p" "$work/a.status"; }
maps() { awk '{ print $1, $2, $6 }' "/proc/$app/maps"; }

check "the application starts with its data intact" data_ok

# round NAME [ENV...]: dump, restore with the test plugin asking for deferral.
round() {
	local name=$1 dir="$img/$1"
	shift
	mkdir -p "$dir"
	: >"$work/$name.late"
	maps >"$work/$name.maps-before"
	sum=$(sum_now)
	check "$name: dump" "${criu[@]}" dump -t "$app" -D "$dir" -v4 -o dump.log
	check "$name: the application is gone after the dump" gone "$app"
	check "$name: restore" env DEFER_PAGES="$range" DEFER_LOG="$work/$name.late" "$@" \
		"${criu[@]}" restore -D "$dir" -d -v4 -o restore.log
	maps >"$work/$name.maps-after" 2>/dev/null || true
	check "$name: data intact, in the application and in a forked child" data_ok
}

round deferred
check "deferred: the restore left all 512 MiB out of its reads" \
	grep -q 'nr_deferred: *131072 (0.50 GiB arrive after the restorer)' "$img/deferred/restore.log"
check "deferred: criu put them in place while the restore went on" \
	grep -qE 'deferred-pages: 0\.50 GiB of 1 task\(s\) in place .* s after the fill started' "$img/deferred/restore.log"
check "deferred: the late reader read all of them, and saw the application's data" \
	grep -q "^late pid=$app bytes=$bytes sum=$sum\$" "$work/deferred.late"
check "deferred: the application's mappings are those it had before the dump" \
	cmp "$work/deferred.maps-before" "$work/deferred.maps-after"
grep -hE 'deferred-pages:|nr_deferred' "$img/deferred/restore.log" | sed 's/^/    /'

round late CRIU_FAULT=139
faults=$(sed -nE 's/.*deferred-pages: .* ([0-9]+) fault\(s\) served first.*/\1/p' "$img/late/restore.log")
check "late: the late reader's pages came through faults served at once ($faults)" test "${faults:-0}" -gt 0
# "in place T s after the fill started ... the late hooks started H s into the fill": H < T
ended_after_hooks() {
	sed -nE 's/.*in place ([0-9.]+) s after the fill started.* the late hooks started ([0-9.-]+) s into the fill.*/\2 \1/p' \
		"$img/late/restore.log" | awk 'NR == 1 { found = 1; ok = ($1 >= 0 && $1 < $2) } END { exit !(found && ok) }'
}
check "late: the late hooks ran before the fill ended" ended_after_hooks
check "late: the late reader saw the application's data" \
	grep -q "^late pid=$app bytes=$bytes sum=$sum\$" "$work/late.late"
grep -hE 'deferred-pages:' "$img/late/restore.log" | sed 's/^/    /'

criu=("$CRIU" --lib "$work/plugins" --page-io-threads 1)
round one-thread
check "one thread: nothing deferred, as stock CRIU restores" \
	grep -q 'pages restored before the late hooks: --page-io-threads 1' "$img/one-thread/restore.log"
check "one thread: no page left out" bash -c "! grep -q nr_deferred '$img/one-thread/restore.log'"
criu=("$CRIU" --lib "$work/plugins" --page-io-threads 4)

# A fill that fails (fault injection: the first page copy answers EIO).
round_fails() {
	local dir=$img/fails
	mkdir -p "$dir"
	check "failed fill: dump" "${criu[@]}" dump -t "$app" -D "$dir" -v4 -o dump.log
	check "failed fill: the application is gone after the dump" gone "$app"
	if DEFER_PAGES="$range" CRIU_FAULT=140 "${criu[@]}" restore -D "$dir" -d -v4 -o restore.log; then
		check "failed fill: the restore fails" false
	else
		check "failed fill: the restore fails" true
	fi
	check "failed fill: the error names the task and the page" \
		grep -qE "deferred-pages: can't put page [0-9a-f]+ of task $app in place: Input/output error" \
		"$dir/restore.log"
	check "failed fill: nothing of the restore is left running" gone "$app"
	check "failed fill: the same images restore afterwards" \
		env DEFER_PAGES="$range" "${criu[@]}" restore -D "$dir" -d -v4 -o restore-2.log
	check "failed fill: data intact after the retry" data_ok
}
round_fails

echo "deferred-pages: $passed passed, $failed failed"
[ "$failed" = 0 ]
