#!/bin/bash
# Set-up, step two: the tests. Formatting, lints, unit tests, whole-system tests against the
# simulated GPU with the real CRIU (root needed: CRIU dumps and restores processes), the tests of
# the project's CRIU patches, and last CRIU's own test suite (zdtm) without and with the plugin.
#
#   sudo scripts/test.sh [--no-zdtm]     # --no-zdtm (or SKIP_ZDTM=1): skip zdtm (~3 min)
set -euo pipefail
zdtm=1
[ "${SKIP_ZDTM:-0}" = 1 ] && zdtm=0
for a in "$@"; do
	case $a in
	--no-zdtm) zdtm=0 ;;
	*) echo "test.sh: unknown option $a" >&2; exit 2 ;;
	esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="/usr/local/sbin:$PATH"
[ "$(id -u)" = 0 ] || { echo "test.sh: run as root (the tests drive CRIU)" >&2; exit 1; }
step() { printf '\n== %s\n' "$*"; }
missing=()
for tool in podman runc containerd ctr mmdebstrap; do
	command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "test.sh: ${missing[*]} missing: the tests run Podman and containerd for real and install" \
		"the packages into a fresh root; run bash scripts/install.sh --with-containers first" >&2
	exit 1
fi

# Commit subjects of at most 72 characters (the rest in the body), from COMMIT_BASE on: the
# commit before the rule; earlier history stays as it was.
COMMIT_BASE=${COMMIT_BASE:-5d7fe961c8d8c3870b0dcb69fa411d3e6b0fac5e}
step "commit subjects since ${COMMIT_BASE:0:10}: at most 72 characters"
if git rev-parse -q --verify "$COMMIT_BASE^{commit}" >/dev/null 2>&1; then
	long=$(git log --format='%h %s' "$COMMIT_BASE..HEAD" | awk '{ s = substr($0, index($0, " ") + 1) } length(s) > 72 { print length(s) ": " $0 }')
	if [ -n "$long" ]; then
		printf '%s\n' "$long"
		echo "test.sh: commit subjects over 72 characters (above): reword them (git rebase -i" \
			"$COMMIT_BASE, reword), the rest of the text going into the body" >&2
		exit 1
	fi
	echo "ok: $(git rev-list --count "$COMMIT_BASE..HEAD") commit(s)"
else
	echo "no history back to $COMMIT_BASE here (a shallow clone or no git): not checked"
fi

