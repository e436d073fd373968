#!/bin/bash
# Patch 0001: when the post-dump action script fails, CRIU resumes the tasks, and the plugins'
# exit hook must be told that the dump failed. Real CRIU dumps a plain process with a test plugin
# (exit-logger.c) that records the `ret` its exit hook receives:
#   failing post-dump script:    stock 4.2.1 passes 0 (the bug), the patched build non-zero
#   succeeding post-dump script: both pass 0
# and after the failed dump the process runs on, untraced.
#
#   sudo third_party/criu/tests/post-dump-failure.sh
# Environment: CRIU (patched, default /usr/local/sbin/criu), CRIU_STOCK (default
# /usr/local/lib/criu-gpu/stock/criu), CRIU_INCLUDE (criu-plugin.h; default beside CRIU).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-/usr/local/sbin/criu}
prefix=$(cd "$(dirname "$CRIU")/.." && pwd)
CRIU_STOCK=${CRIU_STOCK:-$prefix/lib/criu-gpu/stock/criu}
CRIU_INCLUDE=${CRIU_INCLUDE:-$prefix/include/criu}
for c in "$CRIU" "$CRIU_STOCK"; do
	[ -x "$c" ] || { echo "post-dump-failure: $c missing: run scripts/install-criu.sh" >&2; exit 1; }
done

work=$(mktemp -d /tmp/post-dump-failure.XXXXXX)
target=
cleanup() {
	[ -z "$target" ] || kill -9 "$target" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/plugins"
gcc -shared -fPIC -O2 -Wall -Werror -I"$CRIU_INCLUDE" -o "$work/plugins/exit_logger.so" \
	"$here/exit-logger.c"
for verdict in 0 1; do
	# shellcheck disable=SC2016 # $CRTOOLS_SCRIPT_ACTION is for the script, set by criu
	printf '#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" != post-dump ] || exit %s\n' "$verdict" \
		>"$work/post-dump-$verdict.sh"
	chmod +x "$work/post-dump-$verdict.sh"
done

passed=0
failed=0
check() { # check DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@"; then
		passed=$((passed + 1))
		echo "PASS $what"
	else
		failed=$((failed + 1))
		echo "FAIL $what"
	fi
}

# dump_with CRIU SCRIPT_VERDICT: dumps a fresh `sleep` with the post-dump script exiting
# SCRIPT_VERDICT; sets rc (criu's exit status) and exit_ret (what the plugin's exit received).
dump_with() {
	local criu=$1 verdict=$2 dir
	dir=$(mktemp -d "$work/img.XXXXXX")
	setsid sleep 600 </dev/null >/dev/null 2>&1 &
	target=$!
	disown "$target"
	: >"$work/exit.log"
	rc=0
	EXIT_LOGGER_LOG=$work/exit.log timeout 60 "$criu" dump -t "$target" -D "$dir" \
		--lib "$work/plugins" --action-script "$work/post-dump-$verdict.sh" \
		-v4 -o dump.log || rc=$?
	exit_ret=$(sed -n 's/^exit stage=0 ret=//p' "$work/exit.log")
	echo "  $(basename "$criu") ($criu), post-dump script exits $verdict:" \
		"criu dump rc=$rc, plugin exit(DUMP) got ret=${exit_ret:-<not called>}"
}

# running_untraced PID: the process exists, is not stopped, and nobody traces it.
running_untraced() {
	local state tracer
	state=$(sed -n 's/^State:\s*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null)
	tracer=$(sed -n 's/^TracerPid:\s*//p' "/proc/$1/status" 2>/dev/null)
	[[ $state == [SR] && $tracer == 0 ]]
}

gone() { # gone PID: waits (bounded) until the dumped process has been killed
	for _ in $(seq 100); do [ -d "/proc/$1" ] || return 0; sleep 0.05; done
	return 1
}

dump_with "$CRIU_STOCK" 1
check "stock: dump fails when the post-dump script fails" test "$rc" != 0
check "stock: the task runs on, untraced" running_untraced "$target"
check "stock: the plugin is told the dump succeeded (ret=0, the bug patch 0001 fixes)" \
	test "$exit_ret" = 0
kill -9 "$target"

dump_with "$CRIU" 1
check "patched: dump fails when the post-dump script fails" test "$rc" != 0
check "patched: the task runs on, untraced" running_untraced "$target"
check "patched: the plugin is told the dump failed (ret non-zero)" \
	test -n "$exit_ret" -a "$exit_ret" != 0
kill -9 "$target"

for criu in "$CRIU_STOCK" "$CRIU"; do
	dump_with "$criu" 0
	check "$criu: dump succeeds with a succeeding post-dump script" test "$rc" = 0
	check "$criu: the plugin is told the dump succeeded (ret=0)" test "$exit_ret" = 0
	check "$criu: the dumped task is killed" gone "$target"
done

echo "post-dump-failure: $passed passed, $failed failed"
[ "$failed" = 0 ]
