#!/bin/bash
# Installs CRIU >= 4.2 where the system has none or an older one (Debian 12 ships 3.17, which
# lacks the device hooks this project needs). Builds the pinned upstream 4.2.1 source kept in
# third_party/criu with the distribution's build dependencies, and installs into $PREFIX
# (default /usr/local): sbin/criu, include/criu/criu-plugin.h. Also builds CRIU's own C CUDA
# plugin from the same source into $PREFIX/lib/criu-gpu/upstream-cuda/ (not CRIU's plugin
# directory): the tests use it to show that cuda-checkpoint-ctl is a drop-in for NVIDIA's
# cuda-checkpoint and that images it made restore with this project's plugin. Idempotent.
#
#   scripts/install-criu.sh            # install if needed
#   CRIU_MIN=4.2 PREFIX=/usr/local WORK=/opt/criu-build scripts/install-criu.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${PREFIX:-/usr/local}
WORK=${WORK:-/opt/criu-build}
CRIU_MIN=${CRIU_MIN:-4.2}
TARBALL=${CRIU_TARBALL:-$here/third_party/criu/criu_4.2.1.orig.tar.xz}
SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
export DEBIAN_FRONTEND=noninteractive

version_ok() { # version_ok BINARY: prints the version and succeeds if it is >= CRIU_MIN
	local v
	v=$("$1" --version 2>/dev/null | sed -n 's/^Version: //p')
	[ -n "$v" ] || return 1
	echo "$v"
	[ "$(printf '%s\n%s\n' "$CRIU_MIN" "$v" | sort -V | head -1)" = "$CRIU_MIN" ]
}

UPSTREAM_CUDA=$PREFIX/lib/criu-gpu/upstream-cuda/cuda_plugin.so
for c in "$PREFIX/sbin/criu" "$(command -v criu || true)"; do
	if [ -n "$c" ] && [ -x "$c" ] && v=$(version_ok "$c") && [ -e "$UPSTREAM_CUDA" ]; then
		echo "criu $v at $c is new enough (>= $CRIU_MIN)"
		exit 0
	fi
done

if [ "$(id -u)" != 0 ]; then
	echo "install-criu.sh: needs root (apt-get and make install into $PREFIX)" >&2
	exit 1
fi
echo "[${SECONDS}s] installing CRIU build dependencies"
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
	build-essential pkg-config libbsd-dev libcap-dev libnet1-dev libnftables-dev libnl-3-dev \
	libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev \
	libgnutls28-dev python3 iproute2 >/dev/null

echo "$SHA256  $TARBALL" | sha256sum -c --quiet - || {
	echo "install-criu.sh: $TARBALL does not have the pinned checksum" >&2
	exit 1
}
mkdir -p "$WORK"
rm -rf "$WORK/criu-4.2.1"
tar -xf "$TARBALL" -C "$WORK"
echo "[${SECONDS}s] building CRIU (make criu)"
cd "$WORK/criu-4.2.1"
make -j"$(nproc)" criu cuda_plugin >"$WORK/build.log" 2>&1 || {
	tail -50 "$WORK/build.log"
	exit 1
}
make install-criu PREFIX="$PREFIX" >>"$WORK/build.log" 2>&1
install -D -m 0755 plugins/cuda/cuda_plugin.so "$UPSTREAM_CUDA"
"$PREFIX/sbin/criu" --version
echo "[${SECONDS}s] CRIU installed in $PREFIX"
