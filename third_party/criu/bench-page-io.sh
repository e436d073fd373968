#!/bin/bash
# CRIU's page I/O, stock 4.2.1 against the project's patched build, on a plain process holding
# GIB GiB of anonymous memory (tests/mem-app.c), all in one run. Each round dumps and restores
# the same process once per configuration: stock, then the patched build with each
# --page-io-threads value (0 = one per CPU). Every restore is checked word for word. Prints every
# run, then per configuration the median dump and restore wall times, GB/s, and the ratio to
# stock in this run; before that the same-run ceilings (memory copy, tmpfs write and read).
#
#   sudo third_party/criu/bench-page-io.sh [GIB [ROUNDS [THREADS...]]]    # default: 4 3 1 2 0
# Environment: CRIU (patched, /usr/local/sbin/criu), CRIU_STOCK
# (/usr/local/lib/criu-gpu/stock/criu), IMAGES (/dev/shm: images in memory).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-/usr/local/sbin/criu}
prefix=$(cd "$(dirname "$CRIU")/.." && pwd)
CRIU_STOCK=${CRIU_STOCK:-$prefix/lib/criu-gpu/stock/criu}
IMAGES=${IMAGES:-/dev/shm}
GIB=${1:-4}
ROUNDS=${2:-3}
shift $(($# > 2 ? 2 : $#))
THREADS=("$@")
[ $# -gt 0 ] || THREADS=(1 2 0)

work=$(mktemp -d /tmp/bench-page-io.XXXXXX)
img=$(mktemp -d "$IMAGES/bench-page-io.XXXXXX")
app=
cleanup() {
	[ -z "$app" ] || kill -9 "$app" 2>/dev/null || true
	rm -rf "$work" "$img"
}
trap cleanup EXIT
mkdir -p "$work/no-plugins"
gcc -O2 -o "$work/mem-app" "$here/tests/mem-app.c"
gcc -O2 -pthread -o "$work/bw" "$here/tests/bw.c"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

echo "== ceilings ($(nproc) CPUs, images on $IMAGES)"
for t in 1 "$(nproc)"; do "$work/bw" $((GIB * 1024)) "$t" | sed 's/^/  /'; done
t0=$(now)
dd if=/dev/zero of="$img/ceiling" bs=1M count=$((GIB * 1024)) status=none
echo "  write to $IMAGES: $(awk -v g="$GIB" -v s="$(since "$t0")" 'BEGIN { printf "%.2f", g * 1.073741824 / s }') GB/s"
t0=$(now)
dd if="$img/ceiling" of=/dev/null bs=1M status=none
echo "  read from $IMAGES: $(awk -v g="$GIB" -v s="$(since "$t0")" 'BEGIN { printf "%.2f", g * 1.073741824 / s }') GB/s"
rm -f "$img/ceiling"

setsid "$work/mem-app" "$GIB" 3 "$work/status" </dev/null >/dev/null 2>&1 &
app=$!
disown "$app"
for _ in $(seq 1200); do grep -q '^ready' "$work/status" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready' "$work/status" || { echo "mem-app did not start" >&2; exit 1; }
step=0

# one CONFIG CRIU ARGS...: dumps and restores the process, checks its data, records the times.
one() {
	local config=$1 t dump_s restore_s line
	shift
	rm -rf "$img/run" && mkdir "$img/run"
	t=$(now)
	"$@" dump -t "$app" -D "$img/run" -v4 -o dump.log || { echo "$config: dump failed" >&2; exit 1; }
	dump_s=$(since "$t")
	for _ in $(seq 200); do [ -d "/proc/$app" ] || break; sleep 0.05; done
	t=$(now)
	"$@" restore -D "$img/run" -d -v4 -o restore.log || { echo "$config: restore failed" >&2; exit 1; }
	restore_s=$(since "$t")
	kill -USR1 "$app"
	for _ in $(seq 3000); do grep -q "^verified step=$step " "$work/status" && break; sleep 0.1; done
	line=$(grep "^verified step=$step " "$work/status" || echo "no answer")
	step=$((step + 1))
	[[ $line == *"mismatches=0 "* ]] || { echo "$config: data lost after restore: $line" >&2; exit 1; }
	printf '  %-10s dump %6.2f s  restore %6.2f s  %s\n' "$config" "$dump_s" "$restore_s" \
		"$(grep -h 'pages: pid .* threads' "$img/run/dump.log" "$img/run/restore.log" |
			sed 's/^.*pages: pid [0-9]*: //' | tr '\n' ' ')"
	echo "$config $dump_s $restore_s" >>"$work/results"
}

# run_config I: the I-th configuration (0: stock, then one per THREADS value)
run_config() {
	if [ "$1" = 0 ]; then
		one stock "$CRIU_STOCK" --lib "$work/no-plugins"
	else
		local t=${THREADS[$1 - 1]}
		one "patched-t$t" "$CRIU" --lib "$work/no-plugins" --page-io-threads "$t"
	fi
}

# Each round starts with the next configuration: what ran just before changes the timings
# (freed memory is reused), so no configuration always runs in the same place.
echo "== $GIB GiB, $ROUNDS rounds"
nr=$((${#THREADS[@]} + 1))
for r in $(seq 0 $((ROUNDS - 1))); do
	echo " round $((r + 1))"
	for i in $(seq 0 $((nr - 1))); do run_config $(((r + i) % nr)); done
done

echo "== medians ($GIB GiB; ratio = time / stock time, same run)"
awk -v gib="$GIB" '
function median(list, n,   a, i, j, t) {
	n = split(list, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ if (!($1 in d)) order[++n] = $1; d[$1] = d[$1] " " $2; r[$1] = r[$1] " " $3 }
END {
	sd = median(d["stock"]); sr = median(r["stock"])
	for (i = 1; i <= n; i++) {
		c = order[i]; md = median(d[c]); mr = median(r[c])
		printf "  %-10s dump %6.2f s %5.2f GB/s x%.2f   restore %6.2f s %5.2f GB/s x%.2f\n", c, md,
			gib * 1.073741824 / md, md / sd, mr, gib * 1.073741824 / mr, mr / sr
	}
}' "$work/results"
