#!/usr/bin/env bash
# Every test: sets up what is missing, builds leaktracer, runs the unit tests and the integration
# tests (real eBPF in this kernel, as root: CI=true makes a test that cannot run fail).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build -p tracer
cargo test -p tracer-common -p tracer -p tests
