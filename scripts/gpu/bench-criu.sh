#!/bin/bash
# CRIU dump and restore of real CUDA applications with several stacks, all in one run:
#   ours        the project's CRIU (4.2.1 + third_party/criu/patches) with the project's plugin
#   cplug       upstream: stock CRIU 4.2.1 with CRIU's C cuda_plugin, cuda-checkpoint-ctl as its
#               cuda-checkpoint
#   stock       stock CRIU 4.2.1 with the project's plugin
#   ours-seq    ours with CRIU_GPU_OVERLAP=0 (every page in place before the driver's restore
#               starts, as before patch 0007)
#   ours-nothp  ours with CRIU_GPU_THP=off (the driver's checkpoint fills 4 KiB pages)
#   ours-thp    ours with the node's transparent huge pages at always for the whole dump and
#               restore (what huge pages do to CRIU's own page dump and restore)
# Cases: one process of each size in --sizes (GiB; --sizes "": none), and a tree of --tree "N G":
# N processes of G GiB each, spread over the GPUs (--tree "": none). In each round every stack dumps and restores the same applications once
# (the stack that starts a round rotates); after every restore each application checks its data
# bit for bit. Prints each run with its phases (driver: the plugins' own times; CRIU pages: CRIU's
# stats and log), then per case the medians, GB/s and the ratios to cplug and stock of this run,
# and the project's goals. First the same-run ceilings: memory copy, tmpfs and disk bandwidth.
#
#   scripts/gpu/bench-criu.sh [--sim] [--sizes "8 32"] [--tree "4 4"] [--rounds 3]
#                         [--stacks "ours cplug ..."] [--disk DIR]
# --disk DIR: the images go to DIR (a real disk): each dump's time includes a sync, the page
# cache is dropped before each restore, and the disk's own sequential write (fsync) and direct
# read speeds of the same run are the ceilings the goals compare with.
# On the GPU machine (after scripts/gpu/pack-carry.sh here): export PATH=$PWD/.carry/bin:$PATH
#   PLUGINS=.carry/plugins UPSTREAM_PLUGINS=.carry/upstream-plugins scripts/gpu/bench-criu.sh
# --sim: on the simulated GPU (scripts/install.sh installs it), small sizes by default: checks
# that the script works on a machine without a GPU; its times mean nothing.
# Environment: CRIU (criu in PATH), CRIU_STOCK (criu-stock in PATH, else
# /usr/local/lib/criu-gpu/stock/criu), CTL (cuda-checkpoint-ctl in PATH), PLUGINS (/usr/lib/criu,
# holding criu_gpu_plugin.so), UPSTREAM_PLUGINS (/usr/local/lib/criu-gpu/upstream-cuda), IMAGES
# (/dev/shm/bench-criu), DISK (/var/tmp, for the disk ceiling), WORK (/tmp/bench-criu), KEEP (set:
# keep the images and logs of the last run in IMAGES/run, the restore's log and timings in
# IMAGES/run.restore).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sim=0
unset SIZES
unset TREE
ROUNDS=3
STACKS="ours cplug"
ON_DISK=
while [ $# -gt 0 ]; do
	case $1 in
	--sim) sim=1 ;;
	--sizes) SIZES=$2; shift ;;
	--tree) TREE=$2; shift ;;
	--rounds) ROUNDS=$2; shift ;;
	--stacks) STACKS=$2; shift ;;
	--disk) ON_DISK=$2; shift ;;
	*) echo "bench-criu.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
if [ $sim = 1 ]; then
	SIZES=${SIZES-0.25 0.5}
	TREE=${TREE-2 0.125}
	CEIL_GIB=0.5
else
	SIZES=${SIZES-8 32}
	TREE=${TREE-4 4}
	CEIL_GIB=4
fi
CRIU=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
CRIU_STOCK=${CRIU_STOCK:-$(command -v criu-stock || echo /usr/local/lib/criu-gpu/stock/criu)}
CTL=${CTL:-$(command -v cuda-checkpoint-ctl || echo /usr/local/bin/cuda-checkpoint-ctl)}
CRIU_GPU=${CRIU_GPU:-$(command -v criu-gpu || echo /usr/local/bin/criu-gpu)}
PLUGINS=$(realpath "${PLUGINS:-/usr/lib/criu}")
UPSTREAM_PLUGINS=$(realpath "${UPSTREAM_PLUGINS:-/usr/local/lib/criu-gpu/upstream-cuda}")
IMAGES=${IMAGES:-/dev/shm/bench-criu}
DISK=${DISK:-/var/tmp}
if [ -n "$ON_DISK" ]; then
	IMAGES=$ON_DISK/bench-criu
	DISK=$ON_DISK
