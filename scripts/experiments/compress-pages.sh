#!/bin/bash
# Whether LZ4 compression of CRIU's pages images pays for GPU data (CRIU's development branch
# has LZ4 page compression; the pinned 4.2.1 has none): for each pages image of at least 64 MiB
# in DIR, the compressed size (lz4 -1, on its first SAMPLE_GIB), one thread's compression and
# decompression speed, and THREADS threads compressing pieces of the whole file at once, against
# which the speed of the place the image goes (tmpfs or a disk) decides: compression pays only
# where the bytes it saves take longer to write and read than compressing them takes.
#
#   scripts/experiments/compress-pages.sh DIR [LABEL]
# Environment: LZ4 (lz4 in PATH), THREADS (16), SAMPLE_GIB (2), TMP (/dev/shm).
set -euo pipefail
dir=$1
label=${2:-$dir}
LZ4=${LZ4:-lz4}
THREADS=${THREADS:-16}
SAMPLE_GIB=${SAMPLE_GIB:-2}
TMP=${TMP:-/dev/shm}
command -v "$LZ4" >/dev/null || { echo "compress-pages.sh: no lz4 (set LZ4)" >&2; exit 1; }
now() { date +%s.%N; }
rate() { awk -v b="$1" -v a="$2" -v z="$(now)" 'BEGIN { printf "%.2f", b / 1e9 / (z - a) }'; }

for f in "$dir"/pages-*.img; do
	size=$(stat -c %s "$f")
	[ "$size" -ge $((64 << 20)) ] || continue
	sample=$((SAMPLE_GIB << 30))
	[ "$sample" -le "$size" ] || sample=$size
	t0=$(now)
	head -c "$sample" "$f" | "$LZ4" -1 -q -c >"$TMP/compress-pages.lz4"
	c1=$(rate "$sample" "$t0")
	packed=$(stat -c %s "$TMP/compress-pages.lz4")
	t0=$(now)
	"$LZ4" -d -q -c "$TMP/compress-pages.lz4" >/dev/null
	d1=$(rate "$sample" "$t0")
	rm -f "$TMP/compress-pages.lz4"
	piece=$(((size / THREADS + 1048575) / 1048576))
	t0=$(now)
	for i in $(seq 0 $((THREADS - 1))); do
		dd if="$f" bs=1M skip=$((i * piece)) count="$piece" status=none | "$LZ4" -1 -q -c >/dev/null &
	done
	wait
	cn=$(rate "$size" "$t0")
	awk -v l="$label" -v n="$(basename "$f")" -v s="$size" -v p="$packed" -v q="$sample" \
		-v c1="$c1" -v d1="$d1" -v cn="$cn" -v t="$THREADS" 'BEGIN {
		printf "%s %s: %.2f GiB; lz4 -1 ratio %.3f (%.1f%% saved); 1 thread: compress %s GB/s, decompress %s GB/s; %d threads: compress %s GB/s\n",
			l, n, s / 2^30, q / p, 100 * (1 - p / q), c1, d1, t, cn }'
done
