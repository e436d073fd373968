#!/bin/bash
# GPU test of the CRIU plugin on a machine with an NVIDIA GPU: real CUDA applications
# (nvcc-built and PyTorch) are dumped and restored by real CRIU with the plugin, and check their
# device data bit for bit afterwards; a tree of several GPU processes is dumped with the plugin
# driving them concurrently and one after another (CRIU_GPU_PARALLEL=0), in the same run; a dump
# that CRIU fails after the GPU checkpoint, and --leave-running, must leave the application
# running with its data. Prints dump and restore times by size.
#
#   scripts/gpu/gpu-criu-test.sh [SIZES_GIB] [TORCH_SIZES_GIB]     defaults: "1 8 32" "1 8"
#
# Environment: CRIU (default: criu from PATH), PLUGINS (directory holding criu_gpu_plugin.so,
# default /usr/lib/criu), CTL (cuda-checkpoint-ctl), IMAGES (default /dev/shm/gpu-criu: keep
# images in memory, the images of large GPU processes outgrow small disks), MULTI="4 4".
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
PLUGINS=${PLUGINS:-/usr/lib/criu}
CTL=${CTL:-$(command -v cuda-checkpoint-ctl || true)}
WORK=${WORK:-/tmp/gpu-criu}
IMAGES=${IMAGES:-/dev/shm/gpu-criu}
SIZES=${1:-"1 8 32"}
TORCH_SIZES=${2:-"1 8"}
read -r MULTI_N MULTI_GIB <<<"${MULTI:-4 4}"
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
trap 'cleanup_apps; rm -rf "$IMAGES"' EXIT
mkdir -p "$WORK"
"$CRIU" --version | head -1
[ -f "$PLUGINS/criu_gpu_plugin.so" ] || { echo "no criu_gpu_plugin.so in $PLUGINS"; exit 1; }
nvcc -O2 -o "$WORK/gpu-app" "$here/gpu-app.cu" 2>/dev/null || { echo "nvcc failed"; exit 1; }

wait_pids_gone() {
	for p in "$@"; do
		for _ in $(seq 200); do [ -d "/proc/$p" ] || break; sleep 0.05; done
	done
}

# plugin_secs LOG WORD: seconds the plugin reported for "WORD ... in X s".
plugin_secs() { grep -oE "$2 .* in [0-9.]+ s" "$1" | tail -1 | awk '{ print $(NF - 1) }'; }

# dump_restore NAME PID [criu dump args...]: dumps (killing), restores; sets DUMP_S, RESTORE_S.
dump_restore() {
	local name=$1 pid=$2 dir="$IMAGES/$1" t0 tree
	shift 2
	tree=$(pgrep -P "$pid" | tr '\n' ' ')
	rm -rf "$dir" && mkdir -p "$dir"
	t0=$(now)
	"$CRIU" dump -t "$pid" -D "$dir" --lib "$PLUGINS" -v4 -o dump.log "$@" ||
		{ fail "$name: criu dump"; grep -E 'Error|criu_gpu' "$dir/dump.log" | tail -15; return 1; }
	DUMP_S=$(elapsed "$t0")
	# shellcheck disable=SC2086 # a list of pids
	wait_pids_gone "$pid" $tree
	t0=$(now)
	"$CRIU" restore -D "$dir" -d --lib "$PLUGINS" -v4 -o restore.log ||
		{ fail "$name: criu restore"; grep -E 'Error|criu_gpu' "$dir/restore.log" | tail -15; return 1; }
	RESTORE_S=$(elapsed "$t0")
	IMG_GIB=$(du -sb "$dir" | awk '{ printf "%.1f", $1 / 2^30 }')
	grep -h 'criu_gpu:' "$dir/dump.log" "$dir/restore.log" | sed "s/^/[$name] /" >>"$WORK/plugin-lines.log"
	pass "$name: dumped in $DUMP_S s (GPU checkpoint $(plugin_secs "$dir/dump.log" checkpointed) s, image $IMG_GIB GiB), restored in $RESTORE_S s (GPU restore $(plugin_secs "$dir/restore.log" restored) s)"
}

# roundtrip NAME GIB CMD...: start, verify, dump, restore, verify.
roundtrip() {
	local name=$1 gib=$2 st pid line
	shift 2
	st="$WORK/$name.status"
	start_app "$st" "$@"
	pid=$LAST_PID
	wait_for "$st" '^ready' 600 || { fail "$name: did not start"; return; }
	line=$(ask_verify "$pid" "$st")
	verified_ok "$line" || { fail "$name: first check: $line"; return; }
	dump_restore "$name" "$pid" || return
	ROWS+=("$(printf '%-10s %5s %9s %11s %9s' "$name" "$gib" "$DUMP_S" "$RESTORE_S" "$IMG_GIB")")
	line=$(ask_verify "$pid" "$st")
	say "$name: after restore: $line"
	check "$name: data intact bit for bit after CRIU restore" verified_ok "$line"
	check "$name: state running" test "$("$CTL" --get-state --pid "$pid")" = running
	kill -9 "$pid" 2>/dev/null
	wait_pids_gone "$pid"
	rm -rf "${IMAGES:?}/$name"
}

