#!/usr/bin/env bash
# The demo: sets up what is missing, builds leaktracer, and runs a leaking "training loop" under
# `leaktracer run` (600 steps, about a minute), with a report every second and the final one at exit; stacks carry verdicts
# (leak, spike, bounded cache, steady) from samples every quarter second. The leak explorer is
# served while it runs: open the printed URL (http://127.0.0.1:7878/, or LEAKTRACER_UI=ADDR; an
# SSH tunnel reaches it from another machine). It stays up with the final report after the loop
# ends, until Ctrl-C. The run is stored in the history (`leaktracer report --list`), a snapshot
# every 2 seconds, for the page's diff view.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p tracer
mkdir -p target/demo
gcc -O1 -fno-builtin -fno-optimize-sibling-calls -fno-omit-frame-pointer -g \
  -o target/demo/demo_train tests/fixtures/demo_train.c
exec ./target/release/leaktracer run --ui="${LEAKTRACER_UI:-127.0.0.1:7878}" --keep-serving \
  --snapshot 2 --interval 1 --sample 0.25 --top 5 -- target/demo/demo_train 600
