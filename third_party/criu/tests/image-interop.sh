#!/bin/bash
# Images of the project's CRIU and of stock 4.2.1 are interchangeable: the page I/O patches
# (0003, 0004, 0006) change how pages are copied, not the image format. Real CRIU dumps and restores
# a process tree (a shell and two mem-app processes of 256 MiB each, one of them with a child
# forked before its data, all data checked word for word after every restore):
#   patched dump -> stock restore, stock dump -> patched restore, patched -> patched;
# the patched runs use 4 page I/O threads (and must log that they did), and after each restore
# a forked child of each mem-app checks the memory it inherited. Last, the same (stopped) tree
# dumped by both builds gives identical pagemap images and pages images of the same size.
#
#   sudo third_party/criu/tests/image-interop.sh
# Environment: CRIU (patched, default /usr/local/sbin/criu), CRIU_STOCK (default
# /usr/local/lib/criu-gpu/stock/criu), IMAGES (default /dev/shm).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-/usr/local/sbin/criu}
prefix=$(cd "$(dirname "$CRIU")/.." && pwd)
CRIU_STOCK=${CRIU_STOCK:-$prefix/lib/criu-gpu/stock/criu}
IMAGES=${IMAGES:-/dev/shm}
for c in "$CRIU" "$CRIU_STOCK"; do
	[ -x "$c" ] || { echo "image-interop: $c missing: run scripts/install-criu.sh" >&2; exit 1; }
done

work=$(mktemp -d /tmp/image-interop.XXXXXX)
img=$(mktemp -d "$IMAGES/image-interop.XXXXXX")
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	[ -n "${KEEP:-}" ] || rm -rf "$work" "$img"
}
trap cleanup EXIT
mkdir -p "$work/no-plugins"
gcc -O2 -Wall -o "$work/mem-app" "$here/mem-app.c"
# No plugins (an empty --lib directory): this is about CRIU's own page I/O.
patched=("$CRIU" --lib "$work/no-plugins" --page-io-threads 4)
stock=("$CRIU_STOCK" --lib "$work/no-plugins")

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

# wait_line FILE REGEX: waits (at most 60 s) for a line of FILE to match.
wait_line() {
	for _ in $(seq 600); do
		grep -qE "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "  no /$2/ in $1 after 60 s" >&2
	return 1
}

setsid bash -c "'$work/mem-app' 0.25 11 '$work/a.status' --with-child & '$work/mem-app' 0.25 12 '$work/b.status' & wait" \
	</dev/null >/dev/null 2>&1 &
root=$!
disown "$root"
pids=("$root")
wait_line "$work/a.status" '^ready' && wait_line "$work/b.status" '^ready'
apps=("$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$work/a.status")"
	"$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$work/b.status")")
child=$(cat "/proc/${apps[0]}/task/${apps[0]}/children")
pids+=("${apps[@]}" "$child")
step=0

gone() { # gone PID...: waits (at most 10 s) until none of the processes exists
	local p
	for _ in $(seq 200); do
		for p in "$@"; do
			if [ -d "/proc/$p" ]; then
				sleep 0.05
				continue 2
			fi
		done
		return 0
	done
	return 1
}

# data_ok: both mem-apps find their data intact (and advance it), and a forked child of each
# finds the memory it inherited intact.
data_ok() {
	local s app ok=0
	for s in a b; do
		app=${apps[0]}
		[ $s = b ] && app=${apps[1]}
		kill -USR1 "$app" 2>/dev/null || return 1
		wait_line "$work/$s.status" "^verified step=$step " || return 1
		grep -q "^verified step=$step mismatches=0 " "$work/$s.status" || ok=1
		kill -USR2 "$app" 2>/dev/null || return 1
		wait_line "$work/$s.status" "^forked-child step=$((step + 1)) " || return 1
		grep -q "^forked-child step=$((step + 1)) mismatches=0" "$work/$s.status" || ok=1
	done
	step=$((step + 1))
	return $ok
}

# round NAME DUMP_BUILD RESTORE_BUILD: dumps the tree with one build, restores it with the other.
round() {
	local name=$1 dump_build=$2 restore_build=$3 dir="$img/$1"
	local -n dumper=$dump_build restorer=$restore_build
	mkdir -p "$dir"
	check "$name: dump ($dump_build)" "${dumper[@]}" dump -t "$root" -D "$dir" -v4 -o dump.log
	check "$name: the tree is gone after the dump" gone "${pids[@]}"
	check "$name: restore ($restore_build)" "${restorer[@]}" restore -D "$dir" -d -v4 -o restore.log
	check "$name: data intact in both processes and in forked children" data_ok
	check "$name: the child of the first process is back" \
		test "$(cat "/proc/${apps[0]}/task/${apps[0]}/children" 2>/dev/null)" = "$child"
	if [ "$dump_build" = patched ]; then
		# 0006: each task's pages are copied after its dump, by 2 of the 4 threads here
		check "$name: the patched dump copied both processes' pages with several threads while it went on" \
			test "$(grep -cE 'pages: pid [0-9]+: copied 0\.25 GiB .* [2-4] threads, while criu went on' "$dir/dump.log")" = 2
	fi
	if [ "$restore_build" = patched ]; then
		check "$name: the patched restore read pages with 4 threads" \
			grep -qE 'pages: pid [0-9]+: read 0\.25 GiB .* 4 threads' "$dir/restore.log"
	fi
	grep -hE 'pages: pid' "$dir/dump.log" "$dir/restore.log" 2>/dev/null | sed 's/^/    /' || true
}

round patched-to-stock patched stock
round stock-to-patched stock patched
round patched-to-patched patched patched

# The same stopped tree dumped by both builds: identical pagemap images (which pages, where in
# the pages images) and pages images of the same size. (Not byte-identical pages: two stock
# dumps in a row of the same stopped tree sometimes differ in a few bytes too.)
mkdir -p "$img/same-stock" "$img/same-patched"
kill -STOP "$root" "${apps[@]}" "$child" 2>/dev/null || true
check "dump of the stopped tree, stock" \
	"${stock[@]}" dump -t "$root" -D "$img/same-stock" --leave-running -v4 -o dump.log
check "dump of the stopped tree, patched" \
	"${patched[@]}" dump -t "$root" -D "$img/same-patched" --leave-running -v4 -o dump.log
kill -CONT "$root" "${apps[@]}" "$child" 2>/dev/null || true
same_layout() {
	local f other n=0
	for f in "$img/same-stock"/pagemap-*.img "$img/same-stock"/pages-*.img; do
		[ -e "$f" ] || return 1
		other=$img/same-patched/$(basename "$f")
		case $f in
		*/pagemap-*) cmp -s "$f" "$other" || { echo "  $(basename "$f") differs" >&2; return 1; } ;;
		*) [ "$(stat -c %s "$f")" = "$(stat -c %s "$other" 2>/dev/null)" ] ||
			{ echo "  $(basename "$f"): not the same size" >&2; return 1; } ;;
		esac
		n=$((n + 1))
	done
	echo "  $n pagemap and pages images compared"
	[ "$n" -ge 6 ]
}
check "the same tree dumped by both builds: identical pagemaps, pages images of the same size" same_layout

echo "image-interop: $passed passed, $failed failed"
[ "$failed" = 0 ]
