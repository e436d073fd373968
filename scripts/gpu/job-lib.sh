# shellcheck shell=bash
# Shared helpers of the scripts that run distributed jobs (flat-out.sh, gpu-dist-test.sh,
# nccl-cost.sh); sourced, not run. Expects LOG_FILE, the log every line also goes to.

PASS=0
FAIL=0
log() { printf '[%(%T)T] %s\n' -1 "$*" | tee -a "$LOG_FILE"; }
pass() { PASS=$((PASS + 1)); log "PASS $*"; }
fail() { FAIL=$((FAIL + 1)); log "FAIL $*"; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
# tree_of PID: its descendants, parents first
tree_of() { local p; for p in $(pgrep -P "$1"); do echo "$p"; tree_of "$p"; done; }
# shellcheck disable=SC2086 # a list of pids
kill_job() { local all; all="$1 $(tree_of "$1")"; kill -9 $all 2>/dev/null; wait "$1" 2>/dev/null; }
# wait_gone PIDS...: until no process of the list exists (CRIU restores pids), at most 30 s
wait_gone() { local p; for _ in $(seq 300); do for p in "$@"; do [ -d "/proc/$p" ] && { sleep 0.1; continue 2; }; done; return 0; done; return 1; }