fi
WORK=${WORK:-/tmp/bench-criu}
SIM=${SIM:-/usr/local/lib/criu-gpu/sim}
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
stamp "$PLUGINS/criu_gpu_plugin.so"

die() { echo "bench-criu.sh: $*" >&2; exit 1; }
for f in "$CRIU" "$CRIU_STOCK" "$CTL" "$CRIU_GPU"; do [ -x "$f" ] || die "$f not found (see the environment above)"; done
[ -e "$PLUGINS/criu_gpu_plugin.so" ] || die "no criu_gpu_plugin.so in $PLUGINS (set PLUGINS)"
[ -e "$UPSTREAM_PLUGINS/cuda_plugin.so" ] || die "no cuda_plugin.so in $UPSTREAM_PLUGINS (set UPSTREAM_PLUGINS)"
[ "$(id -u)" = 0 ] || die "run as root (CRIU dumps and restores the applications)"

daemon=
cleanup() {
	cleanup_apps
	[ -z "$daemon" ] || kill "$daemon" 2>/dev/null
	rm -f "$DISK/bench-criu.ceiling"
	[ -n "${KEEP:-}" ] || rm -rf "$IMAGES"
}
trap cleanup EXIT
rm -rf "$WORK" "$IMAGES"
mkdir -p "$WORK/bin" "$IMAGES"
ln -sf "$CTL" "$WORK/bin/cuda-checkpoint"
gcc -O2 -pthread -o "$WORK/bw" "$here/../../third_party/criu/tests/bw.c" || die "gcc failed"

# The applications: gpu-app on a GPU, cuda-sim-app on the simulated one. app_cmd NAME GIB SEED
# DEVICE prints the command that starts one; app_ready STATUS waits for it; app_check PID STATUS
# makes it check its data and succeeds if all of it is intact.
if [ $sim = 1 ]; then
	[ -e "$SIM/libcuda.so.1" ] || die "no simulated driver in $SIM: run scripts/install.sh"
	mkdir -p "$WORK/sim"
	cp "$SIM/libcuda.so.1" "$SIM/libnvidia-ml.so.1" "$WORK/sim/"
	export CUDA_SIM_SOCKET=$WORK/sim/gpud.sock CUDA_CKPT_LIBCUDA=$WORK/sim/libcuda.so.1
	export CUDA_CKPT_LIBNVML=$WORK/sim/libnvidia-ml.so.1
	cuda-sim-gpud --socket "$CUDA_SIM_SOCKET" --gpus 2 --memory 8GiB --uuid-seed bench \
		</dev/null >/dev/null 2>"$WORK/sim/gpud.log" &
	daemon=$!
	for _ in $(seq 100); do [ -S "$CUDA_SIM_SOCKET" ] && break; sleep 0.1; done
	gpus=2
	# CRIU's C plugin runs only where /proc/driver/nvidia/gpus exists, or with this fault on.
	CPLUG_ENV=(CRIU_FAULT=138)
	app_cmd() {
		echo "env LD_LIBRARY_PATH=$WORK/sim cuda-sim-app --mib $(awk -v g="$2" 'BEGIN { print int(g * 1024) }')" \
			"--seed $3 --device $4 --log $WORK/$1.status"
	}
	app_ready() { wait_for "$1" '^step=' 60; }
	app_check() { # the log must gain 3 more good steps, and hold no mismatch
		local n
		n=$(count "$2" ' ok$')
		for _ in $(seq 300); do [ "$(count "$2" ' ok$')" -ge $((n + 3)) ] && break; sleep 0.1; done
		[ "$(count "$2" ' ok$')" -ge $((n + 3)) ] && ! grep -q MISMATCH "$2"
	}
else
	nvcc -O2 -o "$WORK/gpu-app" "$here/gpu-app.cu" || die "nvcc failed"
	gpus=$(nvidia-smi -L | wc -l)
	CPLUG_ENV=()
	app_cmd() { echo "env CUDA_VISIBLE_DEVICES=$4 $WORK/gpu-app $2 $3 $WORK/$1.status"; }
	app_ready() { wait_for "$1" '^ready' 600; }
	app_check() { verified_ok "$(ask_verify "$1" "$2")"; }
fi

gib_bytes() { awk -v g="$1" 'BEGIN { printf "%d", g * 1073741824 }'; }
gbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.2f", (s > 0 ? b / 1e9 / s : 0) }'; }

