#!/bin/bash
# GPU containers checkpointed and restored through CRIU and the plugin, by the runtimes users
# run: Podman (runc), containerd with ctr, and runc itself (what containerd and CRI-O call for
# the kubelet's checkpoint API). One command on the GPU machine (Ubuntu 24.04, driver 580, no
# container runtime, no network), with .carry (scripts/gpu/pack-carry.sh) and .carry-ct
# (scripts/gpu/containers/pack.sh) carried:
#
#   bash scripts/gpu/containers/run.sh [--sim] [PART...]
#
# PART (default: all, in this order):
#   podman      podman-cuda: a CUDA container (ct-app.cu, built here with nvcc: 1 GiB of device
#               data checked every 200 ms) given the GPU by CDI (--device nvidia.com/gpu=0):
#               checkpoint --export, rm, restore --import, the data checked; criu-gpu inspect and
#               check on the archive; checkpoint --leave-running; one archive restored twice.
#               podman-torch: a deterministic PyTorch training container checkpointed part-way
#               and restored; its log equals an uninterrupted run's, line for line.
#   containerd  ctr run of the same CUDA container; ctr tasks checkpoint --image-path (what the
#               kubelet API asks of containerd; the task runs on); ctr containers checkpoint,
#               images export, removal, import, restore; runc checkpoint / runc restore of a
#               bundle (what containerd and CRI-O call).
#   othergpu    (2 GPUs; SKIP on one) a container checkpointed on GPU 0 and restored onto GPU 1:
#               what happens first (measured and printed), then what makes it work.
#   failures    CRIU SIGKILLed mid-dump after the GPU lock: the container runs on with its
#               data; a restore that cannot get its GPU memory (another process holds it): the
#               archive stays restorable and is restored once the memory is free.
#   overhead    checkpoint and restore of the same application in a container (podman), set
#               against the bare-process baseline measured again right after; the ratios.
# Every run first measures that baseline (the application as a process of this machine, dumped
# with criu-gpu dump and restored with criu-gpu restore, same size), so each container time
# printed has its ratio to the bare process of the same run.
# --sim: on a machine without a GPU, against the simulated GPU (cuda-sim-gpud with two GPUs,
#   cuda-sim-app instead of ct-app; no PyTorch): the same flows, nothing installed on the host
#   (the runtimes' state, CRIU's settings and the CDI spec stay under the work directory).
#
# Every step is bounded; lines go to $OUT/containers.log as they come, with PASS, FAIL, SKIP or
# INFO for each check, and a table in $OUT/summary.txt (rewritten after every check); the
# CRIU logs and outputs of the steps are packed into $OUT/results.tgz after every part. Exit
# status 1 if any check failed.
# Environment: OUT (/tmp/criu-gpu-containers), WORK (/dev/shm/criu-gpu-ct), GIB (1: device
# data of the CUDA containers), DEADLINE_S (450 on a GPU: later parts are skipped, said so),
# DRIVER_DIR (/usr/local/nvidia/lib64), KEEP=1 (keep WORK), STORAGE_DRIVER (overlay where the
# kernel has it, else vfs; overlay falls back to vfs by itself when a container cannot start).
#
# What it sets up on the GPU machine (a lent machine, nothing of it outlives the run): the
# runtimes unpacked under WORK; /usr/local/sbin/criu (calls .carry's CRIU),
# /usr/lib/criu/criu_gpu_plugin.so, /etc/criu/runc.conf and crun.conf (criu-gpu runtime-config,
# as scripts/install.sh does), /etc/criu/gpu-plugin.conf, /etc/containers/policy.json and
# /etc/cdi/nvidia.json (the GPUs as NVIDIA's container toolkit describes them: gpuspec.py).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
MODE=gpu
PARTS=()
for a in "$@"; do
	case $a in
	--sim) MODE=sim ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	podman) PARTS+=(podman-cuda podman-torch) ;;
	podman-cuda | podman-torch | containerd | othergpu | failures | overhead) PARTS+=("$a") ;;
	*) echo "run.sh: unknown argument $a (see --help)" >&2; exit 2 ;;
	esac
done
[ ${#PARTS[@]} -gt 0 ] || PARTS=(podman-cuda podman-torch containerd othergpu failures overhead)
OUT=${OUT:-/tmp/criu-gpu-containers}
W=${WORK:-/dev/shm/criu-gpu-ct}
GIB=${GIB:-1}
DRIVER_DIR=${DRIVER_DIR:-/usr/local/nvidia/lib64}
if [ $MODE = gpu ]; then DEADLINE_S=${DEADLINE_S:-450}; else DEADLINE_S=${DEADLINE_S:-1500}; fi
CARRY=$root/.carry
CT=$W/ct
RES=$W/results
LOG=$OUT/containers.log
SUMMARY=$OUT/summary.txt
IMG=localhost/criu-gpu-ct:latest
NS=criu-gpu-ct
mkdir -p "$OUT"
# One run at a time on a work directory (a second one would delete the first one's).
exec 9>"$W.lock"
flock -n 9 || { echo "run.sh: another run uses $W" >&2; exit 1; }
: >"$LOG"
# The commit and the plugin's build-id first (the helpers' own output functions follow).
# shellcheck source=scripts/gpu/lib.sh
. "$here/../lib.sh"
LOG_FILE=$LOG stamp "$root/.carry/plugins/criu_gpu_plugin.so"
T0=$(date +%s.%N)
PASS=0 FAIL=0 SKIPPED=0
ROWS=()
PART=setup

# ---- output -------------------------------------------------------------------------------

since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
log() { printf '[%6.1f] %s\n' "$(since "$T0")" "$*" | tee -a "$LOG"; }
write_summary() {
	{
		printf '%-5s | %-12s | %-44s | %s\n' result part check detail
		printf '%s\n' "------+--------------+----------------------------------------------+-------"
		local r a b c d
		for r in "${ROWS[@]}"; do
			IFS='|' read -r a b c d <<<"$r"
			printf '%-5s | %-12s | %-44s | %s\n' "$a" "$b" "$c" "$d"
		done
		printf '%s\n' "passed: $PASS  failed: $FAIL  skipped: $SKIPPED  ($MODE, $(since "$T0") s)"
	} >"$SUMMARY"
}
result() { # result PASS|FAIL|SKIP|INFO CHECK [DETAIL]
	local detail=${3:-}
	case $1 in
	PASS) PASS=$((PASS + 1)) ;;
	FAIL) FAIL=$((FAIL + 1)) ;;
	SKIP) SKIPPED=$((SKIPPED + 1)) ;;
	esac
	log "$1 [$PART] $2${detail:+: $detail}"
	ROWS+=("$1|$PART|$2|${detail//|//}")
	write_summary
}
pass() { result PASS "$@"; }
fail() { result FAIL "$@"; }
skip() { result SKIP "$@"; }
info() { result INFO "$@"; }
check() { # check CHECK DETAIL COMMAND...: PASS if the command succeeds
	local c=$1 d=$2
	shift 2
	if "$@"; then pass "$c" "$d"; else fail "$c" "$d"; fi
}
# fact TEXT: a measured fact, in the log only.
fact() { log "  fact: $*"; }
indent() { sed 's/^/    | /' | tee -a "$LOG" >/dev/null; }

N=0
# x LIMIT NAME COMMAND...: runs COMMAND for at most LIMIT seconds, its output in $RES/NAME.out
# (the last lines in the log when it fails); sets RC and SECS.
x() {
	local limit=$1 name=$2 t cmd
	shift 2
	N=$((N + 1))
	t=$(date +%s.%N)
	timeout -k 10 "$limit" "$@" </dev/null >"$RES/$name.out" 2>&1
	RC=$?
	SECS=$(since "$t")
	cmd="$*"
	[ ${#cmd} -gt 240 ] && cmd="${cmd:0:240}..."
	log "  \$ $cmd -> rc=$RC in $SECS s"
	if [ $RC != 0 ]; then
		tail -n 12 "$RES/$name.out" | indent
		[ $RC = 124 ] && log "    (stopped after $limit s)"
	fi
	return $RC
}

# ---- reading the applications' logs -----------------------------------------------------

steps() { grep -c ' ok$' "$1" 2>/dev/null || true; }
last_step() { grep ' ok$' "$1" 2>/dev/null | tail -1 | sed -n 's/^step=\([0-9]*\) .*/\1/p'; }
bad_lines() { grep -E '^(MISMATCH|ERROR)' "$1" 2>/dev/null | head -3; }
# wait_steps LOG N SECONDS: until LOG has N verified steps (false at once on a bad line).
wait_steps() {
	local i
	for i in $(seq 1 $(($3 * 10))); do
		[ -n "$(bad_lines "$1")" ] && return 1
		[ "$(steps "$1")" -ge "$2" ] && return 0
		sleep 0.1
	done
	return 1
}
# advances LOG [N] [SECONDS]: N more verified steps (default 3 in 60 s) and no bad line.
advances() { wait_steps "$1" $(($(steps "$1") + ${2:-3})) "${3:-60}"; }
# consecutive LOG: the steps logged count up one by one from 1 and the application started once
# (a restored process goes on from where it was; one started afresh would log start and step=1).
consecutive() {
	[ "$(grep -c '^start' "$1")" = 1 ] &&
		grep ' ok$' "$1" | sed -n 's/^step=\([0-9]*\) .*/\1/p' | awk '$1 != NR { exit 1 }'
}
# healthy LOG: N more steps, no bad line; the detail of a failure is in the log.
healthy() {
	if advances "$1" "${2:-3}" "${3:-60}"; then return 0; fi
	log "    app log: $(tail -n 3 "$1" | tr '\n' ' ')"
	return 1
}

# ---- the GPU -----------------------------------------------------------------------------

# gpu_used I: MiB used on GPU I
gpu_used() {
	if [ $MODE = gpu ]; then
		timeout 30 nvidia-smi -i "$1" --query-gpu=memory.used --format=csv,noheader,nounits | tr -d ' '
	else
		timeout 30 "$CARRY/bin/cuda-checkpoint-ctl" --gpus --json |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["gpus"][int(sys.argv[1])]["memory_used"] >> 20)' "$1"
	fi
}
gpu_free() {
	if [ $MODE = gpu ]; then
		timeout 30 nvidia-smi -i "$1" --query-gpu=memory.free --format=csv,noheader,nounits | tr -d ' '
	else
		timeout 30 "$CARRY/bin/cuda-checkpoint-ctl" --gpus --json |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["gpus"][int(sys.argv[1])]["memory_free"] >> 20)' "$1"
	fi
}
# apps_on_gpus: which process runs on which GPU, as the driver tells
apps_on_gpus() {
	if [ $MODE = gpu ]; then
		timeout 30 nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader
	else
		timeout 30 "$CARRY/bin/cuda-checkpoint-ctl" --list 2>&1
	fi
}

