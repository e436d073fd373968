#!/bin/bash
# The operator's install: the project as Debian packages, built on a build machine (where Rust
# and CRIU's build are) and installed on a node with apt. The node needs no Rust toolchain and
# gets no test tooling:
#   criu-gpu       /usr/sbin/criu (the project's CRIU 4.2.1 with its patches; it replaces the
#                  distribution's criu package), the plugin in /usr/lib/criu, criu-gpu,
#                  criu-gpu-check, cuda-checkpoint-ctl, /etc/criu/gpu-plugin.conf (a conffile);
#                  at install it writes the network lock this node can take into
#                  /etc/criu/runc.conf and crun.conf, as install.sh does
#   criu-gpu-sim   the simulated GPU and the demo (/usr/share/criu-gpu/demo.sh), to try the
#                  project on a machine without a GPU; never needed on a GPU node
# Left out: stock CRIU and CRIU's C CUDA plugin (the interoperation tests'), the tests, cargo.
# Everything is stripped; the line tables go to criu-gpu-dbg (/usr/lib/debug/.build-id).
#
# Made with Debian's own dpkg-deb, and dpkg-shlibdeps for the libraries each binary needs: both
# are on every Debian and Ubuntu machine (nothing to download or build in CI), and shlibdeps
# keeps Depends right as CRIU's libraries change (nfpm needs them listed by hand; cargo-deb
# packages the binaries of one crate, and the largest part here, CRIU, is no crate).
#
#   bash scripts/bundle.sh [OUT]        (default target/bundle)
# then, on the node:  apt install ./criu-gpu_VERSION_amd64.deb
# Needs a Rust toolchain (it builds the release binaries) and CRIU's build tree from
# scripts/install-criu.sh (WORK, /opt/criu-build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$root/target/bundle}
WORK=${WORK:-/opt/criu-build}
CRIU_BIN=$WORK/patched/criu-4.2.1/criu/criu
die() { echo "bundle.sh: $*" >&2; exit 1; }