ceilings() {
	local t0 bytes=$(($(gib_bytes "$CEIL_GIB") / 1048576))
	say "== ceilings ($(nproc) CPUs; $CEIL_GIB GiB)"
	for t in 1 "$(nproc)"; do "$WORK/bw" "$bytes" "$t" | sed 's/^/  memory /'; done
	local dirs=("$IMAGES" "$DISK")
	[ -z "$ON_DISK" ] || dirs=("$DISK")
	for dir in "${dirs[@]}"; do
		t0=$(now)
		dd if=/dev/zero of="$dir/bench-criu.ceiling" bs=1M count="$bytes" conv=fsync status=none
		say "  write to $dir: $(gbps $((bytes * 1048576)) "$(elapsed "$t0")") GB/s"
		[ "$dir" = "$IMAGES" ] || echo "disk_write $(gbps $((bytes * 1048576)) "$(elapsed "$t0")")" >>"$WORK/ceilings"
		t0=$(now)
		if [ "$dir" = "$IMAGES" ]; then
			dd if="$dir/bench-criu.ceiling" of=/dev/null bs=1M status=none
		else
			dd if="$dir/bench-criu.ceiling" of=/dev/null bs=1M iflag=direct status=none
		fi
		say "  read from $dir: $(gbps $((bytes * 1048576)) "$(elapsed "$t0")") GB/s"
		[ "$dir" = "$IMAGES" ] || echo "disk_read $(gbps $((bytes * 1048576)) "$(elapsed "$t0")")" >>"$WORK/ceilings"
		rm -f "$dir/bench-criu.ceiling"
	done
}

