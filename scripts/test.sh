#!/usr/bin/env bash
# Every test: sets up what is missing, builds leaktracer, lints the host crates (clippy, warnings
# as errors), runs the unit tests and the integration tests (real eBPF in this kernel, as root:
# CI=true makes a test that cannot run fail).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Clippy lints the workspace's crates as they compile (warnings as errors): a separate
# `cargo clippy` checks in a mode of its own, which ran every build script again (libtorch's C++
# wrappers, SQLite's C) and took 338 s of a 706 s build here, from scratch.
RUSTC_WORKSPACE_WRAPPER=$(rustup which clippy-driver)
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# leaktracer apart from the tch harness: the harness's build dependencies ask for another feature
# of `cc`, and built together the tracer's dependencies (SQLite's C) and the tracer itself were
# built a second time for the tests below, which do not build the harness.
cargo build -p tracer
cargo build -p harness --all-targets
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
# One test at a time: a tracer test judges a program by when its memory grows, and a test run
# beside it (an untraced oracle, a fixture's build) takes a core from it on two.
cargo test -p tracer-common -p tracer -p tests --lib --tests -- --test-threads=1 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
table=$(cat target/debug/test-scratch/scenarios/*.txt 2>/dev/null || true)
if [ -n "$table" ]; then
  echo "seeded scenarios under leaktracer check (budget 32 KiB/step):"
  echo "$table"
fi
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
