# shellcheck shell=bash disable=SC2154 # sourced by store-bench.sh, which sets sim, D, W, OUT, STORE and the rest
# store-bench.sh's parts, each recording its numbers (record KEY VALUE) as it goes; the table at
# the end reads them back. Expects what store-bench.sh and store-bench-apps.sh set.

PORT=$((29000 + $$ % 1000))

# The disk's own speeds: a sequential write with fsync, and direct reads (one reader, as dd
# reads, and eight at once): the restore is compared with the faster.
ceilings() {
	local gib=4 t0 bytes
	[ "$sim" = 1 ] && gib=0.25
	bytes=$(awk -v g="$gib" 'BEGIN { printf "%d", g * 1024 }')
	say "== ceilings: $DISK ($gib GiB)"
	t0=$(now)
	dd if=/dev/zero of="$D/ceiling" bs=1M count="$bytes" conv=fsync status=none
	record disk_write_gbps "$(gbps_of $((bytes << 20)) "$(elapsed "$t0")")"
	drop_caches
	t0=$(now)
	dd if="$D/ceiling" of=/dev/null bs=1M iflag=direct status=none
	record disk_read_dd_gbps "$(gbps_of $((bytes << 20)) "$(elapsed "$t0")")"
	drop_caches
	t0=$(now)
	local readers=()
	for i in $(seq 0 7); do
		dd if="$D/ceiling" of=/dev/null bs=1M iflag=direct skip=$((i * bytes / 8)) count=$((bytes / 8)) status=none &
		readers+=($!)
	done
	wait "${readers[@]}"
	record disk_read_8_gbps "$(gbps_of $((bytes << 20)) "$(elapsed "$t0")")"
	record disk_read_gbps "$(awk -v a="$(val disk_read_dd_gbps)" -v b="$(val disk_read_8_gbps)" 'BEGIN { print (a > b ? a : b) }')"
	rm -f "$D/ceiling"
}

# store_dump NAME PID SNAPSHOT: criu-gpu dump --leave-running into the store; records its
# wall time, CRIU's part, the store's part, and the bytes.
store_dump() {
	cgc "$1" dump "$2" --leave-running --json --store "$STORE" --snapshot "$3" --stage "$W/stage-$3" || return 1
	record "$1_s" "$(secs "$1")"
	record "$1_criu_s" "$(jget "$1" dump.seconds)"
	record "$1_put_s" "$(jget "$1" written.seconds)"
	record "$1_bytes" "$(jget "$1" written.bytes)"
	record "$1_new_bytes" "$(jget "$1" written.new_bytes)"
	record "$1_new_stored" "$(jget "$1" written.new_stored_bytes)"
}

# The driver's staging copy of device memory: its size in snapshot $1 (the plugin's record), and
# of the largest pages image of snapshot $2 what was already in snapshot $1, where it moved.
staging_report() {
	"$CRIU_GPU" store cat "$STORE" "$2" gpu-cuda.json >"$LOGS/gpu-cuda-$2.json" 2>/dev/null
	"$PYTHON" - "$STORE" "$1" "$2" "$LOGS/gpu-cuda-$2.json" <<'EOF' | while read -r k v; do record "$k" "$v"; done
import collections, json, sys
store, a, b, record = sys.argv[1:]
def manifest(n):
    return json.load(open(f"{store}/snapshots/{n}.json"))["body"]
def pages(m):
    f = max((e for e in m["entries"] if e["type"] == "file" and e["path"].startswith("pages-")), key=lambda e: e["size"])
    off, seq = 0, []
    for cid, n in f["chunks"]:
        seq.append((cid, off, n))
        off += n
    return f, seq
try:
    body = json.load(open(record))["body"]
    staging = sum(s["end"] - s["start"] for p in body["processes"] for s in p.get("staging", []))
except (OSError, ValueError, KeyError):
    staging = 0
ma, mb = manifest(a), manifest(b)
fa, sa = pages(ma)
fb, sb = pages(mb)
first = {}
for c, o, n in sa:
    first.setdefault(c, o)
old = {c for e in ma["entries"] if e["type"] == "file" for c, _ in e["chunks"]}
new = sum(n for c, _, n in sb if c not in old)
# Where the chunks of the second pages image that the first one had were in the first: the
# most common offset change is how far the bulk of the memory (the staging copy) moved.
moved = collections.Counter()
for c, o, n in sb:
    if c in first:
        moved[o - first[c]] += n
shift, shifted = moved.most_common(1)[0] if moved else (0, 0)
print("staging_bytes", staging)
print("pages_bytes", fb["size"])
print("pages_new_bytes", new)
print("pages_found_bytes", sum(moved.values()))
print("pages_shift_bytes", shift)
print("pages_shift_found_bytes", shifted)
EOF
}

