#!/usr/bin/env bash
# Real workloads (tests/fixtures/bench/: a CPU PyTorch training job, one that keeps every step's
# loss, a transformer that keeps it too, a Hugging Face Trainer job, a Lightning job, a pure-Python service, an allocation-heavy C++ program built -O2) untraced, under leaktracer's default, --heap sampled
# and --heap full, and under memray (Python) and heaptrack as peers, in one run: one table of wall
# time, its ratio to untraced, leaktracer's peak memory, records lost, and whether the leak was
# found at its line. Installs what it needs (the project's set-up, memray into .peers, heaptrack).
#   bash scripts/bench-workloads.sh          QUICK=1 for smaller workloads
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p tracer
[ -d .peers/memray ] || python3 -m pip install -q --no-input --target .peers memray
command -v heaptrack >/dev/null || apt-get install -y -q heaptrack >/dev/null
LT=$PWD/target/release/leaktracer PEERS=$PWD/.peers python3 scripts/bench_workloads.py
