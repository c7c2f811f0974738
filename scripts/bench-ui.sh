#!/usr/bin/env bash
# The explorer's benchmark: API latency (p50/p99) on 1k and 100k stacks with 1M outstanding
# allocations, then the page's load time in Chromium against the 100k-stack report, and the
# bundle's size.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p tracer
./target/release/leaktracer bench --api --serve 127.0.0.1:0 2> target/bench-ui.log &
pid=$!
trap 'kill -INT $pid 2>/dev/null || true' EXIT
url=
for _ in $(seq 600); do
  url=$(sed -n 's/^leaktracer: explorer at \(http[^ ]*\).*/\1/p' target/bench-ui.log)
  [ -n "$url" ] && break
  sleep 0.5
done
[ -n "$url" ] || { echo "bench-ui: the explorer did not start" >&2; cat target/bench-ui.log >&2; exit 1; }
(cd web && node tests/pageload.mjs "$url" 10)
