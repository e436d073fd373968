#!/bin/bash
# The operator's install, tested: the packages of scripts/bundle.sh installed by apt into a fresh
# Debian root (mmdebstrap, from this machine's apt sources: no Rust, no build tools, nothing of
# the project but the packages), then run from there: the versions, the project's CRIU (its io_uring
# patch), `criu-gpu doctor` finding CRIU and the plugin, no test tooling in the criu-gpu package,
# and the demo of criu-gpu-sim (a simulated GPU process dumped and restored by the packaged CRIU
# and plugin).
#
#   bash scripts/test-bundle.sh [BUNDLE_DIR]       (default target/bundle; run bundle.sh first)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BUNDLE=${1:-$root/target/bundle}
die() { echo "test-bundle.sh: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (it builds a root file system and chroots into it)"
command -v mmdebstrap >/dev/null || die "mmdebstrap is missing: apt-get install mmdebstrap (scripts/install.sh does)"
debs=()
for p in criu-gpu criu-gpu-sim; do
	f=$(find "$BUNDLE" -maxdepth 1 -name "${p}_*.deb" | sort | tail -1)
	[ -n "$f" ] || die "no ${p}_*.deb in $BUNDLE: run scripts/bundle.sh"
	debs+=("$f")
done
# This machine's apt sources, as they are (mmdebstrap takes each file as a mirror).
sources=()
for s in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
	[ -s "$s" ] && sources+=("$s")
done
[ ${#sources[@]} -gt 0 ] || die "no apt sources on this machine"
# shellcheck source=/dev/null
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")

node=$(mktemp -d /tmp/criu-gpu-node.XXXXXX)
# unmount_all: every mount below the root, deepest first: ours, and any that a failed mmdebstrap
# left (its /dev/shm is this machine's: nothing may ever be deleted through a mount).
unmount_all() {
	findmnt -rn -o TARGET | awk -v n="$node" '$0 == n || index($0, n "/") == 1' | sort -r |
		while read -r m; do umount -l "$m" || true; done
}
cleanup() {
	unmount_all
	[ "${KEEP_ROOT:-0}" = 1 ] && { echo "the root is kept in $node"; return; }
	rm -rf --one-file-system "$node"
}
trap cleanup EXIT

echo "== a fresh $suite root"
t=$SECONDS
mmdebstrap --quiet --mode=root --variant=apt "$suite" "$node" "${sources[@]}" </dev/null ||
	die "mmdebstrap could not make the root"
echo "made in $((SECONDS - t)) s"
# mmdebstrap made the device nodes; processes and the kernel's knobs (cgroups, huge pages) are
# the machine's, as on a node. CRIU wants its root to be a mount point.
unmount_all
mount --bind "$node" "$node"
mount -t proc proc "$node/proc"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$node/dev/pts"
mount --rbind /sys "$node/sys"
mount --make-rslave "$node/sys"
in_node() { chroot "$node" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

echo "== apt install ${debs[*]##*/}, as an operator does"
mkdir -p "$node/tmp/bundle"
cp "${debs[@]}" "$node/tmp/bundle/"
t=$SECONDS
in_node apt-get update -qq || die "apt-get update in the root"
in_node env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	"${debs[@]/#*\//\/tmp\/bundle\/}" </dev/null || die "apt-get install of the packages"
echo "installed in $((SECONDS - t)) s"

echo "== versions"
in_node criu-gpu --version || die "criu-gpu --version"
in_node cuda-checkpoint-ctl --version || die "cuda-checkpoint-ctl --version"
in_node criu --version | grep -q 'Version: 4.2.1' || die "criu is not 4.2.1"
in_node criu check --feature io_uring >/dev/null 2>&1 ||
	die "the installed criu has no io_uring support: it is not the project's CRIU"
echo "ok: criu 4.2.1 with the project's patches"

echo "== no test tooling in criu-gpu"
for tool in cargo rustc cuda-sim-gpud; do
	if in_node dpkg -L criu-gpu | grep -q "/$tool\$"; then die "criu-gpu installs $tool"; fi
done
in_node dpkg -L criu-gpu | grep -qE 'criu-gpu/sim|/stock/|upstream-cuda' && die "criu-gpu installs test tooling"
for tool in cargo rustc cc; do
	if in_node sh -c "command -v $tool" >/dev/null; then die "$tool is in the node's root"; fi
done
echo "ok: no toolchain, no simulated GPU, no stock CRIU in criu-gpu"

echo "== criu-gpu doctor"
report=$(in_node criu-gpu doctor || true)
echo "$report"
for check in criu plugin settings; do
	echo "$report" | grep -qE "^ok +$check " || die "doctor: $check is not ok"
done

echo "== the demo of criu-gpu-sim, from the packages"
in_node bash /usr/share/criu-gpu/demo.sh | tee "$node/demo.out" | tail -3
grep -q '^OK: pid ' "$node/demo.out" || die "the demo did not end with OK"
echo "PASS: the packages install on a fresh $suite root and run there"
