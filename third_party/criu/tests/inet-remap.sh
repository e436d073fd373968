#!/bin/bash
# Patches 0012 (the UPDATE_INETSK plugin hook) and 0013 (a restore locks the connections it
# restores) with real CRIU: a TCP connection inside one process tree (tcp-pair.c, both ends on
# one address, a listener bound to it) is dumped in one network namespace and restored in another
# whose only address is a different one, as a node's part of a job restored on a new node:
#   stock 4.2.1          refuses the restore: the old address cannot be bound there
#   patched + plugin     a test plugin (remap-plugin.c) moves the 5 socket ends at the old
#                        address to the new one; the pair goes on passing its counter, none lost;
#                        while the restore waits at its post-restore script (its sockets are
#                        back, its network still locked) the namespace's lock holds the
#                        connection at the new address (0013: stock CRIU has no lock there), and
#                        the lock is gone once the restore is done
#
#   sudo third_party/criu/tests/inet-remap.sh
# Environment: CRIU (patched, default /usr/local/sbin/criu), CRIU_STOCK (default
# PREFIX/lib/criu-gpu/stock/criu), CRIU_INCLUDE (its criu-plugin.h, default PREFIX/include/criu).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRIU=${CRIU:-/usr/local/sbin/criu}
prefix=$(cd "$(dirname "$CRIU")/.." && pwd)
CRIU_STOCK=${CRIU_STOCK:-$prefix/lib/criu-gpu/stock/criu}
CRIU_INCLUDE=${CRIU_INCLUDE:-$prefix/include/criu}
for c in "$CRIU" "$CRIU_STOCK"; do
	[ -x "$c" ] || { echo "inet-remap: $c missing: run scripts/install-criu.sh" >&2; exit 1; }
done
grep -q UPDATE_INETSK "$CRIU_INCLUDE/criu-plugin.h" ||
	{ echo "inet-remap: $CRIU_INCLUDE/criu-plugin.h has no UPDATE_INETSK (patch 0012)" >&2; exit 1; }

# Names and addresses of this run only (the addresses live in the run's namespaces alone).
net=$((200 + $$ % 50))
old=10.$net.0.1
new=10.$net.0.2
port=$((20000 + $$ % 10000))
from=inet-remap-$$-from
to=inet-remap-$$-to
work=$(mktemp -d /tmp/inet-remap.XXXXXX)
cleanup() {
	pkill -9 -f "^$work/tcp-pair" 2>/dev/null || true
	ip netns del "$from" 2>/dev/null || true
	ip netns del "$to" 2>/dev/null || true
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/plugins" "$work/img"
gcc -O2 -Wall -Werror -o "$work/tcp-pair" "$here/tcp-pair.c"
gcc -O2 -Wall -Werror -shared -fPIC -I"$CRIU_INCLUDE" -o "$work/plugins/remap.so" "$here/remap-plugin.c"
node() { # node NAMESPACE ADDRESS: a namespace whose one address (on a veth pair) is ADDRESS
	ip netns add "$1"
	ip -n "$1" link set lo up
	ip -n "$1" link add d0 type veth peer name d1
	ip -n "$1" addr add "$2/24" dev d0
	ip -n "$1" link set d1 up
	ip -n "$1" link set d0 up
}
node "$from" "$old"
node "$to" "$new"

# The namespace's nftables ruleset, through libnftables (no `nft` needed).
cat >"$work/ruleset.py" <<'EOF'
import ctypes
n = ctypes.CDLL("libnftables.so.1")
n.nft_ctx_new.restype = ctypes.c_void_p
n.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
c = ctypes.c_void_p(n.nft_ctx_new(0))
n.nft_ctx_buffer_output(c)
n.nft_run_cmd_from_buffer(c, b"list ruleset")
print(n.nft_ctx_get_output_buffer(c).decode())
EOF
# shellcheck disable=SC2016 # $CRTOOLS_SCRIPT_ACTION is for the script, set by criu
printf '#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = post-restore ] || exit 0\npython3 %s >%s\n' \
	"$work/ruleset.py" "$work/held" >"$work/action.sh"
chmod +x "$work/action.sh"

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
counter() { sed -n '1{/^[0-9][0-9]*$/p}' "$work/status" 2>/dev/null; }
advances() { # advances BY: the counter grows by BY within 20 s, the pair unbroken
	local start now
	start=$(counter)
	for _ in $(seq 200); do
		now=$(counter)
		[ -n "$now" ] && [ -n "$start" ] && [ "$now" -ge $((start + $1)) ] && return 0
		grep -q broken "$work/status" && { cat "$work/status" >&2; return 1; }
		sleep 0.1
	done
	echo "  counter $start -> $(cat "$work/status")" >&2
	return 1
}

nsenter --net="/run/netns/$from" setsid -f "$work/tcp-pair" "$old" "$port" "$work/status" </dev/null >/dev/null 2>&1
for _ in $(seq 100); do [ -n "$(counter)" ] && break; sleep 0.1; done
check "the pair talks at $old" advances 20
pid=$(pgrep -o -f "^$work/tcp-pair")
nsenter --net="/run/netns/$from" "$CRIU" dump -t "$pid" -D "$work/img" --tcp-established \
	--network-lock nftables -v4 -o dump.log
# The pair's pid is free to restore once no process has it, nor its session or group (a zombie
# of a failed restore holds them until init reaps it; some inits take their time).
held() { [ -d "/proc/$pid" ] || pgrep -s "$pid" >/dev/null || pgrep -g "$pid" >/dev/null; }
gone() { for _ in $(seq 200); do held || return 0; sleep 0.1; done; return 1; }
gone

rc=0
nsenter --net="/run/netns/$to" "$CRIU_STOCK" restore -D "$work/img" --tcp-established -d -v4 \
	-o restore-stock.log || rc=$?
check "stock 4.2.1 refuses the restore at $new" [ "$rc" != 0 ]
check "  because $old cannot be bound there" \
	grep -q "Cannot assign requested address" "$work/img/restore-stock.log"
gone # what the failed restore started is on its way out

rc=0
REMAP_OLD=$old REMAP_NEW=$new REMAP_LOG=$work/remap.log nsenter --net="/run/netns/$to" "$CRIU" restore \
	-D "$work/img" --tcp-established -d --lib "$work/plugins" --action-script "$work/action.sh" \
	-v4 -o restore.log || rc=$?
check "patched + plugin restores the pair at $new" [ "$rc" = 0 ]
check "  the plugin moved the listener's and both connection ends' addresses" \
	grep -qx "moved 5" "$work/remap.log"
check "  the pair goes on talking, no counter lost" advances 50
check "  during the restore the lock held the connection at $new" \
	grep -q "$new \. $port \. $new \. " "$work/held"
check "  and named no end at $old" bash -c "! grep -q '$old' '$work/held'"
nsenter --net="/run/netns/$to" python3 "$work/ruleset.py" >"$work/after"
check "  the lock is gone after the restore" bash -c "! grep -q CRIU '$work/after'"

echo "inet-remap: $passed passed, $failed failed"
[ "$failed" = 0 ]