# CRIU's build tree must be of this source: its stamp lists the sha256 of every patch.
[ -x "$CRIU_BIN" ] || die "no CRIU build in $WORK: run scripts/install-criu.sh first (or set WORK)"
for p in "$root"/third_party/criu/patches/*.patch; do
	grep -q "$(sha256sum <"$p" | cut -d' ' -f1)" "$WORK/criu.stamp" 2>/dev/null ||
		die "the CRIU build in $WORK lacks $(basename "$p"): run scripts/install-criu.sh"
done
for tool in dpkg-deb dpkg-shlibdeps objcopy strip readelf; do
	command -v "$tool" >/dev/null || die "$tool is missing: apt-get install dpkg-dev binutils"
done

cd "$root"
cargo build --release --locked -p cuda-checkpoint-ctl -p criu-gpu-plugin -p criu-gpu -p cuda-sim -p cuda-sim-libcuda
upstream=$(sed -n 's/^version = "\(.*\)"/\1/p' criu-gpu/Cargo.toml | head -1)
if git rev-parse --git-dir >/dev/null 2>&1; then
	version="$upstream+$(git rev-list --count HEAD).g$(git rev-parse --short=10 HEAD)"
else
	version=$upstream
fi
arch=$(dpkg --print-architecture)
stage=$(mktemp -d /tmp/criu-gpu-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$OUT"

# put SRC PKG DEST MODE: installs SRC as DEST (absolute, inside package PKG); ELF files are
# stripped, their debug information going to the -dbg package under their build id.
put() {
	local src=$1 pkg=$2 dst=$3 mode=$4 id
	install -D -m "$mode" "$src" "$stage/$pkg$dst"
	if id=$(readelf -n "$src" 2>/dev/null | awk '/Build ID:/ { print $3 }') && [ -n "$id" ]; then
		install -d "$stage/criu-gpu-dbg/usr/lib/debug/.build-id/${id:0:2}"
		objcopy --only-keep-debug "$src" "$stage/criu-gpu-dbg/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug"
		strip --strip-unneeded "$stage/$pkg$dst"
	fi
}

rel=target/release
put "$CRIU_BIN" criu-gpu /usr/sbin/criu 0755
put $rel/libcriu_gpu_plugin.so criu-gpu /usr/lib/criu/criu_gpu_plugin.so 0644
for b in criu-gpu criu-gpu-check cuda-checkpoint-ctl; do
	put "$rel/$b" criu-gpu "/usr/bin/$b" 0755
done
put container-hooks/gpu-plugin.conf criu-gpu /etc/criu/gpu-plugin.conf 0644
put container-hooks/criu/runc.conf criu-gpu /usr/share/criu-gpu/runc.conf 0644
for b in cuda-sim-gpud cuda-sim-app; do
	put "$rel/$b" criu-gpu-sim "/usr/bin/$b" 0755
done
for f in libcuda.so.1 libnvidia-ml.so.1; do
	put $rel/libcuda.so criu-gpu-sim "/usr/lib/criu-gpu/sim/$f" 0644
done
# The demo, with the packages' prefix.
# shellcheck disable=SC2016 # the text of a line of demo.sh, not an expansion
sed 's|^PREFIX=${PREFIX:-/usr/local}$|PREFIX=${PREFIX:-/usr}|' scripts/demo.sh >"$stage/demo.sh"
# shellcheck disable=SC2016
grep -q '^PREFIX=${PREFIX:-/usr}$' "$stage/demo.sh" || die "scripts/demo.sh no longer sets PREFIX as this script expects"
put "$stage/demo.sh" criu-gpu-sim /usr/share/criu-gpu/demo.sh 0755

# The libraries the binaries of PKG need, as Depends (shlibdeps reads debian/control).
shlibs() {
	local pkg=$1 d=$stage/shlibs-$1
	mkdir -p "$d/debian"
	printf 'Source: criu-gpu\n\nPackage: %s\nArchitecture: any\n' "$pkg" >"$d/debian/control"
	(cd "$d" && find "$stage/$pkg" -type f \( -path '*/bin/*' -o -path '*/sbin/*' -o -name '*.so*' \) \
		-exec dpkg-shlibdeps -O -e {} + 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}

# control PKG DEPENDS DESCRIPTION [EXTRA FIELDS...]: writes DEBIAN/control.
control() {
	local pkg=$1 depends=$2 desc=$3 size
	shift 3
	size=$(du -sk --exclude=DEBIAN "$stage/$pkg" | cut -f1)
	mkdir -p "$stage/$pkg/DEBIAN"
	{
		echo "Package: $pkg"
		echo "Version: $version"
		echo "Architecture: $arch"
		echo "Maintainer: criu-gpu developers <criu-gpu@localhost>"
		echo "Installed-Size: $size"
		[ -n "$depends" ] && echo "Depends: $depends"
		for f in "$@"; do echo "$f"; done
		echo "Section: admin"
		echo "Priority: optional"
		echo "Description: $desc"
	} >"$stage/$pkg/DEBIAN/control"
}

docs() { # docs PKG: the copyright file every package carries
	install -D -m 0644 /dev/stdin "$stage/$1/usr/share/doc/$1/copyright" <<EOF
criu-gpu: Apache-2.0 (the project's own code).
CRIU 4.2.1 (/usr/sbin/criu, with the project's patches in third_party/criu/patches):
GPL-2.0, see /usr/share/common-licenses/GPL-2.
EOF
}

docs criu-gpu
control criu-gpu "$(shlibs criu-gpu)" \
	"checkpoint and restore GPU processes with CRIU
 CRIU 4.2.1 with the criu-gpu patches, its GPU plugin (NVIDIA CUDA, AMD ROCm),
 criu-gpu (dump, restore, inspect, doctor, Kubernetes node drain) and
 cuda-checkpoint-ctl. Run criu-gpu doctor to see whether this node is ready." \
	"Conflicts: criu" "Replaces: criu" "Provides: criu"
echo /etc/criu/gpu-plugin.conf >"$stage/criu-gpu/DEBIAN/conffiles"
install -m 0755 /dev/stdin "$stage/criu-gpu/DEBIAN/postinst" <<'EOF'
#!/bin/sh
# CRIU's settings for container runtimes: the project's where a file does not exist, and the
# network lock this node can take on a marked line (criu-gpu runtime-config, as install.sh).
set -e
if [ "$1" = configure ]; then
	criu-gpu runtime-config --criu /usr/sbin/criu --template /usr/share/criu-gpu/runc.conf \
		/etc/criu/runc.conf /etc/criu/crun.conf ||
		echo "warning: container checkpoints through runc or crun will fail on this node until the network lock above is fixed (criu-gpu doctor)" >&2
	echo "criu-gpu installed: criu-gpu doctor says whether this node is ready"
fi
EOF
docs criu-gpu-sim
sim_deps=$(shlibs criu-gpu-sim)
control criu-gpu-sim "criu-gpu (= $version)${sim_deps:+, $sim_deps}" \
	"simulated NVIDIA GPU for trying criu-gpu without a GPU
 A simulated GPU (cuda-sim-gpud), its driver libraries (used only when selected)
 and a GPU-like application, and the demo: bash /usr/share/criu-gpu/demo.sh.
 Not needed on a node with a GPU."
docs criu-gpu-dbg
control criu-gpu-dbg "criu-gpu (= $version)" \
	"debug information of criu-gpu and criu-gpu-sim
 Line tables of the stripped binaries, under /usr/lib/debug/.build-id, where gdb
 and coredumpctl look for them."

for pkg in criu-gpu criu-gpu-sim criu-gpu-dbg; do
	dpkg-deb --build --root-owner-group -Zgzip "$stage/$pkg" "$OUT/${pkg}_${version}_$arch.deb" >/dev/null
	echo "$OUT/${pkg}_${version}_$arch.deb ($(du -h "$OUT/${pkg}_${version}_$arch.deb" | cut -f1))"
done
