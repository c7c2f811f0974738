#!/usr/bin/env bash
# The demo: sets up what is missing (the torch wheel included), builds leaktracer, and runs a
# PyTorch training loop with a leak users write into one (a validation pass without
# torch.no_grad() whose predictions are kept, and with them their autograd graphs:
# tests/fixtures/python/train_loop.py) under `leaktracer run`, 1200 steps (about a minute), with a
# report every second and the final one at exit. The tensor stack at the validation line is judged
# a leak within seconds; the stacks carry verdicts (leak, spike, bounded cache, steady…) from
# samples every quarter second. The leak explorer is served while it runs: open the printed URL
# (http://127.0.0.1:7878/, or LEAKTRACER_UI=ADDR; an SSH tunnel reaches it from another machine).
# It stays up with the final report after the loop ends, until Ctrl-C. The run is stored in the
# history (`leaktracer report --list`), a snapshot every 2 seconds, for the page's diff view.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p tracer
export PYTHONPATH=$PWD/.pydeps
exec ./target/release/leaktracer run --ui="${LEAKTRACER_UI:-127.0.0.1:7878}" --keep-serving \
  --snapshot 2 --interval 1 --sample 0.25 --top 5 -- \
  python3 tests/fixtures/python/train_loop.py validation 1200
