#!/bin/bash
# Runs staging-probe.cu on the GPU machine: where the driver's checkpoint puts device memory in
# the process, and whether its restore can overlap the arrival of that memory (userfaultfd).
#   scripts/experiments/staging-probe.sh [OUT_DIR]
# Each case is bounded; the log goes to OUT_DIR/staging-probe.log (default: stdout only).
# CASES: "GIB:MODE..." cases, separated by ";" (default: 8 GiB of every mode, 32 GiB of three).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-}
log() { if [ -n "$out" ]; then tee -a "$out/staging-probe.log"; else cat; fi; }
{
	echo "== machine"
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	uname -r
	echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
	echo "unprivileged_userfaultfd: $(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null)"
} 2>&1 | log
nvcc -O2 -o /tmp/staging-probe "$here/staging-probe.cu" -lcuda -lpthread 2>&1 | log
IFS=';' read -r -a cases <<<"${CASES:-8:plain uffd demand seq uffd plain seq;32:plain seq uffd}"
for c in "${cases[@]}"; do
	gib=${c%%:*}
	echo "== $gib GiB: ${c#*:}" | log
	# shellcheck disable=SC2086 # the modes are words
	timeout 300 /tmp/staging-probe "$gib" ${c#*:} 2>&1 | log
	echo "exit ${PIPESTATUS[0]}" | log
done