# Phases of one run. The project's plugin writes its own times as data (gpu-timings-dump.json in
# the image directory, gpu-timings-restore.json in the restore's work directory, beside its
# restore.log: a restore leaves the images as they were); CRIU's C plugin does not, so its driver time is the time from each of its
# lock, checkpoint and restore lines to the next line of CRIU's own (its cuda-checkpoint runs in
# between).
plugin_phase() { # DIR COMMAND PHASE: the seconds of the plugin's PHASE of COMMAND (dump, restore)
	python3 - "$1/gpu-timings-$2.json" "$3" <<'EOF'
import json, sys
try:
    phases = json.load(open(sys.argv[1]))["body"]["phases"]
except (OSError, ValueError, KeyError):
    sys.exit(0)
for p in phases:
    if p["name"] == sys.argv[2]:
        print(f"{p['seconds']:.2f}")
EOF
}
gaps_after() { # FILE REGEX: sum over matching lines of the time to the next non-plugin line
	awk -v re="$2" '{ t = substr($1, 2) + 0 }
		hit && !/cuda_plugin/ && /^\([0-9]/ { s += t - last; hit = 0 }
		$0 ~ re { last = t; hit = 1 }
		END { printf "%.2f", s }' "$1"
}
driver_dump() { # STACK DIR
	if [ "$1" = cplug ]; then
		gaps_after "$2/dump.log" 'cuda_plugin: (pausing devices|Checkpointing CUDA devices) on pid'
	else plugin_phase "$2" dump checkpoint; fi
}
driver_restore() {
	if [ "$1" = cplug ]; then
		gaps_after "$2/restore.log" 'cuda_plugin: resuming devices on pid'
	else plugin_phase "$2" restore restore; fi
}
pages_dump() { # CRIU's own stats: the time it spent dumping memory (all processes)
	sed -n 's/^Memory dump time: \([0-9]*\) us/\1/p' "$1/stats.out" | awk '{ printf "%.2f", $1 / 1e6 }'
}
overlapped() { # the deferred pages (patch 0007): "GiB in T s, hooks at H s into it", or -
	sed -nE 's/.*deferred-pages: ([0-9.]+) GiB of .* in place ([0-9.]+) s after .* the late hooks started ([0-9.-]+) s into.*/\1 GiB in \2 s, driver from \3 s/p' \
		"$1/restore.log" | tail -1
}
pages_restore() { # the patched CRIU's summary lines, else the span of the restorer's reads
	if grep -q 'pages: pid [0-9]*: read' "$1/restore.log"; then
		sed -nE 's/.*pages: pid [0-9]+: read .* in ([0-9.]+) s.*/\1/p' "$1/restore.log" |
			sort -g | tail -1
	else
		awk '/ Preadv / { t = substr($1, 2) + 0; p = $2; if (!(p in a)) a[p] = t; b[p] = t }
			END { for (p in a) if (b[p] - a[p] > m) m = b[p] - a[p]; printf "%.2f", m }' "$1/restore.log"
	fi
}

# run CASE STACK: one dump and restore of the case's processes (pids in $roots, $procs,
# status files in $statuses) with STACK; appends a result line.
run() {
	local case=$1 stack=$2 dir="$IMAGES/run" rdir="$IMAGES/run.restore" t0 dump_s restore_s ok=1 i
	local criu=$CRIU lib=$PLUGINS env=() thp=()
	case $stack in
	stock) criu=$CRIU_STOCK ;;
	cplug) criu=$CRIU_STOCK lib=$UPSTREAM_PLUGINS env=(PATH="$WORK/bin:$PATH" "${CPLUG_ENV[@]}") ;;
	ours-seq) env=(CRIU_GPU_OVERLAP=0) ;;
	ours-nothp) env=(CRIU_GPU_THP=off) ;;
	# Huge pages at always for the whole dump and restore, raised and put back the plugin's way.
	ours-thp) thp=("$CRIU_GPU" thp --) ;;
	esac
	rm -rf "$dir" && mkdir -p "$dir"
	t0=$(now)
	if ! env "${env[@]}" timeout 900 "${thp[@]}" "$criu" dump -t "$root" -D "$dir" --lib "$lib" -v4 -o dump.log \
		--display-stats >"$dir/stats.out" 2>&1; then
		fail "$case/$stack: dump"
		grep -E 'Error|criu_gpu|cuda_plugin' "$dir/dump.log" | tail -5
		return 1
	fi
	# On a disk, a dump is done when its images are.
	[ -z "$ON_DISK" ] || sync
	dump_s=$(elapsed "$t0")
	for _ in $(seq 600); do
		for i in "${procs[@]}"; do [ -d "/proc/$i" ] && { sleep 0.05; continue 2; }; done
		break
	done
	if [ -n "$ON_DISK" ]; then
		sync
		echo 3 >/proc/sys/vm/drop_caches
	fi
	t0=$(now)
	rm -rf "$rdir" && mkdir -p "$rdir"
	if ! env "${env[@]}" timeout 900 "${thp[@]}" "$criu" restore -D "$dir" --work-dir "$rdir" -d \
		--lib "$lib" -v4 -o restore.log; then
		fail "$case/$stack: restore"
		grep -E 'Error|criu_gpu|cuda_plugin' "$rdir/restore.log" | tail -5
		return 1
	fi
	restore_s=$(elapsed "$t0")
	for i in "${!apps[@]}"; do app_check "${apps[$i]}" "${statuses[$i]}" || ok=0; done
	if [ $ok = 1 ]; then
		pass "$case/$stack: data intact bit for bit after restore"
	else
		fail "$case/$stack: data NOT intact after restore"
		return 1
	fi
	local dd dp rd rp
	dd=$(driver_dump "$stack" "$dir") dp=$(pages_dump "$dir")
	rd=$(driver_restore "$stack" "$rdir") rp=$(pages_restore "$rdir")
	local ov
	ov=$(overlapped "$rdir")
	printf '  %-10s dump %6.2f s (driver %5s, pages %5s)  restore %6.2f s (driver %5s, pages %5s%s)\n' \
		"$stack" "$dump_s" "${dd:-?}" "${dp:-?}" "$restore_s" "${rd:-?}" "${rp:-?}" "${ov:+; during the driver: $ov}"
	echo "$case $stack $dump_s $restore_s ${dd:-0} ${dp:-0} ${rd:-0} ${rp:-0}" >>"$WORK/results"
}

# start_case NAME N GIB: N applications under one parent shell (a session of its own), device i
# modulo the GPUs; sets root, apps, procs and statuses.
start_case() {
	local name=$1 n=$2 gib=$3 i cmd=""
	: >"$WORK/$name.pids"
	statuses=()
	for i in $(seq 1 "$n"); do
		cmd+="$(app_cmd "$name.$i" "$gib" "$i" $(((i - 1) % gpus))) & echo \$! >>$WORK/$name.pids; "
		statuses+=("$WORK/$name.$i.status")
		: >"$WORK/$name.$i.status"
	done
	setsid bash -c "$cmd wait" </dev/null >/dev/null 2>&1 &
	root=$!
	disown "$root"
	APPS+=("$root")
	for i in "${statuses[@]}"; do app_ready "$i" || return 1; done
	mapfile -t apps <"$WORK/$name.pids"
	APPS+=("${apps[@]}")
	procs=("$root" "${apps[@]}")
}

