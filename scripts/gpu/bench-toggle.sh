#!/bin/bash
# Benchmark of the CUDA checkpoint toggle on a machine with an NVIDIA GPU, in one run:
#  1. lock / checkpoint / restore / unlock time per GiB, for several sizes;
#  2. the same run's pinned and pageable host<->device copy bandwidth, the ceiling;
#  3. N processes suspended and resumed as a tree (concurrently) against one after another.
# All figures are ratios against baselines measured in the same run (these machines are noisy).
#
#   scripts/gpu/bench-toggle.sh [SIZES_GIB] [N] [GIB_EACH]     defaults: "1 4 16" 4 4
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CTL=${CTL:-$(command -v cuda-checkpoint-ctl || true)}
WORK=${WORK:-/tmp/bench-toggle}
SIZES=${1:-"1 4 16"}
N=${2:-4}
EACH=${3:-4}
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
stamp "$here/../../.carry/plugins/criu_gpu_plugin.so"
trap cleanup_apps EXIT
[ -x "$CTL" ] || { echo "cuda-checkpoint-ctl not found: set CTL"; exit 1; }
mkdir -p "$WORK"
nvcc -O2 -o "$WORK/gpu-app" "$here/gpu-app.cu" && nvcc -O2 -o "$WORK/copy-bw" "$here/copy-bw.cu" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

say "== copy bandwidth ceiling (4 GiB)"
"$WORK/copy-bw" 4 | tee "$WORK/bw.txt"
bw() { awk -v k="$1 $2" '$1" "$2 == k { sub("GB/s=", "", $4); print $4 }' "$WORK/bw.txt"; }
PIN_D2H=$(bw pinned d2h) PAGE_D2H=$(bw pageable d2h)

say "== toggle time per size"
printf '%-6s %9s %13s %10s %9s %10s %10s %13s %13s\n' GiB lock_ms checkpoint_s restore_s unlock_ms ckpt_GB/s rest_GB/s ckpt/pinned ckpt/pageable
for gib in $SIZES; do
	st="$WORK/size-$gib.status"
	start_app "$st" "$WORK/gpu-app" "$gib" 3 "$st"
	pid=$LAST_PID
	wait_for "$st" '^ready' 600 || continue
	if ! { "$CTL" --suspend --pid "$pid" --json >"$WORK/s.json" && "$CTL" --resume --pid "$pid" --json >"$WORK/r.json"; }; then
		say "toggle failed at $gib GiB"
		continue
	fi
	line=$(ask_verify "$pid" "$st")
	verified_ok "$line" || say "DATA MISMATCH at $gib GiB: $line"
	python3 - "$gib" "$WORK/s.json" "$WORK/r.json" "$PIN_D2H" "$PAGE_D2H" <<'EOF'
import json, sys
gib, s, r, pin, page = float(sys.argv[1]), json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), float(sys.argv[4]), float(sys.argv[5])
t = {**s["processes"][0]["timings"], **r["processes"][0]["timings"]}
gb = gib * (1 << 30) / 1e9
c, rs = t["checkpoint_ms"] / 1000, t["restore_ms"] / 1000
print(f"{gib:<6g} {t['lock_ms']:9.1f} {c:13.2f} {rs:10.2f} {t['unlock_ms']:9.1f} {gb / c:10.2f} {gb / rs:10.2f} {gb / c / pin:13.3f} {gb / c / page:13.3f}")
EOF
	kill -9 "$pid"
	wait "$pid" 2>/dev/null
done

say "== $N processes of $EACH GiB: concurrently (--tree) against one after another"
start_app_tree "$N" "$EACH" "$WORK/m." 600
t=$(now); "$CTL" --suspend --pid "${kids[0]}" >/dev/null; one_s=$(elapsed "$t")
t=$(now); "$CTL" --resume --pid "${kids[0]}" >/dev/null; one_r=$(elapsed "$t")
t=$(now); for p in "${kids[@]}"; do "$CTL" --suspend --pid "$p" >/dev/null; done; seq_s=$(elapsed "$t")
t=$(now); for p in "${kids[@]}"; do "$CTL" --resume --pid "$p" >/dev/null; done; seq_r=$(elapsed "$t")
t=$(now); "$CTL" --suspend --tree "$parent" >/dev/null; par_s=$(elapsed "$t")
t=$(now); "$CTL" --resume --tree "$parent" >/dev/null; par_r=$(elapsed "$t")
bad=0
for i in $(seq 1 "$N"); do
	line=$(ask_verify "${kids[$((i - 1))]}" "$WORK/m.$i.status")
	verified_ok "$line" || bad=$((bad + 1))
done
awk -v n="$N" -v os="$one_s" -v or="$one_r" -v ss="$seq_s" -v sr="$seq_r" -v ps="$par_s" -v pr="$par_r" 'BEGIN {
	printf "%-8s %8s %12s %10s %16s %12s\n", "", "one_s", "sequential_s", "tree_s", "tree/sequential", "tree/one"
	printf "%-8s %8.2f %12.2f %10.2f %16.2f %12.2f\n", "suspend", os, ss, ps, ps / ss, ps / os
	printf "%-8s %8.2f %12.2f %10.2f %16.2f %12.2f\n", "resume", or, sr, pr, pr / sr, pr / or
}'
say "processes with data mismatches after the runs: $bad"
