# shellcheck shell=bash disable=SC2034,SC2154 # sourced by store-bench.sh, which sets sim, root, here, WORK, OUT and the rest, and reads SERVER_PID and TRAIN_PID
# store-bench.sh's applications and commands: the inference server and the training job on a
# GPU (PyTorch), or cuda-sim-app on the simulated GPU (--sim: "answers" are its own checks of
# its data, every step); criu-gpu with its output kept in $OUT; the page cache.
# Expects: sim, root, here, WORK, LOGS, GIB, TRAIN_LAYERS, PYTHON, CRIU_GPU, and lib.sh.

if [ "$sim" = 1 ]; then
	SIM=${SIM:-/usr/local/lib/criu-gpu/sim}
	bin() { if [ -x "$root/target/debug/$1" ]; then echo "$root/target/debug/$1"; else command -v "$1"; fi; }
	mkdir -p "$WORK/sim"
	lib=$root/target/debug/libcuda.so
	[ -e "$lib" ] || lib=$SIM/libcuda.so.1
	cp "$lib" "$WORK/sim/libcuda.so.1"
	cp "$lib" "$WORK/sim/libnvidia-ml.so.1"
	export CUDA_SIM_SOCKET=$WORK/sim/gpud.sock CUDA_CKPT_LIBCUDA=$WORK/sim/libcuda.so.1
	export CUDA_CKPT_LIBNVML=$WORK/sim/libnvidia-ml.so.1
	"$(bin cuda-sim-gpud)" --socket "$CUDA_SIM_SOCKET" --gpus 1 --memory 8GiB --uuid-seed store-bench \
		</dev/null >/dev/null 2>"$WORK/sim/gpud.log" &
	daemon=$!
	for _ in $(seq 100); do [ -S "$CUDA_SIM_SOCKET" ] && break; sleep 0.1; done
	SIM_APP=$(bin cuda-sim-app)
	# GiB in --sim are tenths of what they would be: 96 MiB of "weights" for the default 6.
	sim_mib() { awk -v g="$1" 'BEGIN { printf "%d", g * 16 }'; }
fi

# start_server NAME SEED PORT: the server (a replica: the same SEED); sets SERVER_PID.
start_server() {
	local status=$WORK/$1.status
	if [ "$sim" = 1 ]; then
		start_app "$status" env LD_LIBRARY_PATH="$WORK/sim" "$SIM_APP" --mib "$(sim_mib "$GIB")" \
			--seed "$2" --interval-ms 1000 --log "$status"
		wait_for "$status" ' ok$' 60 || return 1
	else
		start_app "$status" "$PYTHON" "$here/infer-server.py" "$3" "$GIB" "$2" "$status"
		wait_for "$status" '^ready' 600 || { tail -5 "$status.out"; return 1; }
	fi
	SERVER_PID=$LAST_PID
}

# ask PORT N [STATUS]: the server's answer to request N (--sim: "healthy" once the application
# checked its data once more and found it intact).
ask() {
	if [ "$sim" = 1 ]; then
		local n
		n=$(count "$3" ' ok$')
		for _ in $(seq 100); do [ "$(count "$3" ' ok$')" -gt "$n" ] && break; sleep 0.1; done
		if [ "$(count "$3" ' ok$')" -gt "$n" ] && ! grep -q MISMATCH "$3"; then echo healthy; else echo broken; fi
		return
	fi
	local answer=
	if exec 3<>"/dev/tcp/127.0.0.1/$1"; then
		echo "$2" >&3
		read -r -t 60 answer <&3
		exec 3<&-
	fi
	echo "${answer:-no answer}"
}

# start_train: the training job (a transformer and AdamW state on the GPU); sets TRAIN_PID.
start_train() {
	local status=$WORK/train.status
	if [ "$sim" = 1 ]; then
		start_app "$status" env LD_LIBRARY_PATH="$WORK/sim" "$SIM_APP" --mib 64 --seed 99 \
			--interval-ms 1000 --log "$status"
		wait_for "$status" ' ok$' 60 || return 1
	else
		start_app "$status" "$PYTHON" "$root/scripts/experiments/train-state.py" "$status" "$TRAIN_LAYERS" 2048
		wait_for "$status" '^ready' 600 || { tail -5 "$status.out"; return 1; }
	fi
	TRAIN_PID=$LAST_PID
}

gone() { # gone PID: waits until the process is gone (at most 30 s)
	for _ in $(seq 300); do [ -d "/proc/$1" ] || return 0; sleep 0.1; done
	return 1
}

drop_caches() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
}

# cg NAME ARGS...: criu-gpu ARGS, its output in $LOGS/NAME.out; the wall time in $LOGS/NAME.s.
cg() {
	local name=$1 t0 rc
	shift
	t0=$(now)
	timeout 300 "$CRIU_GPU" "$@" >"$LOGS/$name.out" 2>&1
	rc=$?
	elapsed "$t0" >"$LOGS/$name.s"
	[ $rc = 0 ] || { say "FAILED: criu-gpu $*"; tail -8 "$LOGS/$name.out"; }
	return $rc
}

# cgc NAME ARGS...: the same for dump and restore, with the plugin and -v4 logs for CRIU.
cgc() {
	local name=$1
	shift
	cg "$name" "$@" -- --lib "$WORK/plugins"
}

secs() { cat "$LOGS/$1.s"; }

# jget NAME PATH: a value of the JSON document criu-gpu printed last in $LOGS/NAME.out (a.b.c).
jget() {
	"$PYTHON" - "$LOGS/$1.out" "$2" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
start = max(i for i, l in enumerate(lines) if l == "{")
v = json.loads("\n".join(lines[start:]))
for k in sys.argv[2].split("."):
    v = v[int(k)] if isinstance(v, list) else v[k]
print(v)
EOF
}

# late SECONDS: the run is past SECONDS since it started (the parts after it are left out, so
# that one call ends within the GPU machine's limit).
late() { [ "$(awk -v a="$START" -v b="$(now)" 'BEGIN { print int(b - a) }')" -gt "$1" ]; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }'; }
gbps_of() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.2f", (s > 0 ? b / 1e9 / s : 0) }'; }