ROWS=()
for gib in $SIZES; do
	[ "$gib" = 32 ] && continue # the largest size runs last
	say "== nvcc application, $gib GiB"
	roundtrip "nvcc-${gib}g" "$gib" "$WORK/gpu-app" "$gib" 5 "$WORK/nvcc-${gib}g.status"
done
for gib in $TORCH_SIZES; do
	say "== PyTorch application, $gib GiB"
	roundtrip "torch-${gib}g" "$gib" python3 "$here/torch-app.py" "$gib" 5 "$WORK/torch-${gib}g.status"
done

say "== $MULTI_N processes of $MULTI_GIB GiB in one tree: concurrent, then one at a time"
for mode in 1 0; do
	start_app_tree "$MULTI_N" "$MULTI_GIB" "$WORK/multi$mode." 300
	export CRIU_GPU_PARALLEL=$mode
	if dump_restore "tree-parallel$mode" "$parent"; then
		eval "CK$mode=$(plugin_secs "$IMAGES/tree-parallel$mode/dump.log" checkpointed) RS$mode=$(plugin_secs "$IMAGES/tree-parallel$mode/restore.log" restored)"
		for i in $(seq 1 "$MULTI_N"); do
			line=$(ask_verify "${kids[$((i - 1))]}" "$WORK/multi$mode.$i.status")
			check "tree (parallel=$mode): process $i data intact ($line)" verified_ok "$line"
		done
	fi
	unset CRIU_GPU_PARALLEL
	cleanup_apps
	wait_pids_gone "$parent" "${kids[@]}"
	rm -rf "${IMAGES:?}/tree-parallel$mode"
done
say "GPU checkpoint of the tree: concurrent ${CK1:-?} s, one at a time ${CK0:-?} s, ratio $(awk -v a="${CK1:-0}" -v b="${CK0:-1}" 'BEGIN { printf "%.2f", a / b }')"
say "GPU restore of the tree:    concurrent ${RS1:-?} s, one at a time ${RS0:-?} s, ratio $(awk -v a="${RS1:-0}" -v b="${RS0:-1}" 'BEGIN { printf "%.2f", a / b }')"

say "== a dump that CRIU fails after the GPU checkpoint leaves the process running"
st="$WORK/fail.status"
python3 -c "import socket,time,os; s=socket.socket(socket.AF_UNIX); s.bind('$WORK/outside.sock'); s.listen(1); c=s.accept(); time.sleep(600)" &
listener=$!
APPS+=("$listener")
sleep 0.5
start_app "$st" python3 -c "
import socket, os, sys
s = socket.socket(socket.AF_UNIX); s.connect('$WORK/outside.sock'); s.set_inheritable(True)
os.execv('$WORK/gpu-app', ['gpu-app', '1', '9', '$st'])" 
pid=$LAST_PID
wait_for "$st" '^ready' 120
ask_verify "$pid" "$st" >/dev/null
rm -rf "$IMAGES/fail" && mkdir -p "$IMAGES/fail"
if "$CRIU" dump -t "$pid" -D "$IMAGES/fail" --lib "$PLUGINS" -v4 -o dump.log; then
	fail "the dump was expected to fail (external socket)"
else
	grep -E 'External socket|checkpointed|returned to its state' "$IMAGES/fail/dump.log" | sed 's/^/  /'
	check "after the failed dump: state running" test "$("$CTL" --get-state --pid "$pid")" = running
	line=$(ask_verify "$pid" "$st")
	check "after the failed dump: data intact ($line)" verified_ok "$line"
fi
kill -9 "$pid" "$listener" 2>/dev/null

say "== --leave-running"
st="$WORK/lr.status"
start_app "$st" "$WORK/gpu-app" 2 13 "$st"
pid=$LAST_PID
wait_for "$st" '^ready' 120
ask_verify "$pid" "$st" >/dev/null
rm -rf "$IMAGES/lr" && mkdir -p "$IMAGES/lr"
check "--leave-running dump" "$CRIU" dump -t "$pid" -D "$IMAGES/lr" --lib "$PLUGINS" -v4 -o dump.log --leave-running
check "--leave-running: state running" test "$("$CTL" --get-state --pid "$pid")" = running
line=$(ask_verify "$pid" "$st")
check "--leave-running: data intact ($line)" verified_ok "$line"
kill -9 "$pid"
rm -rf "$IMAGES/fail" "$IMAGES/lr"

for gib in $SIZES; do
	[ "$gib" = 32 ] || continue
	say "== nvcc application, $gib GiB"
	roundtrip "nvcc-${gib}g" "$gib" "$WORK/gpu-app" "$gib" 5 "$WORK/nvcc-${gib}g.status"
done

say "== dump and restore with real CRIU, by size"
printf '%-10s %5s %9s %11s %9s\n' app GiB dump_s restore_s image_GiB
printf '%s\n' "${ROWS[@]}"
summary
