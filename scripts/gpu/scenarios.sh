#!/bin/bash
# The shared scenarios (tests/tests/scenarios: the CLI alone, CRIU dumps and restores, CRIU
# stopped at every stage of a dump, CRIU's own CUDA plugin) against a real NVIDIA machine, from
# the test binary carried in .carry (scripts/gpu/pack-carry.sh builds it here with `cargo test
# --no-run`). One call, under 10 minutes on one GPU:
#
#   bash scripts/gpu/scenarios.sh [--sim] [FILTER...]
#
# --sim   the same path against the simulated GPU (the carried cuda-sim-gpud and its driver), on a
#         machine without a GPU: what proves this runner before it meets a GPU.
# FILTER  test names (substrings) to run; default all. Scenarios whose names hold `two_gpus` run
#         only where NVML reports two GPUs.
# Prints the commit and the plugin's build-id first; the scenarios' output goes to
# $OUT/scenarios.log as it comes, the machine to $OUT/machine.txt. Exit status: the test
# binary's (0: every scenario passed).
# Environment: OUT (/tmp/gpu-scenarios), WORK (/dev/shm/gpu-scenarios-PID: the scenarios' scratch,
# images included), THREADS (scenarios at once: 2 on a GPU, 2 on the simulation), LIMIT_S (540).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
carry=$root/.carry
machine=nvidia
[ "${1:-}" = --sim ] && { machine=sim; shift; }
OUT=${OUT:-/tmp/gpu-scenarios}
WORK=${WORK:-/dev/shm/gpu-scenarios-$$}
LOG_FILE=$OUT/scenarios.log
mkdir -p "$OUT"
: >"$LOG_FILE"
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
stamp "$carry/plugins/criu_gpu_plugin.so"
for f in tests/scenarios tests/ptrace-hold bin/cuda-checkpoint-ctl bin/criu-gpu bin/criu \
	plugins/criu_gpu_plugin.so upstream-plugins/cuda_plugin.so; do
	[ -e "$carry/$f" ] || { say "scenarios.sh: $carry/$f missing: run scripts/gpu/pack-carry.sh and carry .carry"; exit 2; }
done

# The build directory the harness reads (GPU_CKPT_BUILD_DIR): the carried products under the
# names cargo gives them, and the simulation only with --sim.
rm -rf "$WORK" && mkdir -p "$WORK/build" "$WORK/tmp"
ln -s "$carry/bin/cuda-checkpoint-ctl" "$carry/bin/criu-gpu" "$carry/tests/ptrace-hold" "$WORK/build/"
ln -s "$carry/plugins/criu_gpu_plugin.so" "$WORK/build/libcriu_gpu_plugin.so"
if [ $machine = sim ]; then
	ln -s "$carry/sim/cuda-sim-gpud" "$carry/sim/cuda-sim-app" "$carry/sim/libcuda.so" "$WORK/build/"
	gpus=2
	say "machine: the simulated GPU (carried cuda-sim-gpud)" | tee "$OUT/machine.txt"
else
	command -v nvidia-smi >/dev/null || { say "scenarios.sh: no nvidia-smi: this machine has no NVIDIA driver (--sim runs the simulation)"; exit 2; }
	nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv | tee "$OUT/machine.txt"
	gpus=$(nvidia-smi -L | grep -c '^GPU')
	command -v nvcc >/dev/null || { say "scenarios.sh: nvcc not found: the NVIDIA machine builds ct-app.cu with it"; exit 2; }
fi
skip=()
[ "$gpus" -ge 2 ] || { skip=(--skip two_gpus); say "one GPU: the two_gpus scenarios are left out"; }

export GPU_CKPT_MACHINE=$machine GPU_CKPT_BUILD_DIR=$WORK/build GPU_CKPT_SOURCE=$root \
	GPU_CKPT_UPSTREAM_CUDA=$carry/upstream-plugins/cuda_plugin.so CRIU=$carry/bin/criu TMPDIR=$WORK/tmp
say "running $carry/tests/scenarios on $machine ($gpus GPU(s)), ${THREADS:-2} at once"
t0=$(now)
timeout "${LIMIT_S:-540}" "$carry/tests/scenarios" --test-threads "${THREADS:-2}" "${skip[@]}" "$@" 2>&1 |
	tee -a "$LOG_FILE" | grep -E '^(test |test result|failures:|---- )'
rc=${PIPESTATUS[0]}
say "scenarios: exit $rc after $(elapsed "$t0") s"
[ "$rc" = 124 ] && say "scenarios.sh: the scenarios ran past ${LIMIT_S:-540} s and were stopped"
rm -rf "$WORK"
exit "$rc"
