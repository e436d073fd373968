#!/bin/bash
# Snapshots stored by content, and restores at the disk's speed (issue 29, items 2 and 3), on one
# GPU in one call of a few minutes. Every ratio against its baseline measured in the same run:
#   store     an inference server (scripts/gpu/infer-server.py: GIB GiB of bf16 weights on the
#             GPU, answering requests on 127.0.0.1) snapshotted twice into a store on the disk
#             (criu-gpu dump --leave-running --store): the second's bytes written and time
#             against the first's; whether the driver's staging copy of device memory was byte
#             for byte the same and found again (where it moved in the pages image); a replica
#             (a second server, same weights) snapshotted into the same store: the store against
#             one snapshot
#   restore   the server dumped into a plain image directory on the disk (the dump's phases:
#             what bounds it), then restored with the page cache dropped before each: plain
#             (--no-prefetch: the earlier way), plain with read-ahead, and from the store; each
#             restore verified (the server answers request 1234 as before the first dump);
#             restore speed against the disk's direct read
#   compress  the server's images and a training job's (scripts/experiments/train-state.py:
#             a transformer with AdamW) stored with none, lz4 and zstd: bytes stored, time to
#             store and to read back (page cache dropped) against none's
# Results go to $OUT as they come: store-bench.log (everything said), results.tsv (each number
# as it is measured), table.md (every ratio, its baseline and the goal), and at the end
# details.tar.gz (every command's output and JSON, the restores' CRIU logs).
#
#   OUT=/tmp/out scripts/gpu/store-bench.sh [--gib 6] [--disk /var/tmp] [--train-layers 4]
#   scripts/gpu/store-bench.sh --sim      # here, on the simulated GPU: the plumbing, not numbers
# On the GPU machine: after scripts/gpu/pack-carry.sh here (.carry in the working tree).
# Environment: OUT (/tmp/store-bench), CRIU_GPU and PLUGINS (.carry's, or target/debug's with
# --sim), PYTHON (python3).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
sim=0 GIB=6 DISK=/var/tmp TRAIN_LAYERS=4
while [ $# -gt 0 ]; do
	case $1 in
	--sim) sim=1 ;;
	--gib) GIB=$2; shift ;;
	--disk) DISK=$2; shift ;;
	--train-layers) TRAIN_LAYERS=$2; shift ;;
	*) echo "store-bench.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
OUT=${OUT:-/tmp/store-bench}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/store-bench.log") 2>&1
RES=$OUT/results.tsv
: >"$RES"
START=$(date +%s.%N)
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
die() { say "store-bench.sh: $*"; exit 1; }
record() { # KEY VALUE: long decimals cut to three places
	local v=$2
	[[ $v =~ ^[0-9]+\.[0-9]{4,}$ ]] && v=$(printf '%.3f' "$v")
	printf '%s\t%s\n' "$1" "$v" >>"$RES"
	say "  $1 = $v"
}
val() { awk -F'\t' -v k="$1" '$1 == k { v = $2 } END { print v }' "$RES"; }

# What ran: the source and the plugin.
if [ $sim = 1 ]; then
	CRIU_GPU=${CRIU_GPU:-$root/target/debug/criu-gpu}
	plugin_so=$root/target/debug/libcriu_gpu_plugin.so
	W=/dev/shm/store-bench-sim
else
	export PATH="$root/.carry/bin:$PATH"
	CRIU_GPU=${CRIU_GPU:-$root/.carry/bin/criu-gpu}
	plugin_so=$root/.carry/plugins/criu_gpu_plugin.so
	W=/dev/shm/store-bench
fi
[ -n "${PLUGINS:-}" ] && plugin_so=$PLUGINS/criu_gpu_plugin.so
stamp "$plugin_so"
say "machine: $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 2^20 }' /proc/meminfo), disk $DISK: $(df -h --output=avail "$DISK" | tail -1 | tr -d ' ') free"
[ "$(id -u)" = 0 ] || die "run as root (CRIU dumps and restores the applications)"
[ -x "$CRIU_GPU" ] || die "$CRIU_GPU not found (cargo build, or scripts/gpu/pack-carry.sh; or set CRIU_GPU)"
[ -e "$plugin_so" ] || die "no plugin at $plugin_so (set PLUGINS)"
WORK=$W/work D=$DISK/store-bench LOGS=$W/logs
rm -rf "$W" "$D"
mkdir -p "$WORK/plugins" "$D" "$LOGS"
cp "$plugin_so" "$WORK/plugins/criu_gpu_plugin.so"
STORE=$D/store
daemon=
cleanup() {
	cleanup_apps
	[ -z "$daemon" ] || kill "$daemon" 2>/dev/null
	tar czf "$OUT/details.tar.gz" -C "$LOGS" . 2>/dev/null
	rm -rf "$W" "$D"
}
trap cleanup EXIT

# shellcheck source=scripts/gpu/store-bench-apps.sh
. "$here/store-bench-apps.sh"
# shellcheck source=scripts/gpu/store-bench-parts.sh
. "$here/store-bench-parts.sh"

ceilings
part_store
part_restore
part_compress
table
summary
