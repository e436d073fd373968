#!/bin/bash
# Packs what the GPU machine (Ubuntu 24.04, no CRIU, no network) needs into .carry/:
#   bin/     cuda-checkpoint-ctl, criu (a wrapper) and criu.real
#   lib/     the shared libraries CRIU needs that Ubuntu 24.04 lacks
#   plugins/ criu_gpu_plugin.so
#   upstream-plugins/ CRIU's own cuda_plugin.so (scripts/install-criu.sh builds it)
# Then on that machine: export PATH=$PWD/.carry/bin:$PATH.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/.carry
cd "$root"
cargo build --release -p cuda-checkpoint-ctl -p criu-gpu-plugin
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/plugins" "$out/upstream-plugins"
cp /usr/local/lib/criu-gpu/upstream-cuda/cuda_plugin.so "$out/upstream-plugins/"
cp target/release/cuda-checkpoint-ctl "$out/bin/"
cp target/release/libcriu_gpu_plugin.so "$out/plugins/criu_gpu_plugin.so"
strip "$out/bin/cuda-checkpoint-ctl" "$out/plugins/criu_gpu_plugin.so"
criu=$(command -v criu || echo /usr/local/sbin/criu)
cp "$criu" "$out/bin/criu.real"
for l in libnftables.so.1 libprotobuf-c.so.1 libnet.so.1 libnftnl.so.11 libxtables.so.12 libjansson.so.4 libmnl.so.0; do
	cp -L "/lib/x86_64-linux-gnu/$l" "$out/lib/"
done
cat >"$out/bin/criu" <<'WRAP'
#!/bin/bash
# CRIU with the libraries carried beside it (only for CRIU itself, not for what it restores).
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/criu.real" "$@"
WRAP
chmod +x "$out/bin/criu"
du -sh "$out"
