#!/bin/bash
# Set-up, step two: the tests. Formatting, lints, unit tests, and whole-system tests against the
# simulated GPU with the real CRIU (root needed: CRIU dumps and restores processes).
#
#   sudo scripts/test.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="/usr/local/sbin:$PATH"
[ "$(id -u)" = 0 ] || { echo "test.sh: run as root (the tests drive CRIU)" >&2; exit 1; }
step() { printf '\n== %s\n' "$*"; }

step "format"
cargo fmt --all -- --check
step "lints"
cargo clippy --locked --workspace --all-targets -- -D warnings
step "build (the tests run the built binaries and libraries)"
cargo build --locked --workspace
step "tests"
cargo test --locked --workspace