# ---- settings of the plugin (what a runtime's CRIU reads) ---------------------------------

# plugin_set KEY VALUE | plugin_set KEY: sets or removes a line of the plugin's settings file.
plugin_set() {
	local tmp=$PLUGIN_CONF.new
	grep -v "^$1=" "$PLUGIN_CONF" >"$tmp" 2>/dev/null || true
	[ $# -gt 1 ] && echo "$1=$2" >>"$tmp"
	mv "$tmp" "$PLUGIN_CONF"
}

cleanup() {
	local c
	PART=cleanup
	[ -x "$CT/bin/podman" ] && for c in $(timeout 60 "$CT/bin/podman" ps -a --format '{{.Names}}' 2>/dev/null | grep '^ctg-'); do
		timeout 60 "$CT/bin/podman" rm -f -t 0 "$c" >/dev/null 2>&1
	done
	if [ -n "${CTD_PID:-}" ]; then
		for c in $(timeout 20 "$CT/bin/ctr" --address "$W/containerd/containerd.sock" -n "$NS" tasks list -q 2>/dev/null); do
			timeout 20 "$CT/bin/ctr" --address "$W/containerd/containerd.sock" -n "$NS" tasks kill -s SIGKILL "$c" >/dev/null 2>&1
		done
		sleep 1
		kill "$CTD_PID" 2>/dev/null
		for c in $(pgrep -f "containerd-shim-runc-v2 .*-address $W/containerd/containerd.sock"); do kill -9 "$c" 2>/dev/null; done
		# runc's state of this namespace's containers (the shims keep it there).
		unmount_under "/run/containerd/runc/$NS"
		rm -rf "/run/containerd/runc/$NS"
	fi
	if [ -d "$W/runc-state" ]; then
		for c in $(timeout 20 "$CT/bin/runc" --root "$W/runc-state" list -q 2>/dev/null); do
			timeout 20 "$CT/bin/runc" --root "$W/runc-state" delete -f "$c" >/dev/null 2>&1
		done
	fi
	for c in "${BARE[@]}"; do kill -9 "$c" 2>/dev/null; done
	[ -n "${GPUD_PID:-}" ] && kill "$GPUD_PID" 2>/dev/null
	[ -n "${SIM_CDI:-}" ] && rm -f "$SIM_CDI"
	# Mounts left under the work directory (container root file systems, snapshots).
	unmount_under "$W"
	pack_results
	if [ "${KEEP:-0}" != 1 ] && ! grep -q " $W/" /proc/mounts; then rm -rf "$W"; fi
}
# unmount_under DIR...: every mount below these directories, deepest first.
unmount_under() {
	local d m
	for d in "$@"; do
		awk -v d="$d/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
	done
}
pack_results() { [ -d "$RES" ] && tar -C "$RES" -czf "$OUT/results.tgz" . 2>/dev/null; }
BARE=()
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

left() { awk -v a="$T0" -v b="$(date +%s.%N)" -v d="$DEADLINE_S" 'BEGIN { printf "%d", d - (b - a) }'; }

# ---- setup ---------------------------------------------------------------------------------

setup() {
	local b lib missing
	log "criu-gpu containers test, mode $MODE, parts: ${PARTS[*]}, work directory $W, deadline $DEADLINE_S s"
	[ "$(id -u)" = 0 ] || { fail "root" "run as root (CRIU, the runtimes)"; return 1; }
	# A previous run's leftovers.
	unmount_under "$W" "/run/containerd/runc/$NS"
	rm -rf "$W" "/run/containerd/runc/$NS"
	mkdir -p "$W" "$RES" "$W/logs" "$W/app" "$CT/bin"
	fact "kernel $(uname -r); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
	fact "cgroup: $(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup; overlay: $(grep -qw overlay /proc/filesystems && echo yes || echo no); $W on $(stat -fc %T "$W")"
	for b in criu criu-gpu cuda-checkpoint-ctl; do
		[ -x "$CARRY/bin/$b" ] || { fail "carried tools" "$CARRY/bin/$b missing: run scripts/gpu/containers/pack.sh here, carry .carry and .carry-ct"; return 1; }
	done
	PY=$(command -v python3 || echo /opt/torch/.venv/bin/python3)
	"$PY" -c 'import json' || { fail "python3" "no python3 ($PY)"; return 1; }
	fact "python3: $PY"

	# The runtimes: carried (.carry-ct), or this machine's own in --sim mode when none is packed.
	if [ -f "$root/.carry-ct/ct.tar.xz" ]; then
		x 120 unpack tar -C "$CT" -xJf "$root/.carry-ct/ct.tar.xz" || { fail "unpack .carry-ct"; return 1; }
		log "  runtimes from .carry-ct: $(grep -E '^(podman|conmon|runc|containerd) ' "$CT/etc/MANIFEST" | tr '\n' ';')"
		mkdir -p "$CT/real" "$CT/libneed"
		mv "$CT/bin/"* "$CT/real/"
		# Only the libraries this machine lacks come from the carried ones.
		for b in "$CT"/real/*; do
			for lib in $(ldd "$b" 2>/dev/null | awk '/not found/ { print $1 }'); do
				[ -e "$CT/lib/$lib" ] && ln -sf "$CT/lib/$lib" "$CT/libneed/$lib"
			done
		done
		# Their own dependencies, once more (a carried library may need another).
		for lib in "$CT"/libneed/*; do
			[ -e "$lib" ] || continue
			for missing in $(ldd "$lib" 2>/dev/null | awk '/not found/ { print $1 }'); do
				[ -e "$CT/lib/$missing" ] && ln -sf "$CT/lib/$missing" "$CT/libneed/$missing"
			done
		done
		fact "libraries this machine lacks, taken from .carry-ct: $(find "$CT/libneed" -mindepth 1 -printf '%f ')"
		for b in "$CT"/real/*; do
			local name
			name=$(basename "$b")
			if [ "$name" = runc ]; then continue; fi
			if LD_LIBRARY_PATH="$CT/libneed" ldd "$b" | grep -q 'not found'; then
				fail "runtime libraries" "$name: $(LD_LIBRARY_PATH="$CT/libneed" ldd "$b" | grep 'not found' | tr '\n' ' ')"
				return 1
			fi
			# shellcheck disable=SC2016 # written for the wrapper to expand
			printf '#!/bin/sh\n# %s with the carried libraries this machine lacks\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
				"$name" "$CT/libneed" "$b" >"$CT/bin/$name"
			chmod +x "$CT/bin/$name"
		done
		RUNC_REAL=$CT/real/runc
		cp "$CT/etc/policy.json" "$CT/etc/registries.conf" "$W/"
	elif [ $MODE = sim ]; then
		for b in podman conmon ctr containerd containerd-shim-runc-v2; do ln -s "$(command -v "$b")" "$CT/bin/$b"; done
		RUNC_REAL=$(command -v runc)
		cp /etc/containers/policy.json /etc/containers/registries.conf "$W/"
		info "runtimes" "no .carry-ct: this machine's own"
	else
		fail "runtimes" "$root/.carry-ct/ct.tar.xz missing: run scripts/gpu/containers/pack.sh and carry .carry-ct"
		return 1
	fi
	for b in podman conmon runc containerd ctr; do
		[ $b = runc ] && continue
		fact "$b: $("$CT/bin/$b" --version 2>&1 | head -1)"
	done

	CRIU_BIN=$CARRY/bin/criu
	if [ $MODE = gpu ]; then
		PLUGIN_CONF=/etc/criu/gpu-plugin.conf
		SIM_PLUGIN_ENV=
	else
		PLUGIN_CONF=$W/gpu-plugin.conf
		SIM_PLUGIN_ENV="CRIU_GPU_CONFIG=$PLUGIN_CONF "
		export CRIU_GPU_CONFIG=$PLUGIN_CONF
	fi
	mkdir -p "$(dirname "$PLUGIN_CONF")"
	cp "$root/container-hooks/gpu-plugin.conf" "$PLUGIN_CONF"

	# runc, as the runtimes call it. Only this runner does this; users' nodes need none of it.
	#  - the lent GPU machine refuses setrlimit(RLIMIT_NOFILE) (this CI machine too): `runc create`
	#    fails on the RLIMIT_NOFILE every runtime puts in a container's spec, so the wrapper
	#    takes process.rlimits out of the bundle's config.json (and of `runc exec --process`);
	#  - the CRIU to run is named (--criu), whatever PATH conmon and the shims pass on;
	#  - --sim: the simulated driver's settings for the plugin (CRIU_GPU_CONFIG).
	cat >"$CT/bin/runc" <<-EOF
		#!/bin/bash
		# QUIRK OF THE TEST MACHINES, written by scripts/gpu/containers/run.sh: see there.
		bundle=. process=
		args=("\$@")
		for ((i = 0; i < \${#args[@]}; i++)); do
			case \${args[i]} in
			--bundle | -b) bundle=\${args[i + 1]} ;;
			--bundle=*) bundle=\${args[i]#*=} ;;
			--process | -p) process=\${args[i + 1]} ;;
			--process=*) process=\${args[i]#*=} ;;
			esac
		done
		for f in "\$bundle/config.json" "\$process"; do
			[ -f "\$f" ] && grep -q '"rlimits"' "\$f" && $PY - "\$f" <<'PYEOF'
		import json, sys
		p = sys.argv[1]
		c = json.load(open(p))
		(c.get("process", c)).pop("rlimits", None)
		json.dump(c, open(p, "w"))
		PYEOF
		done
		echo "\$(date +%T.%N) runc \$*" >>"$W/runc-calls.log"
		${SIM_PLUGIN_ENV:-}exec "$RUNC_REAL" --criu "$CRIU_BIN" "\$@"
	EOF
	chmod +x "$CT/bin/runc"
	export PATH="$CT/bin:$CARRY/bin:$PATH"
	fact "runc: $("$CT/bin/runc" --version | head -1)"

	setup_criu || return 1
	setup_gpu || return 1
	setup_image || return 1
	setup_podman || return 1
	if [ $MODE = gpu ]; then
		# What `criu-gpu doctor` says of this node, runtimes and CRIU settings installed.
		x 120 doctor criu-gpu doctor
		sed 's/^/    /' "$RES/doctor.out" | tee -a "$LOG" >/dev/null
	fi
	pass "setup" "runtimes, CRIU $("$CRIU_BIN" --version | sed -n 's/^Version: //p'), GPUs: $NGPU, image $IMG"
}

setup_criu() {
	local tmpl
	PLUG_DIR=$CARRY/plugins
	if [ $MODE = gpu ]; then
		# Installed where scripts/install.sh installs them.
		mkdir -p /usr/local/sbin /usr/lib/criu /etc/criu
		printf '#!/bin/sh\n# the project'"'"'s CRIU, carried (scripts/gpu/containers/run.sh)\nexec %s "$@"\n' "$CARRY/bin/criu" >/usr/local/sbin/criu
		chmod +x /usr/local/sbin/criu
		cp "$CARRY/plugins/criu_gpu_plugin.so" /usr/lib/criu/criu_gpu_plugin.so
		PLUG_DIR=/usr/lib/criu
		CRIU_CONF=/etc/criu/runc.conf
		x 60 runtime-config criu-gpu runtime-config --criu "$CRIU_BIN" --template "$root/container-hooks/criu/runc.conf" \
			/etc/criu/runc.conf /etc/criu/crun.conf
		sed 's/^/  /' "$RES/runtime-config.out" | tee -a "$LOG"
		if ! ldconfig -p | grep -q 'libcuda.so.1 '; then
			# Runtimes start CRIU without the caller's LD_LIBRARY_PATH.
			fact "libcuda.so.1 is not in the loader's cache: /etc/criu/gpu-plugin.conf names $DRIVER_DIR"
			plugin_set CUDA_CKPT_LIBCUDA "$DRIVER_DIR/libcuda.so.1"
			plugin_set CUDA_CKPT_LIBNVML "$DRIVER_DIR/libnvidia-ml.so.1"
		fi
		mkdir -p /etc/containers
		[ -e /etc/containers/policy.json ] || cp "$W/policy.json" /etc/containers/policy.json
		ANNOT=()
	else
		# Nothing on the host: CRIU's settings reach runc by the org.criu.config annotation.
		CRIU_CONF=$W/criu-runc.conf
		tmpl=$W/criu-runc.template
		sed "s|^lib .*|lib $PLUG_DIR|" "$root/container-hooks/criu/runc.conf" >"$tmpl"
		x 60 runtime-config criu-gpu runtime-config --criu "$CRIU_BIN" --template "$tmpl" "$CRIU_CONF"
		sed 's/^/  /' "$RES/runtime-config.out" | tee -a "$LOG"
		ANNOT=(--annotation "org.criu.config=$CRIU_CONF")
	fi
	grep -q '^network-lock' "$CRIU_CONF" && log "  CRIU's settings for runc ($CRIU_CONF): $(grep -E '^(lib|timeout|network-lock) ' "$CRIU_CONF" | tr '\n' ';')"
	fact "criu check: $("$CRIU_BIN" check 2>&1 | tail -1); network_lock_nftables: $("$CRIU_BIN" check --feature network_lock_nftables 2>&1 | tail -1)"
	fact "iptables-restore: $(command -v iptables-restore || echo none); ip6tables-restore: $(command -v ip6tables-restore || echo none); ip: $(command -v ip || echo none)"
	return 0
}

setup_gpu() {
	local i
	if [ $MODE = gpu ]; then
		command -v nvidia-smi >/dev/null || { fail "GPU" "no nvidia-smi"; return 1; }
		export LD_LIBRARY_PATH="$DRIVER_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
		timeout 60 nvidia-smi -L | tee -a "$LOG"
		NGPU=$(timeout 60 nvidia-smi -L | grep -c '^GPU')
		mapfile -t UUIDS < <(timeout 60 nvidia-smi --query-gpu=uuid --format=csv,noheader)
		fact "driver $(timeout 30 nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1); device nodes: $(find /dev -maxdepth 1 -name 'nvidia*' -printf '%f ')"
		fact "libcuda in the loader's cache: $(ldconfig -p | grep -c libcuda); $DRIVER_DIR: $(find "$DRIVER_DIR" -maxdepth 1 -name 'lib*' 2>/dev/null | wc -l) libraries; in /usr/lib: $(find /usr/lib/x86_64-linux-gnu -maxdepth 1 -name 'libcuda.so*' -printf '%f ' 2>/dev/null)"
		KIND=nvidia.com/gpu
		CDI=/etc/cdi/nvidia.json
		x 120 cdi "$PY" "$here/gpuspec.py" cdi "$CDI" --kind "$KIND" --gpu "$DRIVER_DIR" || { fail "CDI spec"; return 1; }
		command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
		# Code for this machine's GPUs (no JIT in the container); plain nvcc if -arch=native fails.
		x 180 nvcc nvcc -O2 -arch=native -o "$W/app/ct-app" "$here/ct-app.cu" ||
			x 180 nvcc-plain nvcc -O2 -o "$W/app/ct-app" "$here/ct-app.cu" || { fail "nvcc ct-app.cu"; return 1; }
		fact "ct-app links: $(ldd "$W/app/ct-app" | awk '{ print $1 }' | tr '\n' ' ')"
		cp "$here/train.py" "$W/app/"
		APP=(/app/ct-app "$GIB" 7 /logs/app.log 200)
		BARE_APP=("$W/app/ct-app" "$GIB" 7)
		BARE_INTERVAL=200
		APP_MIB=$(awk -v g="$GIB" 'BEGIN { printf "%d", g * 1024 }')
	else
		local sim=$root/target/release
		[ -x "$sim/cuda-sim-gpud" ] && [ -x "$sim/cuda-sim-app" ] && [ -f "$sim/libcuda.so" ] || sim=
		mkdir -p "$W/sim/lib" "$W/sim/sock"
		if [ -n "$sim" ]; then
			cp "$sim/cuda-sim-gpud" "$sim/cuda-sim-app" "$W/sim/"
			cp "$sim/libcuda.so" "$W/sim/lib/libcuda.so.1"
		else
			cp /usr/local/bin/cuda-sim-gpud /usr/local/bin/cuda-sim-app "$W/sim/"
			cp /usr/local/lib/criu-gpu/sim/libcuda.so.1 "$W/sim/lib/libcuda.so.1"
		fi
		cp "$W/sim/lib/libcuda.so.1" "$W/sim/lib/libnvidia-ml.so.1"
		NGPU=2
		sim_gpud --device-nodes
		export CUDA_SIM_SOCKET=$W/sim/sock/gpud.sock CUDA_CKPT_LIBCUDA=$W/sim/lib/libcuda.so.1 \
			CUDA_CKPT_LIBNVML=$W/sim/lib/libnvidia-ml.so.1
		plugin_set CUDA_SIM_SOCKET "$CUDA_SIM_SOCKET"
		plugin_set CUDA_CKPT_LIBCUDA "$CUDA_CKPT_LIBCUDA"
		plugin_set CUDA_CKPT_LIBNVML "$CUDA_CKPT_LIBNVML"
		x 30 sim-gpus "$CARRY/bin/cuda-checkpoint-ctl" --gpus --json || { fail "simulated GPU"; return 1; }
		mapfile -t UUIDS < <("$PY" -c 'import json,sys; [print(g["uuid"]) for g in json.load(open(sys.argv[1]))["gpus"]]' "$RES/sim-gpus.out")
		fact "simulated GPUs: ${UUIDS[*]}"
		KIND=criu-gpu-sim.example/gpu
		SIM_CDI=/var/run/cdi/criu-gpu-ct-sim-$$.json
		CDI=$SIM_CDI
		x 60 cdi "$PY" "$here/gpuspec.py" cdi "$CDI" --kind "$KIND" --sim "$RES/sim-gpus.out" "$W/sim/lib" "$W/sim/sock" ||
			{ fail "CDI spec"; return 1; }
		cp "$W/sim/cuda-sim-app" "$W/app/"
		APP=(/app/cuda-sim-app --mib 64 --log /logs/app.log --interval-ms 100)
		BARE_APP=("$W/sim/cuda-sim-app" --lib "$W/sim/lib/libcuda.so.1" --mib 64 --interval-ms 100 --log)
		BARE_INTERVAL=100
		APP_MIB=64
	fi
	sed 's/^/  /' "$RES/cdi.out" | tee -a "$LOG"
	cp "$CDI" "$RES/cdi-spec.json"
	log "  CDI spec $CDI: devices $("$PY" -c 'import json,sys; print(" ".join(d["name"] for d in json.load(open(sys.argv[1]))["devices"]))' "$CDI")"
	[ ${#UUIDS[@]} -ge 1 ] || { fail "GPU" "no GPU found"; return 1; }
	return 0
}

# sim_gpud [--device-nodes]: (re)starts the simulated GPUs (two, 1 GiB each, the same UUIDs every
# time). With device nodes, NVML reports /dev/nvidiaN and the plugin wants them in a restored
# container, as on a real GPU (the CDI spec makes them up: char 195:N).
sim_gpud() {
	local i
	if [ -n "${GPUD_PID:-}" ]; then
		kill "$GPUD_PID" 2>/dev/null
		wait "$GPUD_PID" 2>/dev/null
	fi
	rm -f "$W/sim/sock/gpud.sock"
	setsid "$W/sim/cuda-sim-gpud" --socket "$W/sim/sock/gpud.sock" --gpus "$NGPU" --memory 1GiB \
		--uuid-seed "ct-$$" "$@" </dev/null >>"$RES/gpud.log" 2>&1 &
	GPUD_PID=$!
	SIM_NODES=${1:-}
	for i in $(seq 100); do [ -S "$W/sim/sock/gpud.sock" ] && break; sleep 0.1; done
}

# The container image: a root file system of directories and links, with the machine's own
# /usr (and /opt/torch) bind-mounted in when a container runs. The GPU reaches it through CDI.
setup_image() {
	local r=$W/rootfs d
	mkdir -p "$r"/{etc,tmp,logs,app,run,dev,proc,sys,var/tmp,opt/torch,root}
	chmod 1777 "$r/tmp" "$r/var/tmp"
	BINDS=()
	for d in bin sbin lib lib64; do
		if [ -L "/$d" ]; then
			ln -s "$(readlink "/$d")" "$r/$d"
		elif [ -d "/$d" ]; then
			mkdir -p "$r/$d"
			BINDS+=("/$d")
		fi
	done
	for d in /usr/bin /usr/sbin /usr/lib /usr/lib64 /usr/libexec /usr/share; do
		[ -d "$d" ] && [ ! -L "$d" ] && mkdir -p "$r$d" && BINDS+=("$d")
	done
	for f in passwd group ld.so.cache nsswitch.conf; do [ -f "/etc/$f" ] && cp "/etc/$f" "$r/etc/"; done
	x 60 image-tar tar -C "$r" -cf "$W/rootfs.tar" . || { fail "image"; return 1; }
	VOLS=()
	for d in "${BINDS[@]}"; do VOLS+=(-v "$d:$d:ro"); done
	fact "container root: a directory tree; bind-mounted read-only from this machine: ${BINDS[*]}"
	return 0
}

setup_podman() {
	local driver=vfs
	grep -qw overlay /proc/filesystems && driver=overlay
	driver=${STORAGE_DRIVER:-$driver}
	mkdir -p "$W/cni"
	cat >"$W/containers.conf" <<-EOF
		[containers]
		netns = "none"
		default_ulimits = []
		[network]
		network_backend = "cni"
		cni_plugin_dirs = ["$W/cni"]
		network_config_dir = "$W/cni"
		[engine]
		runtime = "runc"
		conmon_path = ["$CT/bin/conmon"]
		cgroup_manager = "cgroupfs"
		events_logger = "file"
		events_logfile_path = "$W/podman-events.log"
		tmp_dir = "$W/libpod-tmp"
		[engine.runtimes]
		runc = ["$CT/bin/runc"]
	EOF
	export CONTAINERS_CONF=$W/containers.conf CONTAINERS_STORAGE_CONF=$W/storage.conf \
		CONTAINERS_REGISTRIES_CONF=$W/registries.conf
	PODMAN_COMMON=(--network none "${ANNOT[@]}" "${VOLS[@]}" -v "$W/app:/app:ro" -e HOME=/tmp)
	while :; do
		cat >"$W/storage.conf" <<-EOF
			[storage]
			driver = "$driver"
			graphroot = "$W/storage"
			runroot = "$W/storage-run"
		EOF
		# A container that starts and ends: the image, the storage driver, conmon and runc.
		if x 120 podman-import podman import "$W/rootfs.tar" "$IMG" &&
			x 120 podman-smoke podman run --rm "${PODMAN_COMMON[@]}" "$IMG" /usr/bin/true; then
			break
		fi
		if [ "$driver" = vfs ]; then
			fail "podman runs a container" "$(tail -n 3 "$RES/podman-smoke.out" "$RES/podman-import.out" 2>/dev/null | tr '\n' ' ')"
			return 1
		fi
		info "podman with overlay storage fails here" "$(tail -n 2 "$RES/podman-smoke.out" 2>/dev/null | tr '\n' ' '); trying vfs"
		unmount_under "$W/storage" "$W/storage-run"
		rm -rf "$W/storage" "$W/storage-run" "$W/libpod-tmp"
		driver=vfs
	done
	SNAPSHOTTER=overlayfs
	[ "$driver" = vfs ] && SNAPSHOTTER=native
	fact "podman storage: $driver under $W/storage (containerd: $SNAPSHOTTER)"
	return 0
}

# ---- podman ------------------------------------------------------------------------------

# userdata NAME: the container's state directory (CRIU's logs with --keep).
userdata() { timeout 30 podman inspect --format '{{.StaticDir}}' "$1" 2>/dev/null; }
ct_pid() { timeout 30 podman inspect --format '{{.State.Pid}}' "$1" 2>/dev/null; }
# keep_log SRC DEST: a CRIU log into RES, short: the plugin's lines, errors and warnings, and
# its last 300 lines (a 1 GiB dump at CRIU's -v4 logs megabytes; $OUT takes little).
keep_log() {
	[ -f "$1" ] || return 0
	{
		grep -E 'criu_gpu|Error|Warn' "$1" | head -n 400
		echo "--- last lines of $1:"
		tail -n 300 "$1"
	} >"$2"
}
# keep_logs NAME TAG: CRIU's logs of the container's last checkpoint or restore into RES.
keep_logs() {
	local d f
	d=$(userdata "$1")
	for f in dump.log restore.log; do
		[ -n "$d" ] && keep_log "$d/$f" "$RES/$2.$f"
	done
}
# plugin_lines FILE: the plugin's lines of a CRIU log, and CRIU's errors.
plugin_lines() { grep -hE 'criu_gpu:|Error \(' "$@" 2>/dev/null | sed 's/^.*criu_gpu:/criu_gpu:/' | tail -n 8; }

# refusal NAME LOG: the plugin's reason for a refused restore (its `Error: criu_gpu:` line) and
# where it was found, first where a user looks first: the runtime's own error output $RES/NAME.out
# (runc 1.2 and later quote CRIU's error lines there), then the CRIU log that runc's error names
# ("log file: PATH", runc 1.1), then LOG (CRIU's log kept from the container's directory).
# Nothing when none has it.
refusal() {
	local out=$RES/$1.out named why
	why=$(grep -m1 -oE 'Error: criu_gpu: .*' "$out" 2>/dev/null)
	if [ -n "$why" ]; then echo "${why#Error: } (in the runtime's error output)"; return; fi
	named=$(grep -m1 -oE 'log file: [^ "]+' "$out" 2>/dev/null | cut -d' ' -f3)
	why=$(grep -m1 -oE 'Error: criu_gpu: .*' "$named" 2>/dev/null)
	if [ -n "$why" ]; then echo "${why#Error: } (in the CRIU log the runtime's error names: $named)"; return; fi
	why=$(grep -m1 -oE 'Error: criu_gpu: .*' "$2" 2>/dev/null)
	[ -n "$why" ] && echo "${why#Error: } (only in CRIU's log of the container's directory)"
}

# run_ct NAME DEVICE [PODMAN OPTIONS]: a CUDA container (APP) with the GPU DEVICE by CDI; waits
# until it has checked its data three times. Its log is $W/logs/NAME/app.log.
run_ct() {
	local name=$1 dev=$2
	shift 2
	mkdir -p "$W/logs/$name"
	: >"$W/logs/$name/app.log"
	x 120 "$name.run" podman run -d --name "$name" --device "$KIND=$dev" "${PODMAN_COMMON[@]}" \
		-v "$W/logs/$name:/logs" "$@" "$IMG" sh -c 'exec "$@" </dev/null >>/logs/app.out 2>&1' sh "${APP[@]}" || return 1
	if ! wait_steps "$W/logs/$name/app.log" 3 90; then
		log "    $name did not check its data 3 times: $(tail -n 3 "$W/logs/$name/app.log" "$W/logs/$name/app.out" 2>/dev/null | tr '\n' ' ')"
		return 1
	fi
}

# container_facts NAME: what the process in the container sees of the GPU.
container_facts() {
	local pid
	pid=$(ct_pid "$1")
	[ -n "$pid" ] && [ "$pid" != 0 ] || return 0
	fact "$1 (pid $pid): /dev: $(find "/proc/$pid/root/dev/" -maxdepth 1 -name '*nvidia*' -printf '%f ' 2>/dev/null)"
	fact "$1: environment: $(tr '\0' '\n' <"/proc/$pid/environ" | grep -E '^(CUDA_|NVIDIA_|LD_LIBRARY_PATH)' | tr '\n' ' ')"
	fact "$1: driver mapped from: $(grep -oE '/[^ ]*lib(cuda|nvidia-ml)[^ ]*' "/proc/$pid/maps" | sort -u | tr '\n' ' ')"
}

part_podman_cuda() {
	local a=ctg-a lg=$W/logs/ctg-a/app.log before used
	run_ct $a 0 || { fail "CUDA container runs (CDI $KIND=0)"; return; }
	pass "CUDA container runs (CDI $KIND=0)" "$(grep -m1 '^start' "$lg")"
	container_facts $a
	used=$(gpu_used 0)
	x 180 a.checkpoint podman container checkpoint --keep --export "$W/a.tar.zst" $a
	local rc=$RC ck=$SECS
	keep_logs $a a.checkpoint
	plugin_lines "$RES/a.checkpoint.dump.log" | indent
	if [ $rc != 0 ]; then fail "checkpoint --export" "rc=$rc"; return; fi
	pass "checkpoint --export" "$ck s ($(vs_bare "$ck" ck)), archive $(du -h "$W/a.tar.zst" | cut -f1), GPU 0 memory ${used} -> $(gpu_used 0) MiB"
	# Read as a node without the zstd program reads it (the GPU machines have none): a zstd that
	# only fails stands first on the PATH.
	mkdir -p "$W/no-zstd"
	printf '#!/bin/sh\necho "zstd is hidden by run.sh: criu-gpu must read .tar.zst itself" >&2\nexit 127\n' >"$W/no-zstd/zstd"
	chmod +x "$W/no-zstd/zstd"
	x 60 a.inspect env PATH="$W/no-zstd:$PATH" criu-gpu inspect "$W/a.tar.zst"
	sed 's/^/    /' "$RES/a.inspect.out" | tee -a "$LOG" >/dev/null
	check "criu-gpu inspect on the archive, no zstd program" "$(grep -ciE 'cuda|gpu' "$RES/a.inspect.out") lines about the GPU" \
		grep -qiE 'GPU-|cuda' "$RES/a.inspect.out"
	x 60 a.check env PATH="$W/no-zstd:$PATH" criu-gpu check "$W/a.tar.zst"
	check "criu-gpu check on the archive, no zstd program" "$(tail -1 "$RES/a.check.out")" test "$RC" = 0
	x 60 a.rm podman rm $a
	before=$(last_step "$lg")
	x 180 a.restore podman container restore --keep --import "$W/a.tar.zst"
	rc=$RC
	local rs=$SECS
	keep_logs $a a.restore
	if [ $rc != 0 ]; then
		plugin_lines "$RES/a.restore.restore.log" | indent
		fail "restore --import" "rc=$rc"
		return
	fi
	if healthy "$lg" && consecutive "$lg"; then
		pass "restore --import, data checked" "$rs s ($(vs_bare "$rs" rs)); step $before -> $(last_step "$lg"), every step once, started once"
	else
		fail "restore --import, data checked" "$(tail -n 2 "$lg" | tr '\n' ' ')"
	fi
	container_facts $a
	EXPORT_S=$ck IMPORT_S=$rs

	# A snapshot: the container runs on.
	before=$(steps "$lg")
	x 180 a.leave podman container checkpoint --keep --leave-running --export "$W/a-lr.tar.zst" $a
	rc=$RC
	keep_logs $a a.leave
	if [ $rc = 0 ] && [ "$(timeout 30 podman inspect --format '{{.State.Status}}' $a 2>/dev/null)" = running ] && healthy "$lg"; then
		pass "checkpoint --leave-running" "$SECS s; running on, step $(last_step "$lg")"
	else
		fail "checkpoint --leave-running" "rc=$rc, state $(timeout 30 podman inspect --format '{{.State.Status}}' $a 2>&1)"
	fi

	# One archive restored twice.
	local n
	for n in 1 2; do
		x 60 "a.rm$n" podman rm -f -t 0 $a
		before=$(steps "$lg")
		x 180 "a.twice$n" podman container restore --keep --import "$W/a-lr.tar.zst"
		rc=$RC
		keep_logs $a "a.twice$n"
		if [ $rc = 0 ] && healthy "$lg"; then
			pass "the snapshot restored (time $n)" "$SECS s; from its step on, data checked: $(tail -n 1 "$lg" | cut -c1-60)"
		else
			plugin_lines "$RES/a.twice$n.restore.log" | indent
			fail "the snapshot restored (time $n)" "rc=$rc"
		fi
	done
	x 60 a.rm3 podman rm -f -t 0 $a
	rm -f "$W/a-lr.tar.zst"
}

part_podman_torch() {
	if [ $MODE = sim ]; then
		skip "PyTorch training container" "no PyTorch on the simulated GPU"
		return
	fi
	[ -x /opt/torch/.venv/bin/python3 ] || { skip "PyTorch training container" "no /opt/torch/.venv"; return; }
	local n lr=$W/logs/ctg-tr-ref/train.log lc=$W/logs/ctg-tr-ck/train.log py pyv=()
	# The venv's python is a link to an interpreter elsewhere: /usr is bound in, anything else
	# (a python built under /opt or /root) is bound in too.
	py=$(readlink -f /opt/torch/.venv/bin/python3)
	fact "the venv's python: $py; $(/opt/torch/.venv/bin/python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1)"
	case $py in
	/usr/* | /opt/torch/*) ;;
	*) pyv=(-v "$(dirname "$(dirname "$py")"):$(dirname "$(dirname "$py")"):ro") ;;
	esac
	for n in ctg-tr-ref ctg-tr-ck; do
		mkdir -p "$W/logs/$n"
		: >"$W/logs/$n/train.log"
		x 120 "$n.run" podman run -d --name $n --device "$KIND=0" "${PODMAN_COMMON[@]}" -v "$W/logs/$n:/logs" \
			-v /opt/torch:/opt/torch:ro "${pyv[@]}" -e CUBLAS_WORKSPACE_CONFIG=:4096:8 -e PYTHONUNBUFFERED=1 "$IMG" \
			sh -c 'exec "$@" </dev/null >>/logs/out 2>&1' sh /opt/torch/.venv/bin/python3 /app/train.py /logs/train.log \
			--steps 250 --sleep 0.02 || { fail "PyTorch container runs"; return; }
	done
	local i
	for i in $(seq 900); do grep -q '^step 60 ' "$lc" && break; grep -q Error "$W/logs/ctg-tr-ck/out" 2>/dev/null && break; sleep 0.1; done
	if ! grep -q '^step 60 ' "$lc"; then
		fail "PyTorch container reaches step 60" "$(tail -n 3 "$W/logs/ctg-tr-ck/out" "$lc" 2>/dev/null | tr '\n' ' ')"
		return
	fi
	x 240 tr.checkpoint podman container checkpoint --keep --compress none --export "$W/tr.tar" ctg-tr-ck
	local rc=$RC ck=$SECS at
	keep_logs ctg-tr-ck tr.checkpoint
	at=$(grep -c '^step' "$lc")
	[ $rc = 0 ] || { plugin_lines "$RES/tr.checkpoint.dump.log" | indent; fail "PyTorch checkpoint --export" "rc=$rc"; return; }
	x 60 tr.rm podman rm ctg-tr-ck
	x 240 tr.restore podman container restore --keep --import "$W/tr.tar"
	rc=$RC
	keep_logs ctg-tr-ck tr.restore
	[ $rc = 0 ] || { plugin_lines "$RES/tr.restore.restore.log" | indent; fail "PyTorch restore --import" "rc=$rc"; return; }
	pass "PyTorch container checkpointed at step $at and restored" "checkpoint $ck s ($(du -h "$W/tr.tar" | cut -f1)), restore $SECS s"
	for i in $(seq 1200); do grep -q '^done' "$lr" && grep -q '^done' "$lc" && break; sleep 0.1; done
	if grep -q '^done' "$lc" && diff <(grep -E '^(step|params)' "$lr") <(grep -E '^(step|params)' "$lc") >"$RES/tr.diff"; then
		pass "training log equals the uninterrupted run" "$(grep -c '^step' "$lc") losses and the parameters equal ($(grep '^params' "$lc"))"
	else
		fail "training log equals the uninterrupted run" "$(head -4 "$RES/tr.diff" | tr '\n' ' ') $(tail -n 2 "$lc" | tr '\n' ' ')"
	fi
	cp "$lr" "$RES/train-reference.log"
	cp "$lc" "$RES/train-restored.log"
	x 60 tr.rm2 podman rm -f -t 0 ctg-tr-ref ctg-tr-ck
	rm -f "$W/tr.tar"
}

# ---- containerd and runc -------------------------------------------------------------------

part_containerd() {
	local d=$W/containerd snap=$SNAPSHOTTER id=ctg-ctd lg=$W/logs/ctg-ctd/app.log i
	mkdir -p "$d"
	# ctr reads its daemon and namespace from these.
	export CONTAINERD_ADDRESS=$d/containerd.sock CONTAINERD_NAMESPACE=$NS
	cat >"$d/config.toml" <<-EOF
		version = 2
		root = "$d/root"
		state = "$d/state"
		disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
		[grpc]
		  address = "$d/containerd.sock"
		[ttrpc]
		  address = "$d/containerd.sock.ttrpc"
	EOF
	if [ $MODE = sim ]; then
		# ctr 1.6 gives a container only device nodes that exist on the host, and the simulated
		# GPU has none: its GPUs without device nodes for this part (NVML reports none, the
		# plugin wants none).
		sim_gpud
		info "simulated GPUs without device nodes for ctr" "ctr run --device takes host nodes only"
	fi
	setsid "$CT/bin/containerd" --config "$d/config.toml" </dev/null >"$RES/containerd.log" 2>&1 &
	CTD_PID=$!
	for i in $(seq 100); do timeout 5 "$CT/bin/ctr" --address "$d/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
	x 30 ctd.version ctr version || { fail "containerd starts"; return; }
	fact "containerd: $(grep -m1 Version "$RES/ctd.version.out" | tr -s ' ')... snapshotter $snap"
	x 120 ctd.save podman save --format docker-archive -o "$W/image.tar" "$IMG" || { fail "image for containerd"; return; }
	x 120 ctd.import ctr images import --snapshotter "$snap" "$W/image.tar"
	x 30 ctd.images ctr images list -q
	grep -qx "$IMG" "$RES/ctd.images.out" || { fail "ctr images import" "$(cat "$RES/ctd.images.out")"; return; }
	mapfile -t GPU_CTR < <("$PY" "$here/gpuspec.py" ctr-args "$CDI" 0 2>>"$LOG")
	local m=()
	for i in "${BINDS[@]}"; do m+=(--mount "type=bind,src=$i,dst=$i,options=rbind:ro"); done
	mkdir -p "$W/logs/$id"
	: >"$lg"
	x 120 ctd.run ctr run -d --snapshotter "$snap" "${ANNOT[@]}" "${GPU_CTR[@]}" "${m[@]}" \
		--mount "type=bind,src=$W/app,dst=/app,options=rbind:ro" --mount "type=bind,src=$W/logs/$id,dst=/logs,options=rbind:rw" \
		--env HOME=/tmp "$IMG" $id sh -c 'exec "$@" </dev/null >>/logs/app.out 2>&1' sh "${APP[@]}"
	if [ "$RC" != 0 ] || ! wait_steps "$lg" 3 90; then
		fail "ctr run of the CUDA container" "$(tail -n 2 "$lg" "$W/logs/$id/app.out" 2>/dev/null | tr '\n' ' ')"
		return
	fi
	pass "ctr run of the CUDA container" "$(grep -m1 '^start' "$lg")"

	# What the kubelet's checkpoint API has containerd do: a task checkpoint into a directory.
	x 180 ctd.task-checkpoint ctr tasks checkpoint --image-path "$W/ctd-task-img" --work-path "$W/ctd-task-work" $id
	local rc=$RC
	keep_log "$W/ctd-task-work/dump.log" "$RES/ctd.task.dump.log"
	if [ $rc = 0 ] && healthy "$lg"; then
		x 60 ctd.task-inspect criu-gpu inspect "$W/ctd-task-img"
		check "ctr tasks checkpoint --image-path, the task runs on" "$SECS s inspect; $(grep -m1 -iE 'GPU memory|process' "$RES/ctd.task-inspect.out")" \
			grep -qiE 'GPU-|cuda' "$RES/ctd.task-inspect.out"
	else
		plugin_lines "$RES/ctd.task.dump.log" | indent
		fail "ctr tasks checkpoint --image-path, the task runs on" "rc=$rc"
	fi
	rm -rf "$W/ctd-task-img"

	local ref=localhost/criu-gpu-checkpoint/$id:1 before
	x 180 ctd.checkpoint ctr containers checkpoint --task --image $id "$ref"
	rc=$RC
	local ck=$SECS
	if [ $rc != 0 ]; then fail "ctr containers checkpoint" "rc=$rc"; return; fi
	x 30 ctd.kill ctr tasks kill -s SIGKILL $id
	for i in $(seq 50); do ctr tasks list 2>/dev/null | grep -q "^$id .*RUNNING" || break; sleep 0.2; done
	x 60 ctd.rm-task ctr tasks delete $id
	x 60 ctd.rm ctr containers delete $id
	before=$(last_step "$lg")
	x 120 ctd.export ctr images export --skip-manifest-json "$W/ctd-ckpt.tar" "$ref"
	x 60 ctd.rmi ctr images remove "$ref"
	x 120 ctd.import-ckpt ctr images import "$W/ctd-ckpt.tar"
	x 60 ctd.check criu-gpu check "$W/ctd-ckpt.tar"
	check "ctr checkpoint image exported, checked, imported" "checkpoint $ck s, $(du -h "$W/ctd-ckpt.tar" | cut -f1); $(tail -1 "$RES/ctd.check.out")" test "$RC" = 0
	local n
	n=$(steps "$lg")
	x 180 ctd.restore ctr containers restore --live $id "$ref"
	rc=$RC
	# ctr's checkpoint left the task running: the restored one goes on from the checkpoint's step.
	if [ $rc = 0 ] && healthy "$lg"; then
		pass "ctr containers restore --live, data checked" "$SECS s; went on from step $(grep ' ok$' "$lg" | sed -n "$((n + 1))s/^step=\([0-9]*\) .*/\1/p") (killed at step $before)"
	else
		keep_log "$(find "$d" -name restore.log | head -1)" "$RES/ctd.restore.log"
		plugin_lines "$RES/ctd.restore.log" | indent
		fail "ctr containers restore --live, data checked" "rc=$rc"
	fi
	x 30 ctd.kill2 ctr tasks kill -s SIGKILL $id
	sleep 1
	x 60 ctd.rm-task2 ctr tasks delete $id
	x 60 ctd.rm2 ctr containers delete $id
	rm -f "$W/ctd-ckpt.tar"
	part_runc
}

# runc itself with a bundle, as containerd's shim and CRI-O run it.
part_runc() {
	local b=$W/bundle id=ctg-runc lg=$W/logs/ctg-runc/app.log s=$W/runc-state before
	mkdir -p "$b" "$W/logs/$id" "$s"
	: >"$lg"
	x 30 runc.spec runc spec --bundle "$b" || { fail "runc spec"; return; }
	local binds=(--bind "$W/app:/app:ro" --bind "$W/logs/$id:/logs")
	for before in "${BINDS[@]}"; do binds+=(--bind "$before:$before:ro"); done
	local ann=()
	[ $MODE = sim ] && ann=(--annotation "org.criu.config=$CRIU_CONF")
	x 30 runc.bundle "$PY" "$here/gpuspec.py" runc-bundle "$b/config.json" "$CDI" 0 --rootfs "$W/rootfs" \
		"${binds[@]}" "${ann[@]}" --env HOME=/tmp -- sh -c 'exec "$@" </dev/null >>/logs/app.out 2>&1' sh "${APP[@]}" ||
		{ fail "runc bundle"; return; }
	cp "$b/config.json" "$RES/runc-config.json"
	x 60 runc.run runc --root "$s" run -d --bundle "$b" $id
	if [ "$RC" != 0 ] || ! wait_steps "$lg" 3 90; then
		fail "runc run of the CUDA container" "$(tail -n 2 "$lg" "$W/logs/$id/app.out" 2>/dev/null | tr '\n' ' ')"
		return
	fi
	x 180 runc.checkpoint runc --root "$s" checkpoint --image-path "$W/runc-img" --work-path "$W/runc-work" $id
	local rc=$RC ck=$SECS
	keep_log "$W/runc-work/dump.log" "$RES/runc.dump.log"
	[ $rc = 0 ] || { plugin_lines "$RES/runc.dump.log" | indent; fail "runc checkpoint" "rc=$rc"; return; }
	x 30 runc.delete runc --root "$s" delete -f $id
	before=$(last_step "$lg")
	x 180 runc.restore runc --root "$s" restore -d --image-path "$W/runc-img" --work-path "$W/runc-work2" --bundle "$b" $id
	rc=$RC
	keep_log "$W/runc-work2/restore.log" "$RES/runc.restore.log"
	if [ $rc = 0 ] && healthy "$lg" && consecutive "$lg"; then
		pass "runc checkpoint / runc restore of a bundle" "checkpoint $ck s, restore $SECS s; step $before -> $(last_step "$lg")"
	else
		plugin_lines "$RES/runc.restore.log" | indent
		fail "runc checkpoint / runc restore of a bundle" "rc=$rc"
	fi
	x 30 runc.delete2 runc --root "$s" delete -f $id
	rm -rf "$W/runc-img"
}

# ---- other GPU -----------------------------------------------------------------------------

part_othergpu() {
	if [ "$NGPU" -lt 2 ]; then
		skip "restore onto another GPU" "needs 2 GPUs, this machine has $NGPU"
		return
	fi
	local u0=${UUIDS[0]} u1=${UUIDS[1]} lg=$W/logs/ctg-c0/app.log rc
	# 1. A container given GPU 0, restored with its state mapped onto GPU 1.
	run_ct ctg-c0 0 || { fail "container on GPU 0 runs"; return; }
	x 180 c0.checkpoint podman container checkpoint --keep --compress none --export "$W/c0.tar" ctg-c0 || { fail "checkpoint on GPU 0"; return; }
	x 60 c0.rm podman rm ctg-c0
	mkdir -p "$W/c0x"
	x 60 c0.untar tar -C "$W/c0x" -xf "$W/c0.tar" spec.dump config.dump
	fact "the archive's spec: device nodes $("$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print([d["path"] for d in s["linux"].get("devices", [])], "cgroup allows", [(r.get("major"), r.get("minor")) for r in s["linux"]["resources"]["devices"] if r.get("allow")])' "$W/c0x/spec.dump" 2>&1)"
	fact "the archive's /dev (CRIU restores a tmpfs's contents from its image; runc makes no device node at restore): $(tar -xOf "$W/c0.tar" --wildcards 'checkpoint/tmpfs-dev-*' 2>/dev/null | tar -tzvf - 2>/dev/null | grep -E 'nvidia' | awk '{ print $1, $NF }' | tr '\n' ' ')"
	plugin_set CRIU_GPU_DEVICE_MAP "$u0=$u1"
	x 60 c0.check-map criu-gpu check "$W/c0.tar"
	fact "criu-gpu check with CRIU_GPU_DEVICE_MAP=$u0=$u1: $(tail -1 "$RES/c0.check-map.out")"
	x 180 c0.restore-map podman container restore --keep --import "$W/c0.tar"
	rc=$RC
	keep_logs ctg-c0 c0.restore-map
	local why
	fact "podman's error: $(grep -v '^\s*$' "$RES/c0.restore-map.out" | tail -n 3 | tr '\n' ' ')"
	fact "the container's directory, where CRIU's restore.log stays: $(userdata ctg-c0)"
	why=$(refusal c0.restore-map "$RES/c0.restore-map.restore.log")
	if [ $rc != 0 ] && [ -n "$why" ]; then
		pass "restore of a GPU 0 container onto GPU 1 refused, with the reason" "$why"
	elif [ $rc = 0 ] && healthy "$lg"; then
		info "restore of a GPU 0 container onto GPU 1 worked" "$(apps_on_gpus | tr '\n' ' ')"
		container_facts ctg-c0
	else
		plugin_lines "$RES/c0.restore-map.restore.log" | indent
		fail "restore of a GPU 0 container onto GPU 1: refused, with the reason" "rc=$rc, no reason in the log"
	fi
	x 60 c0.rm2 podman rm -f -t 0 ctg-c0
	# The refused archive is intact: restored where it was (no map).
	plugin_set CRIU_GPU_DEVICE_MAP
	x 180 c0.restore-same podman container restore --keep --import "$W/c0.tar"
	check "the same archive restored on GPU 0 afterwards" "$SECS s" healthy "$lg"
	x 60 c0.rm3 podman rm -f -t 0 ctg-c0

	# 2. What works: a container given the device nodes of every GPU it may be restored onto
	#    (nvidia.com/gpu=all), using GPU 0; restored with CRIU_GPU_DEVICE_MAP onto GPU 1.
	lg=$W/logs/ctg-call/app.log
	run_ct ctg-call all || { fail "container with every GPU's node runs"; return; }
	local used0 used1
	x 180 call.checkpoint podman container checkpoint --keep --export "$W/call.tar.zst" ctg-call || { fail "checkpoint"; return; }
	x 60 call.rm podman rm ctg-call
	plugin_set CRIU_GPU_DEVICE_MAP "$u0=$u1"
	x 60 call.check criu-gpu check "$W/call.tar.zst"
	x 180 call.restore podman container restore --keep --import "$W/call.tar.zst"
	rc=$RC
	keep_logs ctg-call call.restore
	plugin_set CRIU_GPU_DEVICE_MAP
	used0=$(gpu_used 0)
	used1=$(gpu_used 1)
	if [ $rc = 0 ] && healthy "$lg"; then
		pass "container with every GPU's node restored onto GPU 1 (CRIU_GPU_DEVICE_MAP)" "data checked; GPU 0 ${used0} MiB, GPU 1 ${used1} MiB used; the app says $(tail -n 1 "$lg" | grep -o 'uuid=[^ ]*')"
		log "  $(apps_on_gpus | tr '\n' ' ')"
		container_facts ctg-call
	else
		plugin_lines "$RES/call.restore.restore.log" | indent
		fail "container with every GPU's node restored onto GPU 1 (CRIU_GPU_DEVICE_MAP)" "rc=$rc"
	fi
	x 60 call.rm2 podman rm -f -t 0 ctg-call

	# 3. runc restoring a bundle whose spec gives it GPU 1 (what a runtime that builds the
	#    restored container's spec anew, as CRI-O from the pod spec, would hand runc): the
	#    device cgroup allows GPU 1, /dev still comes from the checkpoint.
	part_runc_other
	rm -f "$W/c0.tar" "$W/call.tar.zst"
}

part_runc_other() {
	local b=$W/bundle1 id=ctg-runc1 lg=$W/logs/ctg-runc1/app.log s=$W/runc-state d rc
	mkdir -p "$b" "$W/logs/$id" "$s"
	: >"$lg"
	local binds=(--bind "$W/app:/app:ro" --bind "$W/logs/$id:/logs") ann=()
	for d in "${BINDS[@]}"; do binds+=(--bind "$d:$d:ro"); done
	[ $MODE = sim ] && ann=(--annotation "org.criu.config=$CRIU_CONF")
	for d in 0 1; do
		rm -f "$b/config.json"
		x 30 "runc1.spec$d" runc spec --bundle "$b"
		x 30 "runc1.bundle$d" "$PY" "$here/gpuspec.py" runc-bundle "$b/config.json" "$CDI" "$d" --rootfs "$W/rootfs" \
			"${binds[@]}" "${ann[@]}" --env HOME=/tmp -- sh -c 'exec "$@" </dev/null >>/logs/app.out 2>&1' sh "${APP[@]}"
		cp "$b/config.json" "$b/config-gpu$d.json"
	done
	cp "$b/config-gpu0.json" "$b/config.json"
	x 60 runc1.run runc --root "$s" run -d --bundle "$b" $id
	if [ "$RC" != 0 ] || ! wait_steps "$lg" 3 90; then fail "runc container on GPU 0 runs"; return; fi
	x 180 runc1.checkpoint runc --root "$s" checkpoint --image-path "$W/runc1-img" --work-path "$W/runc1-work" $id || { fail "runc checkpoint"; return; }
	x 30 runc1.delete runc --root "$s" delete -f $id
	cp "$b/config-gpu1.json" "$b/config.json"
	plugin_set CRIU_GPU_DEVICE_MAP "${UUIDS[0]}=${UUIDS[1]}"
	x 180 runc1.restore runc --root "$s" restore -d --image-path "$W/runc1-img" --work-path "$W/runc1-work2" --bundle "$b" $id
	rc=$RC
	plugin_set CRIU_GPU_DEVICE_MAP
	keep_log "$W/runc1-work2/restore.log" "$RES/runc1.restore.log"
	local why
	fact "runc's error: $(grep -v '^\s*$' "$RES/runc1.restore.out" | tail -n 3 | tr '\n' ' ')"
	why=$(refusal runc1.restore "$RES/runc1.restore.log")
	if [ $rc != 0 ] && [ -n "$why" ]; then
		pass "runc restore with a spec giving GPU 1: refused, with the reason" "$why"
	elif [ $rc = 0 ] && healthy "$lg"; then
		info "runc restore with a spec giving GPU 1 worked" "$(apps_on_gpus | tr '\n' ' ')"
	else
		plugin_lines "$RES/runc1.restore.log" | indent
		fail "runc restore with a spec giving GPU 1: refused, with the reason" "rc=$rc"
	fi
	x 30 runc1.delete2 runc --root "$s" delete -f $id
	rm -rf "$W/runc1-img"
}

# ---- failures ------------------------------------------------------------------------------

# descendants PID: every process below PID.
descendants() {
	local c
	for c in $(pgrep -P "$1"); do
		echo "$c"
		descendants "$c"
	done
}

part_failures() {
	local name=ctg-d lg=$W/logs/ctg-d/app.log i ud pid criu_pid='' rc
	run_ct $name 0 || { fail "container runs"; return; }
	ud=$(userdata $name)
	rm -f "$ud/dump.log"
	# 1. CRIU SIGKILLed once the plugin has locked the GPU.
	[ $MODE = sim ] && plugin_set CUDA_SIM_FAULT "checkpoint=delay:3000"
	podman container checkpoint --keep --export "$W/d-killed.tar.zst" $name </dev/null >"$RES/d.kill-checkpoint.out" 2>&1 &
	pid=$!
	for i in $(seq 600); do
		grep -q 'criu_gpu: locked' "$ud/dump.log" 2>/dev/null && break
		kill -0 $pid 2>/dev/null || break
		sleep 0.05
	done
	for i in $(descendants $pid); do
		case $(cat "/proc/$i/comm" 2>/dev/null) in criu | criu.real) criu_pid=$i ;; esac
	done
	if [ -n "$criu_pid" ] && grep -q 'criu_gpu: locked' "$ud/dump.log" 2>/dev/null; then
		log "  $(grep -m1 'criu_gpu: locked' "$ud/dump.log" | sed 's/^.*criu_gpu/criu_gpu/'): SIGKILL to CRIU (pid $criu_pid)"
		kill -9 "$criu_pid"
		timeout 120 tail --pid=$pid -f /dev/null
		wait $pid
		rc=$?
		[ $MODE = sim ] && plugin_set CUDA_SIM_FAULT
		keep_log "$ud/dump.log" "$RES/d.killed.dump.log"
		log "  podman container checkpoint: rc=$rc: $(tail -n 2 "$RES/d.kill-checkpoint.out" | tr '\n' ' ')"
		if [ $rc != 0 ] && [ "$(timeout 30 podman inspect --format '{{.State.Status}}' $name 2>/dev/null)" = running ] && healthy "$lg" 5 90; then
			pass "CRIU SIGKILLed after the GPU lock: the container runs on, data checked" "state running, step $(last_step "$lg")"
		else
			fail "CRIU SIGKILLed after the GPU lock: the container runs on, data checked" "rc=$rc, state $(timeout 30 podman inspect --format '{{.State.Status}}' $name 2>&1), $(tail -n 1 "$lg")"
			[ -f "$W/d-killed.tar.zst" ] || true
		fi
		grep -h 'criu-gpu-guardian\|guardian' "$ud"/gpu-guardian.log "$ud"/checkpoint/gpu-guardian.log 2>/dev/null | tail -n 5 | indent
	else
		wait $pid
		[ $MODE = sim ] && plugin_set CUDA_SIM_FAULT
		skip "CRIU SIGKILLed after the GPU lock" "the dump ended before the lock was seen (rc=$?)"
	fi
	rm -f "$W/d-killed.tar.zst"

	# 2. A restore that cannot get its GPU memory: another process holds it.
	x 180 d.checkpoint podman container checkpoint --keep --compress none --export "$W/d.tar" $name || { fail "checkpoint"; return; }
	x 60 d.rm podman rm $name
	local free hog hoglog=$W/logs/hog.log hogpid='' try reserve=0
	# A CUDA context takes GPU memory of its own beyond what the process allocates: a GPU hog
	# leaves half the checkpoint's size free, trying smaller sizes if its allocation fails.
	[ $MODE = gpu ] && reserve=768
	for try in 0 1 2 3; do
		free=$(gpu_free 0)
		hog=$((free - APP_MIB / 2 - reserve - try * 512))
		: >"$hoglog"
		if [ $MODE = gpu ]; then
			setsid "$W/app/ct-app" "$(awk -v m="$hog" 'BEGIN { printf "%.3f", m / 1024 }')" 9 "$hoglog" 5000 </dev/null >/dev/null 2>&1 &
		else
			setsid "$W/sim/cuda-sim-app" --lib "$W/sim/lib/libcuda.so.1" --mib "$hog" --interval-ms 5000 --log "$hoglog" \
				</dev/null >/dev/null 2>&1 &
		fi
		hogpid=$!
		BARE+=("$hogpid")
		wait_steps "$hoglog" 1 120 && break
		log "  a GPU hog of $hog MiB did not start: $(tail -n 1 "$hoglog")"
		kill -9 "$hogpid" 2>/dev/null
		hogpid=''
		sleep 1
	done
	[ -n "$hogpid" ] || { fail "a process fills GPU 0" "$(tail -n 2 "$hoglog")"; return; }
	log "  another process holds $hog MiB of GPU 0: $(gpu_free 0) MiB free, the checkpoint needs $APP_MIB MiB and its context"
	x 60 d.check-full criu-gpu check "$W/d.tar"
	fact "criu-gpu check with GPU 0 full: rc=$RC $(tail -1 "$RES/d.check-full.out")"
	x 180 d.restore-full podman container restore --keep --import "$W/d.tar"
	rc=$RC
	keep_logs $name d.restore-full
	local why
	why=$(grep -m1 -oE 'Error: criu_gpu: .*' "$RES/d.restore-full.restore.log" 2>/dev/null)
	if [ $rc != 0 ]; then
		pass "restore refused while the GPU's memory is taken" "${why:-$(tail -n 1 "$RES/d.restore-full.out")}"
	else
		fail "restore refused while the GPU's memory is taken" "it restored (rc=0)"
	fi
	x 60 d.rm2 podman rm -f -t 0 $name
	kill -9 "$hogpid"
	for i in $(seq 100); do [ "$(gpu_free 0)" -gt $((APP_MIB * 2)) ] && break; sleep 0.1; done
	x 180 d.restore-free podman container restore --keep --import "$W/d.tar"
	rc=$RC
	keep_logs $name d.restore-free
	if [ $rc = 0 ] && healthy "$lg"; then
		pass "the archive restored once the memory is free" "$SECS s; data checked, step $(last_step "$lg")"
	else
		plugin_lines "$RES/d.restore-free.restore.log" | indent
		fail "the archive restored once the memory is free" "rc=$rc"
	fi
	x 60 d.rm3 podman rm -f -t 0 $name
	rm -f "$W/d.tar"
}

