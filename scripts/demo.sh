#!/usr/bin/env bash
# The demo: sets up what is missing, builds leaktracer, and runs a leaking "training loop" under
# `leaktracer run`, with a report every second and the final one at exit; stacks carry verdicts
# (leak, spike, bounded cache, steady) from samples every quarter second. The explorer API is
# served while it runs (the URL is printed; the browser page itself is not built yet), and the run
# is stored in the history (`leaktracer report --list`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p tracer
mkdir -p target/demo
gcc -O1 -fno-builtin -fno-optimize-sibling-calls -fno-omit-frame-pointer -g \
  -o target/demo/demo_train tests/fixtures/demo_train.c
exec ./target/release/leaktracer run --ui --interval 1 --sample 0.25 --top 5 -- target/demo/demo_train