part_store() {
	say "== store: an inference server of $GIB GiB snapshotted twice, and a replica"
	start_server srv 1 "$PORT" || { fail "the server did not start"; return 1; }
	S1=$SERVER_PID
	A0=$(ask "$PORT" 1234 "$WORK/srv.status")
	record answer_before "$A0"
	store_dump dump1 "$S1" srv-1 || { fail "store: the first snapshot"; return 1; }
	for n in 1 2 3; do ask "$PORT" "$n" "$WORK/srv.status" >/dev/null; done
	check "the server answers as before after a snapshot" [ "$(ask "$PORT" 1234 "$WORK/srv.status")" = "$A0" ]
	store_dump dump2 "$S1" srv-2 || { fail "store: the second snapshot"; return 1; }
	staging_report srv-1 srv-2
	start_server rep 1 $((PORT + 1)) || { fail "the replica did not start"; return 1; }
	store_dump replica "$SERVER_PID" rep-1 || fail "store: the replica's snapshot"
	kill -9 "$SERVER_PID"
	cg inspect inspect --json "$STORE" && record store_stored_bytes "$(jget inspect stored_bytes)"
}

# What bounds a dump into a plain directory on the disk: the driver's checkpoint (the plugin's
# timings), CRIU's pages (its log), the sync to the disk.
plain_dump() {
	local t0
	cgc plain_dump dump "$S1" "$D/plain" --json || return 1
	t0=$(now)
	sync
	record plain_sync_s "$(elapsed "$t0")"
	record plain_dump_s "$(awk -v a="$(secs plain_dump)" -v b="$(val plain_sync_s)" 'BEGIN { print a + b }')"
	record plain_bytes "$(du -sb "$D/plain" | cut -f1)"
	record plain_driver_s "$("$PYTHON" -c '
import json, sys
for p in json.load(open(sys.argv[1]))["body"]["phases"]:
    if p["name"] == "checkpoint": print(p["seconds"])' "$D/plain/gpu-timings-dump.json" 2>/dev/null)"
	record plain_pages_s "$(sed -nE 's/.*pages: pid [0-9]+: [a-z]+ [0-9.]+ GiB in ([0-9.]+) s.*/\1/p' "$D/plain/dump.log" | sort -g | tail -1)"
}

# restore_timed NAME ARGS...: the page cache dropped, criu-gpu restore ARGS, the server's answer
# checked, the restored server ended.
restore_timed() {
	local name=$1
	shift
	gone "$S1" || fail "$name: the server's pid is still taken"
	drop_caches
	if ! cgc "$name" restore --json "$@"; then
		fail "$name: restore"
		return 1
	fi
	record "${name}_s" "$(secs "$name")"
	local log=$D/plain/restore.log
	[ "$name" = restore_store ] && log=$W/rstage/restore.log
	cp "$log" "$LOGS/$name.restore.log" 2>/dev/null
	check "$name: the restored server answers as before" [ "$(ask "$PORT" 1234 "$WORK/srv.status")" = "$A0" ]
	kill -9 "$S1"
}

part_restore() {
	say "== restore: the server from a plain directory on the disk and from the store"
	[ -n "${S1:-}" ] || return 1
	# The server's images in memory, for the compression part.
	cgc wimg dump "$S1" "$W/wimg" --leave-running --json || fail "the server's images in memory"
	plain_dump || { fail "plain dump"; return 1; }
	restore_timed restore_plain "$D/plain" --no-prefetch
	restore_timed restore_ahead "$D/plain"
	restore_timed restore_store --store "$STORE" --snapshot srv-2 --stage "$W/rstage"
	[ -e "$LOGS/restore_store.out" ] && record restore_store_read_s "$(jget restore_store read.seconds)"
	gone "$S1"
}

# codecs NAME DIR: DIR stored with each codec into a store of its own on the disk, then read back
# with the page cache dropped.
codecs() {
	local c k
	for c in none lz4 zstd:1; do
		k=$1_${c%%:*}
		cg "${k}_put" store put "$D/c" x "$2" --compress "$c" --json || { fail "$k: store put"; continue; }
		record "${k}_put_s" "$(jget "${k}_put" seconds)"
		record "${k}_stored" "$(jget "${k}_put" new_stored_bytes)"
		record "${k}_new" "$(jget "${k}_put" new_bytes)"
		record "${k}_bytes" "$(jget "${k}_put" bytes)"
		drop_caches
		cg "${k}_get" store get "$D/c" x "$W/cget" --json || fail "$k: store get"
		record "${k}_get_s" "$(jget "${k}_get" seconds)"
		rm -rf "$D/c" "$W/cget"
	done
}

part_compress() {
	say "== compress: model weights and a training state, stored with none, lz4, zstd"
	if late 420; then
		fail "compress: left out, the run is past 420 s"
		return 1
	fi
	[ -d "$W/wimg" ] && codecs weights "$W/wimg"
	rm -rf "$W/wimg"
	if late 400; then
		fail "compress: the training state left out, the run is past 400 s"
	elif start_train; then
		cgc timg dump "$TRAIN_PID" "$W/timg" --json && codecs train "$W/timg"
		rm -rf "$W/timg"
		kill -9 "$TRAIN_PID" 2>/dev/null
	else
		fail "the training job did not start"
	fi
}