ceilings
read -r -a stacks <<<"$STACKS"
nstacks=${#stacks[@]}
cases=()
for g in $SIZES; do cases+=("1x$g"); done
read -r tree_n tree_gib <<<"$TREE"
[ -n "${tree_n:-}" ] && cases+=("${tree_n}x$tree_gib")
for c in "${cases[@]}"; do
	n=${c%%x*} gib=${c#*x}
	say "== $c: $n process(es) of $gib GiB on $gpus GPU(s), $ROUNDS round(s)"
	start_case "c$n-$gib" "$n" "$gib" || { fail "$c: the applications did not start"; cleanup_apps; continue; }
	for r in $(seq 0 $((ROUNDS - 1))); do
		for s in $(seq 0 $((nstacks - 1))); do run "$c" "${stacks[$(((r + s) % nstacks))]}" || break 2; done
	done
	cleanup_apps
	for _ in $(seq 200); do
		for i in "${procs[@]}"; do [ -d "/proc/$i" ] && { sleep 0.05; continue 2; }; done
		break
	done
done

say "== medians (GB/s: application data over wall time; x: time over cplug's (and stock's), same run)"
dw=$(awk '$1 == "disk_write" { print $2 }' "$WORK/ceilings" 2>/dev/null)
dr=$(awk '$1 == "disk_read" { print $2 }' "$WORK/ceilings" 2>/dev/null)
[ -z "$ON_DISK" ] && dw=0 dr=0
[ -s "$WORK/results" ] && awk -v dw="${dw:-0}" -v dr="${dr:-0}" '
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
	k = $1 " " $2
	if (!(k in d)) order[++n] = k
	d[k] = d[k] " " $3; r[k] = r[k] " " $4
	dd[k] = dd[k] " " $5; dp[k] = dp[k] " " $6; rd[k] = rd[k] " " $7; rp[k] = rp[k] " " $8
}
END {
	for (i = 1; i <= n; i++) {
		split(order[i], kk, " "); c = kk[1]; s = kk[2]
		split(c, cn, "x"); bytes = cn[1] * cn[2] * 1073741824
		md = median(d[order[i]]); mr = median(r[order[i]])
		cd = median(d[c " cplug"]); cr = median(r[c " cplug"])
		sd = median(d[c " stock"]); sr = median(r[c " stock"])
		printf "  %-8s %-10s dump %6.2f s %5.2f GB/s x%.2f cplug%s (driver %.2f, pages %.2f)   restore %6.2f s %5.2f GB/s x%.2f cplug%s (driver %.2f, pages %.2f)\n",
			c, s, md, bytes / 1e9 / md, cd ? md / cd : 0, sd ? sprintf(" x%.2f stock", md / sd) : "", median(dd[order[i]]), median(dp[order[i]]),
			mr, bytes / 1e9 / mr, cr ? mr / cr : 0, sr ? sprintf(" x%.2f stock", mr / sr) : "", median(rd[order[i]]), median(rp[order[i]])
		if (s == "ours") { od[c] = md; ors[c] = mr; ocd[c] = cd; ocr[c] = cr; ob[c] = bytes }
	}
	print "== goals (ours; cplug = CRIU C cuda_plugin on stock CRIU 4.2.1, same run)"
	for (c in od) {
		split(c, cn, "x")
		if (cn[1] == 1 && cn[2] >= 8 && cn[2] < 32)
			printf "  %s dump <= 0.5x cplug: x%.2f %s\n", c, od[c] / ocd[c], (od[c] / ocd[c] <= 0.5 ? "MET" : "not met")
		if (cn[1] == 1 && cn[2] >= 32)
			printf "  %s restore >= 6 GB/s: %.2f GB/s %s\n", c, ob[c] / 1e9 / ors[c], (ob[c] / 1e9 / ors[c] >= 6 ? "MET" : "not met")
		if (cn[1] == 4 && cn[2] == 4)
			printf "  %s dump <= 0.25x cplug: x%.2f %s\n", c, od[c] / ocd[c], (od[c] / ocd[c] <= 0.25 ? "MET" : "not met")
		if (dw > 0)
			printf "  %s on disk: dump %.2f GB/s = %.2f of the disk write (goal 0.8), restore %.2f GB/s = %.2f of the disk read (goal 0.8)\n",
				c, ob[c] / 1e9 / od[c], ob[c] / 1e9 / od[c] / dw, ob[c] / 1e9 / ors[c], ob[c] / 1e9 / ors[c] / dr
	}
}' "$WORK/results"
summary
