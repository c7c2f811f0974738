#!/usr/bin/env bash
# The performance benchmarks, figures side by side in one run (never asserted):
#   1. ns per malloc+free pair: untraced, bare probes (the floor), leaktracer --heap full and
#      sampled, free probed at +0, and bcc's memleak on the same workload;
#   2. an allocation storm: event rates, losses and the ledger after;
#   3. the tracer's memory with 1M allocations outstanding across 10k stacks.
# Installs what is missing first: the project's set-up, and bcc's memleak (bpfcc-tools) with the
# kernel headers bcc compiles against (this kernel ships none; Debian's are linked in its place).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
log() { printf '[bench] %s\n' "$*"; }
if ! command -v memleak-bpfcc >/dev/null || ! ls -d /usr/src/linux-headers-*-amd64 >/dev/null 2>&1; then
  log "apt-get install bpfcc-tools linux-headers-amd64 (for bcc's memleak)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bpfcc-tools linux-headers-amd64 >/dev/null
fi
mods=/lib/modules/$(uname -r)
if ! [ -e "$mods/build/Makefile" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 | sort -V | tail -1)
  common=${hdr%-amd64}-common
  log "linking $hdr as $mods/build (bcc needs kernel headers)"
  mkdir -p "$mods"
  ln -sfn "$hdr" "$mods/build"
  ln -sfn "$common" "$mods/source"
fi
cargo build --release -p tracer
lt=./target/release/leaktracer
echo; "$lt" bench --pairs "${PAIRS:-200000}" --rounds "${ROUNDS:-3}"
echo; "$lt" bench --storm --seconds "${STORM_SECONDS:-3}"
echo; "$lt" bench --rss
