#!/bin/bash
# Packs what the GPU machine (Ubuntu 24.04, no CRIU, no network) needs into .carry/:
#   bin/     cuda-checkpoint-ctl, criu-gpu, digest (scripts/gpu/bench-digest.sh); criu and criu-stock (wrappers) with criu.real (the project's
#            patched CRIU) and criu-stock.real (stock 4.2.1), both from scripts/install-criu.sh
#   lib/     the shared libraries CRIU needs that Ubuntu 24.04 lacks
#   plugins/ criu_gpu_plugin.so
#   upstream-plugins/ CRIU's own cuda_plugin.so (scripts/install-criu.sh builds it)
#   describe `git describe --dirty` of the tree packed (runners print it first)
#   bin/lz4  when lz4 is installed here (scripts/experiments/compress-pages.sh; Debian's is static but
#            for libc)
#   bin/etcd Debian's etcd-server (Go, links only libc) and bin/netbed (the test bed's nodes as
#            namespaces): scripts/gpu/multinode.sh
# Then on that machine: export PATH=$PWD/.carry/bin:$PATH.
# Environment: PREFIX (/usr/local), where install-criu.sh installed CRIU.
set -euo pipefail
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
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/plugins" "$out/upstream-plugins"
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
du -sh "$out"
echo "compressed: $(tar -C "$root" -czf - .carry | wc -c | awk '{ printf "%.1f MiB", $1 / 1048576 }')"
