#!/bin/bash
# Packs what the GPU machine (Ubuntu 24.04, no CRIU, no network) needs into .carry/:
#   bin/     cuda-checkpoint-ctl, criu-gpu, digest (scripts/gpu/bench-digest.sh); criu and criu-stock (wrappers) with criu.real (the project's
#            patched CRIU) and criu-stock.real (stock 4.2.1), both from scripts/install-criu.sh
#   lib/     the shared libraries CRIU needs that Ubuntu 24.04 lacks
#   plugins/ criu_gpu_plugin.so
#   upstream-plugins/ CRIU's own cuda_plugin.so (scripts/install-criu.sh builds it)
#   tests/   the shared scenarios' test binary (tests/tests/scenarios, built by `cargo test --no-run`
#            as scripts/test.sh builds it) and the harness's ptrace-hold: scripts/gpu/scenarios.sh
#   sim/     the simulated GPU (cuda-sim-gpud, cuda-sim-app, its libcuda.so), only for
#            `scenarios.sh --sim`, which proves the carried path on a machine without a GPU
#   describe `git describe --dirty` of the tree packed, and plugin-build-id (runners print both first)
#   bin/lz4  when lz4 is installed here (scripts/experiments/compress-pages.sh; Debian's is static but
#            for libc)
#   bin/etcd Debian's etcd-server (Go, links only libc) and bin/netbed (the test bed's nodes as
#            namespaces): scripts/gpu/multinode.sh
#   mpi/     Debian 12's Open MPI 4.1 (mpirun, orted, their components but the fabrics', help,
#            PMIx's, and every library they load but glibc's), relocated by OPAL_PREFIX and PMIx's
#            directories (mpi/env.sh sets them), and bin/cuda-mpi-app (tests/mpi): multinode.sh's
#            MPI job
# Then on that machine: export PATH=$PWD/.carry/bin:$PATH.
# Environment: PREFIX (/usr/local), where install-criu.sh installed CRIU.
set -euo pipefail
# carry_openmpi: Open MPI into $out/mpi, laid out as its prefix expects (OPAL_PREFIX: components
# in lib/x86_64-linux-gnu/openmpi/lib/openmpi3, help in share/openmpi; PMIx's under pmix2), the
# libraries in mpi/libs; the MPI job's program into bin/.
carry_openmpi() {
	local m=$out/mpi l=/usr/lib/x86_64-linux-gnu
	{ [ -x /usr/bin/orted ] && command -v mpicc >/dev/null; } ||
		{ echo "pack-carry.sh: Open MPI missing: apt-get install openmpi-bin libopenmpi-dev (scripts/install.sh)" >&2; exit 1; }
	mkdir -p "$m/bin" "$m/libs" "$m/lib/x86_64-linux-gnu/openmpi/lib" "$m/share" "$m/pmix2/lib"
	cp /usr/bin/orterun /usr/bin/orted "$m/bin/"
	ln -s orterun "$m/bin/mpirun"
	cp -r "$l/openmpi/lib/openmpi3" "$m/lib/x86_64-linux-gnu/openmpi/lib/"
	# Not the fabrics (InfiniBand, OFI, PSM, UCX) nor OpenSHMEM: TCP between the nodes is the
	# job's transport, and their libraries would take a third of the carry.
	find "$m/lib/x86_64-linux-gnu/openmpi/lib/openmpi3" -regextype egrep \
		-regex '.*(ucx|ofi|psm|openib|verbs|usnic|oshmem|spml|sshmem|scoll|memheap|atomic_).*' -delete
	cp -r /usr/share/openmpi "$m/share/"
	cp -r "$l/pmix2/lib/pmix" "$m/pmix2/lib/"
	cp -r "$l/pmix2/share" "$m/pmix2/"
	mpicc -O2 -o "$out/bin/cuda-mpi-app" tests/mpi/cuda-mpi-app.c -ldl
	# Every library these load, but glibc's (the GPU machine's is newer).
	ldd /usr/bin/orterun /usr/bin/orted "$out/bin/cuda-mpi-app" "$l/pmix2/lib/libpmix.so.2" \
		"$m"/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so "$m"/pmix2/lib/pmix/*.so 2>/dev/null |
		awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
		grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64)\.so' |
		while read -r lib; do cp -L "$lib" "$m/libs/"; done
	cat >"$m/env.sh" <<'ENV'
# . mpi/env.sh: the carried Open MPI first (its programs, libraries, components and PMIx's).
m=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# PMIx was built with absolute directories, which PMIX_PREFIX does not move: each is named.
export OPAL_PREFIX=$m PMIX_PREFIX=$m/pmix2 PMIX_LIBDIR=$m/pmix2/lib PMIX_PKGLIBDIR=$m/pmix2/lib/pmix \
	PMIX_DATADIR=$m/pmix2/share PMIX_PKGDATADIR=$m/pmix2/share/pmix PATH=$m/bin:$PATH
export LD_LIBRARY_PATH=$m/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ENV
	echo "Open MPI: $(du -sh "$m" | cut -f1) in $m"
}
root=$(cd "$(dirname "$0")/../.." && pwd)
PREFIX=${PREFIX:-/usr/local}
out=$root/.carry
cd "$root"
for f in "$PREFIX/sbin/criu" "$PREFIX/lib/criu-gpu/stock/criu" "$PREFIX/lib/criu-gpu/upstream-cuda/cuda_plugin.so"; do
	[ -e "$f" ] || { echo "pack-carry.sh: $f missing: run scripts/install-criu.sh" >&2; exit 1; }
done
[ -x /usr/bin/etcd ] || { echo "pack-carry.sh: /usr/bin/etcd missing: apt-get install etcd-server (scripts/install.sh)" >&2; exit 1; }
# Two builds: naming a target (--example) limits a build to that target, and the binaries and
# the plugin would silently stay as an earlier build left them.
cargo build --release -p cuda-checkpoint-ctl -p criu-gpu-plugin -p criu-gpu
cargo build --release -p criu-gpu-image --example digest
cargo build --release -p gpu-ckpt-tests --bin netbed
# The scenarios' test binary and the simulation, in the test build's profile (debug: the harness
# needs no speed; the products above are the release ones).
sim=(--workspace --features criu-gpu-plugin/simulation)
cargo build "${sim[@]}"
scenarios=$(cargo test "${sim[@]}" --test scenarios --no-run --message-format=json |
	python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "scenarios" and m.get("executable"):
        print(m["executable"])')
[ -x "$scenarios" ] || { echo "pack-carry.sh: no scenarios test binary from cargo" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/plugins" "$out/upstream-plugins" "$out/tests" "$out/sim"
strip -o "$out/tests/scenarios" "$scenarios"
strip -o "$out/tests/ptrace-hold" target/debug/ptrace-hold
for f in cuda-sim-gpud cuda-sim-app libcuda.so; do strip -o "$out/sim/$f" "target/debug/$f"; done
cp "$PREFIX/lib/criu-gpu/upstream-cuda/cuda_plugin.so" "$out/upstream-plugins/"
cp target/release/cuda-checkpoint-ctl target/release/criu-gpu target/release/examples/digest target/release/netbed "$out/bin/"
cp /usr/bin/etcd "$out/bin/"
cp target/release/libcriu_gpu_plugin.so "$out/plugins/criu_gpu_plugin.so"
cp "$PREFIX/sbin/criu" "$out/bin/criu.real"
cp "$PREFIX/lib/criu-gpu/stock/criu" "$out/bin/criu-stock.real"
strip "$out/bin/cuda-checkpoint-ctl" "$out/bin/criu-gpu" "$out/bin/digest" "$out/plugins/criu_gpu_plugin.so" "$out/bin/criu.real" \
	"$out/bin/criu-stock.real" "$out/bin/netbed" "$out/bin/etcd"
if command -v lz4 >/dev/null; then cp "$(command -v lz4)" "$out/bin/"; fi
for l in libnftables.so.1 libprotobuf-c.so.1 libnet.so.1 libnftnl.so.11 libxtables.so.12 libjansson.so.4 libmnl.so.0; do
	cp -L "/lib/x86_64-linux-gnu/$l" "$out/lib/"
done
carry_openmpi
for name in criu criu-stock; do
	cat >"$out/bin/$name" <<WRAP
#!/bin/bash
# CRIU with the libraries carried beside it (only for CRIU itself, not for what it restores).
here=\$(cd "\$(dirname "\$0")" && pwd)
LD_LIBRARY_PATH="\$here/../lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/$name.real" "\$@"
WRAP
	chmod +x "$out/bin/$name"
done
# What the GPU machine's runners print first (the working tree travels without .git).
git describe --always --dirty >"$out/describe" 2>/dev/null || echo unknown >"$out/describe"
readelf -n "$out/plugins/criu_gpu_plugin.so" | awk '/Build ID/ { print $3 }' >"$out/plugin-build-id"
du -sh "$out"
echo "compressed: $(tar -C "$root" -czf - .carry | wc -c | awk '{ printf "%.1f MiB", $1 / 1048576 }')"