step "format"
cargo fmt --all -- --check
# Test builds carry the simulations (the plugin's `simulation` feature); what install.sh installs
# never does, which the last check shows.
sim=(--features criu-gpu-plugin/simulation)
step "lints"
cargo clippy --locked --workspace --all-targets -- -D warnings
cargo clippy --locked --workspace --all-targets "${sim[@]}" -- -D warnings
shellcheck -x scripts/*.sh scripts/gpu/*.sh scripts/gpu/containers/*.sh scripts/experiments/*.sh scripts/k8s/* third_party/criu/*.sh third_party/criu/tests/*.sh .ci/run
# Settings travel down as values (docs/design.md, Layout): only the edges read the environment,
# the ctl's command line and Settings::load (the plugin's init, a tool's command); layout.rs's
# tests find CRIU's build tree.
libs=(process-facts/src cuda-checkpoint-ctl/src amd-kfd/src gpu-image/src host/src criu-plugin/src snapshot-store/src
	criu-gpu-node/src)
if grep -rlE 'env::(var|vars|var_os)\b' "${libs[@]}" |
	grep -vxE 'cuda-checkpoint-ctl/src/cli/.*|host/src/settings/mod.rs|criu-plugin/src/abi/layout.rs'; then
	echo "test.sh: the files above read the environment in a library: read it at the edge and pass the value down" >&2
	exit 1
fi
step "build (the tests run the built binaries and libraries)"
cargo build --locked --workspace "${sim[@]}"
step "tests"
cargo test --locked --workspace "${sim[@]}"
step "the GPU machine's path: the shared scenarios from the carried test binary (--sim)"
# What scripts/gpu/scenarios.sh runs on a GPU, here against the simulation: the binaries packed
# into .carry as for the GPU machine, the scenarios run from there, not from cargo.
bash scripts/gpu/pack-carry.sh
OUT=$root/target/gpu-scenarios-sim bash scripts/gpu/scenarios.sh --sim
step "the installed plugin holds no simulation"
cargo build --locked --release -p criu-gpu-plugin
if grep -q AMD_KFD_SIM_ROOT target/release/libcriu_gpu_plugin.so; then
	echo "test.sh: the release plugin contains the simulated KFD" >&2
	exit 1
fi
echo "ok: target/release/libcriu_gpu_plugin.so has no simulated driver in it"
# The floors of docs/design.md's drawing: no crate reaches one above it (cargo refuses circles
# itself; this refuses arrows back up). The plugin is linked into CRIU: no command-line parser
# (the ctl's `cli` feature), no catch-all error type (its libraries answer typed errors), no CUDA
# binding crate (the six structs it needs are declared in cuda-checkpoint-ctl's driver::cuda_h),
# and none of the Kubernetes client's HTTP, TLS or YAML code in it.
never_below() {
	local crate=$1 deps
	shift
	deps=$(cargo tree --locked -p "$crate" -e normal --prefix none | awk '{print $1}' | sort -u)
	for above in "$@"; do
		if grep -qx "$above" <<<"$deps"; then
			echo "test.sh: $crate depends on $above (cargo tree -p $crate -e normal -i $above)" >&2
			exit 1
		fi
	done
}
tools=(criu-gpu-plugin criu-gpu criu-gpu-node)
ours=(process-facts cuda-checkpoint-ctl amd-kfd criu-gpu-image criu-gpu-host "${tools[@]}")
never_below process-facts cuda-checkpoint-ctl amd-kfd criu-gpu-image criu-gpu-host snapshot-store "${tools[@]}"
never_below cuda-checkpoint-ctl amd-kfd criu-gpu-image criu-gpu-host snapshot-store "${tools[@]}"
never_below amd-kfd cuda-checkpoint-ctl criu-gpu-image criu-gpu-host snapshot-store "${tools[@]}"
never_below criu-gpu-image criu-gpu-host snapshot-store "${tools[@]}"
never_below criu-gpu-host snapshot-store "${tools[@]}"
never_below snapshot-store "${ours[@]}"
never_below criu-gpu-node criu-gpu criu-gpu-plugin criu-gpu-host criu-gpu-image cuda-checkpoint-ctl amd-kfd snapshot-store
never_below criu-gpu-plugin criu-gpu criu-gpu-node snapshot-store clap anyhow cudarc ureq rustls yaml-rust2
echo "ok: every crate depends only on the floors below it; no clap, anyhow, cudarc, HTTP, TLS or YAML in the plugin"
step "the operator's packages, built and installed by apt into a fresh root"
bash scripts/bundle.sh "$root/target/bundle"
bash scripts/test-bundle.sh "$root/target/bundle"
step "demo.sh --gpu names what it needs"
if ! cuda-checkpoint-ctl --gpus >/dev/null 2>&1; then
	if bash scripts/demo.sh --gpu >/tmp/demo-gpu.$$ 2>&1 || ! grep -q 'needs an NVIDIA GPU' /tmp/demo-gpu.$$; then
		cat /tmp/demo-gpu.$$
		echo "test.sh: on a machine without a GPU, demo.sh --gpu must stop, naming the GPU and driver" >&2
		exit 1
	fi
	cat /tmp/demo-gpu.$$
	rm -f /tmp/demo-gpu.$$
else
	echo "this machine has a GPU: bash scripts/demo.sh --gpu runs the demo on it"
fi
step "the project's CRIU patches (stock and patched CRIU)"
for t in third_party/criu/tests/*.sh; do
	bash "$t"
done
if [ $zdtm = 1 ]; then
	step "zdtm: CRIU's own tests, without and with the plugin"
	bash scripts/zdtm.sh "$root/target/debug/libcriu_gpu_plugin.so"
fi