# row WHAT VALUE BASELINE GOAL-TEXT VERDICT
row() { printf '| %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$5" | tee -a "$OUT/table.md"; }
verdict() { awk -v r="$1" -v op="$2" -v g="$3" 'BEGIN { ok = (op == "<=" ? r <= g : r >= g); print (ok ? "MET" : "not met") }'; }

table() {
	local b d1 d2 pl r
	say "== table (every ratio against its baseline of this run; $(nproc) CPUs; disk $DISK)"
	: >"$OUT/table.md"
	row "measure" "value" "baseline" "goal" "verdict"
	row "---" "---" "---" "---" "---"
	d1=$(val dump1_new_stored) d2=$(val dump2_new_stored)
	r=$(ratio "$d2" "$d1")
	row "2nd snapshot: bytes written" "$d2 B (x$r)" "1st: $d1 B" "<= 0.15" "$(verdict "$r" "<=" 0.15)"
	r=$(ratio "$(val dump2_s)" "$(val dump1_s)")
	row "2nd snapshot: time" "$(val dump2_s) s (CRIU $(val dump2_criu_s), store $(val dump2_put_s)) x$r" \
		"1st: $(val dump1_s) s (CRIU $(val dump1_criu_s), store $(val dump1_put_s))" "<= 0.4" "$(verdict "$r" "<=" 0.4)"
	row "driver staging found again" "$(val pages_found_bytes) of $(val pages_bytes) B of the pages image; new $(val pages_new_bytes) B; $(val pages_shift_found_bytes) B found $(val pages_shift_bytes) B from where they were" \
		"staging $(val staging_bytes) B" "staging byte-identical" \
		"$(verdict "$(ratio "$(val pages_new_bytes)" "$(val staging_bytes)")" "<=" 0.05)"
	r=$(ratio "$((d1 + $(val replica_new_stored)))" "$d1")
	row "store with 2 replicas" "$((d1 + $(val replica_new_stored))) B (x$r)" "one snapshot: $d1 B" "<= 1.2" "$(verdict "$r" "<=" 1.2)"
	for pl in restore_plain restore_ahead; do
		r=$(ratio "$(val "${pl}_s")" "$(val restore_store_s)")
		row "restore from store (read $(val restore_store_read_s) s) vs $pl" "$(val restore_store_s) s (x$r speed)" "$(val "${pl}_s") s" ">= 0.9" "$(verdict "$r" ">=" 0.9)"
	done
	b=$(val plain_bytes)
	for pl in restore_plain restore_ahead restore_store; do
		r=$(ratio "$(gbps_of "$b" "$(val "${pl}_s")")" "$(val disk_read_gbps)")
		row "$pl speed vs disk direct read (cache dropped)" "$(gbps_of "$b" "$(val "${pl}_s")") GB/s (x$r)" \
			"$(val disk_read_gbps) GB/s (dd $(val disk_read_dd_gbps), 8 readers $(val disk_read_8_gbps))" ">= 0.8" "$(verdict "$r" ">=" 0.8)"
	done
	r=$(ratio "$(gbps_of "$b" "$(val plain_dump_s)")" "$(val disk_write_gbps)")
	row "plain dump to disk: what bounds it" "$(val plain_dump_s) s = driver checkpoint $(val plain_driver_s) + CRIU pages $(val plain_pages_s) + sync $(val plain_sync_s) + rest; $(gbps_of "$b" "$(val plain_dump_s)") GB/s (x$r)" \
		"disk write $(val disk_write_gbps) GB/s: $(awk -v b="$b" -v w="$(val disk_write_gbps)" 'BEGIN { printf "%.2f", b / 1e9 / w }') s for $b B" "report" "-"
	compress_rows weights
	compress_rows train
}

compress_rows() {
	local c k n=$1_none r1 r2 r3
	for c in lz4 zstd; do
		k=$1_$c
		r1=$(ratio "$(val "${k}_new")" "$(val "${k}_stored")")
		r2=$(ratio "$(val "${k}_put_s")" "$(val "${n}_put_s")")
		r3=$(ratio "$(val "${k}_get_s")" "$(val "${n}_get_s")")
		row "$1 with $c: ratio x$r1" "store $(val "${k}_put_s") s (x$r2), read $(val "${k}_get_s") s (x$r3)" \
			"none: store $(val "${n}_put_s") s, read $(val "${n}_get_s") s, $(val "${n}_bytes") B" "beats the disk: both < 1" \
			"$(awk -v a="$r2" -v b="$r3" 'BEGIN { print (a < 1 && b < 1 ? "yes" : (b < 1 ? "reads only" : "no")) }')"
	done
}
