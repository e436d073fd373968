#!/bin/bash
# Packs, on this machine (Debian 12), what the GPU machine (Ubuntu 24.04, no container runtime,
# no network) needs to run GPU containers into .carry-ct/ (ignored by git; carry it with .carry):
#   .carry-ct/ct.tar.xz   bin/  podman, conmon, runc, containerd, ctr, containerd-shim-runc-v2
#                               (Debian's, as installed here by scripts/install.sh)
#                         lib/  the shared libraries they link besides glibc (run.sh uses only
#                               those the GPU machine lacks: glibc 2.39 there runs Debian 12's
#                               binaries, built against 2.36)
#                         etc/  policy.json and registries.conf (/etc/containers); run.sh writes
#                               storage.conf, containers.conf and containerd's config itself
#   .carry-ct/MANIFEST    package versions, sizes and sha256 of the archive
# Not packed: crun (Debian's is built without CRIU: it cannot checkpoint), netavark, CNI and
# slirp4netns (the containers run with --network none: the GPU machine has no `ip`, iptables or
# network), and a container image: run.sh builds a minimal root file system there and
# bind-mounts the GPU machine's own /usr and /opt/torch into the containers (PyTorch and its CUDA
# libraries are gigabytes; they are on that machine already).
# Also runs scripts/gpu/pack-carry.sh (CRIU, the plugin, criu-gpu: .carry/) unless --no-carry,
# and prints the size of both against the 64 MiB that travels.
#
#   scripts/gpu/containers/pack.sh [--no-carry]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=$root/.carry-ct
carry=1
for a in "$@"; do
	case $a in
	--no-carry) carry=0 ;;
	*) echo "pack.sh: unknown option $a" >&2; exit 2 ;;
	esac
done
if [ $carry = 1 ]; then
	bash "$root/scripts/gpu/pack-carry.sh"
fi
bins=(/usr/bin/podman /usr/bin/conmon /usr/sbin/runc /usr/bin/containerd /usr/bin/ctr /usr/bin/containerd-shim-runc-v2)
for b in "${bins[@]}" /etc/containers/policy.json /etc/containers/registries.conf; do
	[ -e "$b" ] || { echo "pack.sh: $b missing: run scripts/install.sh --with-containers (it installs Podman, containerd and runc)" >&2; exit 1; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/etc"
cp "${bins[@]}" "$stage/bin/"
strip "$stage"/bin/* 2>/dev/null || true
cp /etc/containers/policy.json /etc/containers/registries.conf "$stage/etc/"
# Every library the binaries load besides glibc's own (never carried: the GPU machine's is newer).
for b in "${bins[@]}"; do
	ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
	case $(basename "$lib") in
	libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) continue ;;
	esac
	cp -L "$lib" "$stage/lib/"
done
{
	echo "# packed $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME") by scripts/gpu/containers/pack.sh"
	for p in podman conmon runc containerd; do
		dpkg-query -W -f '${Package} ${Version}\n' "$p" 2>/dev/null || echo "$p ?"
	done
	echo "# binaries"
	(cd "$stage" && find bin lib -type f -printf '%p %s\n' | sort)
} >"$stage/MANIFEST"
rm -rf "$out" && mkdir -p "$out"
cp "$stage/MANIFEST" "$out/MANIFEST"
cp "$stage/MANIFEST" "$stage/etc/MANIFEST"
echo "compressing (xz -9e, about 2 minutes on 2 CPUs)"
tar -C "$stage" -cf - bin lib etc | xz -9e -T"${XZ_THREADS:-2}" >"$out/ct.tar.xz"
echo "sha256 $(sha256sum "$out/ct.tar.xz" | cut -d' ' -f1) ct.tar.xz" >>"$out/MANIFEST"
ct=$(du -sb "$out" | cut -f1)
cr=$(du -sb "$root/.carry" 2>/dev/null | cut -f1 || echo 0)
awk -v a="$ct" -v b="${cr:-0}" 'BEGIN {
	printf ".carry-ct %.1f MiB, .carry %.1f MiB, together %.1f MiB of the 64 MiB carried\n", a / 2^20, b / 2^20, (a + b) / 2^20
	if (a + b > 60 * 2^20) { print "pack.sh: too close to the 64 MiB limit" > "/dev/stderr"; exit 1 }
}'
