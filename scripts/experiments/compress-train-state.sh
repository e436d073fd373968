#!/bin/bash
# What LZ4 does to a training job's checkpoint: train-state.py (a transformer with AdamW state
# on the GPU) dumped with the project's CRIU and plugin into tmpfs, then compress-pages.sh on its
# pages images. Run on the GPU machine after scripts/gpu/pack-carry.sh:
#   export PATH=$PWD/.carry/bin:$PATH; scripts/experiments/compress-train-state.sh [LAYERS [WIDTH]]
# Environment: PLUGINS (.carry/plugins), IMAGES (/dev/shm/train-state), WORK (/tmp/train-state).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PLUGINS=${PLUGINS:-$here/../../.carry/plugins}
IMAGES=${IMAGES:-/dev/shm/train-state}
WORK=${WORK:-/tmp/train-state}
rm -rf "$IMAGES" "$WORK"
mkdir -p "$IMAGES" "$WORK"
: >"$WORK/status"
setsid python3 "$here/train-state.py" "$WORK/status" "${1:-8}" "${2:-2048}" </dev/null >"$WORK/out" 2>&1 &
app=$!
trap 'kill -9 $app 2>/dev/null; rm -rf "$IMAGES"' EXIT
for _ in $(seq 600); do grep -q '^ready' "$WORK/status" && break; sleep 0.5; done
grep '^ready' "$WORK/status" || { echo "train-state did not get ready"; tail -5 "$WORK/out"; exit 1; }
if ! criu dump -t "$app" -D "$IMAGES" --lib "$PLUGINS" -v3 -o dump.log; then
	echo "dump failed"
	grep -E 'Error|criu_gpu' "$IMAGES/dump.log" | tail -5
	exit 1
fi
grep -E 'criu_gpu: checkpointed' "$IMAGES/dump.log"
du -sh "$IMAGES"
"$here/compress-pages.sh" "$IMAGES" train-state