# ---- the bare-process baseline and the overhead --------------------------------------------

# part_baseline: the application as a process of this machine, dumped and restored with criu-gpu
# (sets BARE_CK, BARE_RS). It must not inherit this script's lock (fd 9, flock): criu-gpu dump
# would dump that lock too, and its restore wait for it while this script holds it.
part_baseline() {
	local blog=$W/logs/bare.log pid rc i lib=()
	# The machine's processes have no made-up device nodes: the simulated GPUs without them.
	[ $MODE = sim ] && sim_gpud
	: >"$blog"
	setsid "${BARE_APP[@]}" "$blog" "${BARE_REST[@]}" </dev/null >"$RES/bare.out" 2>&1 9>&- &
	pid=$!
	BARE+=("$pid")
	wait_steps "$blog" 3 90 || { fail "bare process runs" "$(tail -n 2 "$blog" "$RES/bare.out" | tr '\n' ' ')"; return; }
	[ $MODE = sim ] && lib=(-- --lib "$PLUG_DIR")
	x 180 bare.dump env CRIU="$CRIU_BIN" criu-gpu dump "$pid" "$W/bare-img" "${lib[@]}"
	rc=$RC
	keep_log "$W/bare-img/dump.log" "$RES/bare.dump.log"
	if [ $rc != 0 ]; then
		fail "bare baseline: criu-gpu dump" "rc=$rc: $(grep -hE 'Error|problem' "$RES/bare.dump.out" | head -3 | tr '\n' ' ')"
		kill -9 "$pid"
		return
	fi
	local ck=$SECS
	for i in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
	x 180 bare.restore env CRIU="$CRIU_BIN" criu-gpu restore "$W/bare-img" "${lib[@]}"
	rc=$RC
	keep_log "$W/bare-img/restore.log" "$RES/bare.restore.log"
	if [ $rc != 0 ] || ! healthy "$blog"; then
		fail "bare baseline: criu-gpu restore" "rc=$rc: $(grep -hE 'Error|problem' "$RES/bare.restore.out" | head -3 | tr '\n' ' ')"
		kill -9 "$pid" 2>/dev/null
		return
	fi
	BARE_CK=$ck BARE_RS=$SECS
	pass "bare-process baseline: criu-gpu dump / restore" "$BARE_CK s / $BARE_RS s, $APP_MIB MiB on the GPU"
	kill -9 "$pid"
	rm -rf "$W/bare-img"
}

