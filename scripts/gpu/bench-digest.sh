#!/bin/bash
# The cost of the image digests (recorded at the end of a dump, checked before a restore) at
# 8 GiB, against a plain read of the same file in the same run (the ceiling).
#
#   scripts/gpu/bench-digest.sh [GIB] [DIR]          defaults: 8, /dev/shm/bench-digest
#
# DIGEST: the digest example (cargo build --release -p criu-gpu-image --example digest).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"
stamp "$here/../../.carry/plugins/criu_gpu_plugin.so"
GIB=${1:-8}
DIR=${2:-/dev/shm/bench-digest}
DIGEST=${DIGEST:-target/release/examples/digest}
trap 'rm -rf "$DIR"' EXIT
mkdir -p "$DIR"
head -c "$((GIB << 30))" /dev/urandom >"$DIR/pages-1.img"
t0=$(date +%s.%N)
cat "$DIR/pages-1.img" >/dev/null
t1=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v g="$GIB" 'BEGIN { printf "read ceiling: %.2f GiB in %.3f s (%.2f GB/s)\n", g, b - a, g * 1.073741824 / (b - a) }'
"$DIGEST" "$DIR"
