#!/bin/bash
# Installs the project's CRIU: the pinned upstream 4.2.1 source (third_party/criu) with the
# project's patch series (third_party/criu/patches/NNNN-*.patch, applied in order), built twice:
#   $PREFIX/sbin/criu (+ criu-ns, include/criu/)   patched: what everything uses
#   $PREFIX/lib/criu-gpu/stock/criu                unpatched 4.2.1: interop tests, benchmarks
#   $PREFIX/lib/criu-gpu/upstream-cuda/cuda_plugin.so   CRIU's own C CUDA plugin (not in CRIU's
#       plugin directory: the tests use it to show that cuda-checkpoint-ctl is a drop-in for
#       NVIDIA's cuda-checkpoint and that its images restore with this project's plugin)
#   $PREFIX/lib/criu-gpu/criu.stamp                what the builds were made from
# The patched build tree stays in $WORK/patched/criu-4.2.1: scripts/zdtm.sh runs CRIU's own
# test suite (zdtm) from it; zdtm's Python needs (yaml, protobuf, pycriu) are installed too.
# Idempotent: builds only when the installed builds or the build tree do not match the pinned
# tarball and patch series (sha256 of each, kept in the stamp files).
#
#   scripts/install-criu.sh
#   PREFIX=/opt/criu-dev WORK=/opt/criu-dev-build scripts/install-criu.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${PREFIX:-/usr/local}
WORK=${WORK:-/opt/criu-build}
TARBALL=${CRIU_TARBALL:-$here/third_party/criu/criu_4.2.1.orig.tar.xz}
PATCHES=$here/third_party/criu/patches
SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
SRC=criu-4.2.1
# Bump when the build steps below change, so that existing builds are redone.
RECIPE=2
export DEBIAN_FRONTEND=noninteractive

STOCK=$PREFIX/lib/criu-gpu/stock/criu
UPSTREAM_CUDA=$PREFIX/lib/criu-gpu/upstream-cuda/cuda_plugin.so
STAMP=$PREFIX/lib/criu-gpu/criu.stamp
TREE_STAMP=$WORK/criu.stamp

wanted_stamp() {
	echo "CRIU built by scripts/install-criu.sh, recipe $RECIPE"
	(cd "$(dirname "$TARBALL")" && sha256sum "$(basename "$TARBALL")")
	if compgen -G "$PATCHES/*.patch" >/dev/null; then
		(cd "$PATCHES" && sha256sum -- *.patch)
	fi
}
wanted=$(wanted_stamp)

up_to_date() {
	[ "$(cat "$STAMP" 2>/dev/null)" = "$wanted" ] &&
		[ "$(cat "$TREE_STAMP" 2>/dev/null)" = "$wanted" ] &&
		"$PREFIX/sbin/criu" --version >/dev/null 2>&1 &&
		"$STOCK" --version >/dev/null 2>&1 &&
		[ -e "$UPSTREAM_CUDA" ] &&
		[ -x "$WORK/patched/$SRC/criu/criu" ]
}
if up_to_date; then
	echo "CRIU in $PREFIX is up to date ($(find "$PATCHES" -name '*.patch' | wc -l) project patches; $STAMP)"
	exit 0
fi

if [ "$(id -u)" != 0 ]; then
	echo "install-criu.sh: needs root (apt-get, and make install into $PREFIX)" >&2
	exit 1
fi
echo "[${SECONDS}s] installing CRIU build dependencies and zdtm's Python packages"
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
	build-essential pkg-config libbsd-dev libcap-dev libnet1-dev libnftables-dev libnl-3-dev \
	libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev \
	libgnutls28-dev python3 iproute2 python3-yaml python3-protobuf >/dev/null

echo "$SHA256  $TARBALL" | sha256sum -c --quiet - || {
	echo "install-criu.sh: $TARBALL does not have the pinned checksum $SHA256;" \
		"restore it from git (git checkout -- third_party/criu)" >&2
	exit 1
}

# build TREE TARGETS...: make in TREE, the log in $WORK/build.log, its tail on failure.
build() {
	local tree=$1
	shift
	echo "[${SECONDS}s] make $* in $tree"
	make -C "$tree" -j"$(nproc)" "$@" >>"$WORK/build.log" 2>&1 || {
		tail -50 "$WORK/build.log"
		echo "install-criu.sh: building CRIU failed in $tree (log: $WORK/build.log)" >&2
		exit 1
	}
}

rm -f "$TREE_STAMP"
rm -rf "$WORK/stock" "$WORK/patched"
mkdir -p "$WORK/stock"
: >"$WORK/build.log"
tar -xf "$TARBALL" -C "$WORK/stock"
build "$WORK/stock/$SRC" criu cuda_plugin

# The patched tree starts as a copy of the built stock tree, so make rebuilds only what the
# patches touch (the build's dependency files hold relative paths).
cp -a "$WORK/stock" "$WORK/patched"
for p in "$PATCHES"/*.patch; do
	[ -e "$p" ] || continue
	echo "[${SECONDS}s] applying $(basename "$p")"
	patch -d "$WORK/patched/$SRC" -p1 --forward --quiet <"$p" || {
		echo "install-criu.sh: $(basename "$p") does not apply to the pinned CRIU source" >&2
		exit 1
	}
done
build "$WORK/patched/$SRC" criu lib

echo "[${SECONDS}s] installing into $PREFIX"
make -C "$WORK/patched/$SRC" install-criu PREFIX="$PREFIX" >>"$WORK/build.log" 2>&1
install -D -m 0755 "$WORK/stock/$SRC/criu/criu" "$STOCK.new" && mv -f "$STOCK.new" "$STOCK"
install -D -m 0755 "$WORK/stock/$SRC/plugins/cuda/cuda_plugin.so" "$UPSTREAM_CUDA.new"
mv -f "$UPSTREAM_CUDA.new" "$UPSTREAM_CUDA"
echo "$wanted" >"$TREE_STAMP"
echo "$wanted" >"$STAMP"
echo "patched: $PREFIX/sbin/criu ($("$PREFIX/sbin/criu" --version | sed -n 's/^Version: //p'))"
echo "stock:   $STOCK ($("$STOCK" --version | sed -n 's/^Version: //p'))"
echo "[${SECONDS}s] CRIU installed in $PREFIX; zdtm tree in $WORK/patched/$SRC"