# vs_bare SECS ck|rs: the ratio of a container's time to the bare baseline's, as words.
vs_bare() {
	local base=$BARE_CK
	[ "$2" = rs ] && base=$BARE_RS
	if [ -z "$base" ]; then
		echo "no bare baseline this run"
	else
		echo "bare $base s, ratio $(awk -v a="$1" -v b="$base" 'BEGIN { printf "%.2f", a / b }')"
	fi
}

part_overhead() {
	local name=ctg-e lg=$W/logs/ctg-e/app.log rc cck crs
	run_ct $name 0 || { fail "container runs"; return; }
	x 180 e.checkpoint podman container checkpoint --keep $name || { fail "podman container checkpoint"; return; }
	cck=$SECS
	x 180 e.restore podman container restore --keep $name
	rc=$RC
	crs=$SECS
	if [ $rc != 0 ] || ! healthy "$lg"; then
		keep_logs $name e.restore
		fail "podman container restore" "rc=$rc"
		return
	fi
	x 60 e.rm podman rm -f -t 0 $name
	# The baseline once more, right after: a ratio of two times taken minutes apart on a busy
	# machine says little.
	part_baseline
	pass "checkpoint: container $cck s, $(vs_bare "$cck" ck)" "$APP_MIB MiB on the GPU"
	pass "restore: container $crs s, $(vs_bare "$crs" rs)" \
		"podman export/import of the same: ${EXPORT_S:-?} s / ${IMPORT_S:-?} s"
}

# ---- main ----------------------------------------------------------------------------------

if ! setup; then
	log "setup failed: nothing else runs"
	write_summary
	cat "$SUMMARY"
	exit 1
fi
BARE_REST=()
[ $MODE = gpu ] && BARE_REST=("$BARE_INTERVAL")
# A bare ct-app takes GIB SEED LOG INTERVAL; cuda-sim-app's flags come before --log LOG.
BARE_CK='' BARE_RS=''
for p in baseline "${PARTS[@]}"; do
	PART=$p
	if [ "$(left)" -lt 60 ]; then
		skip "$p" "deadline: $(since "$T0") s of $DEADLINE_S s used"
		continue
	fi
	log "== $p ($(left) s left)"
	# The simulated GPUs have device nodes, but for ctr (see part_containerd).
	if [ $MODE = sim ] && [ "$p" != containerd ] && [ "$p" != baseline ] && [ "$SIM_NODES" != --device-nodes ]; then sim_gpud --device-nodes; fi
	"part_${p//-/_}"
	pack_results
done
PART=end
write_summary
log "summary ($SUMMARY):"
tee -a "$LOG" <"$SUMMARY"
[ "$FAIL" = 0 ]
