#!/usr/bin/env bash
# Python stacks' cost: nanoseconds per allocation of a pure-Python loop (1 KiB bytearrays, each a
# malloc and a free) at call depths 1, 8 and 32: untraced, traced without the Python walk
# (--no-python-stacks), and traced with it; the walk's own cost per event is the difference of the
# last two. Then the same loop per heap mode (--heap sampled and off, Python walk on): what a user
# keeping the tracer attached pays. Median of 5 runs each.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p tracer
py=$(python3 -c 'import sys; print(sys.executable)')
work=tests/fixtures/python/bench_alloc.py
n=200000
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# A finished leaktracer detaches its uprobes in the background for a few seconds; until then every
# malloc on the machine still traps. Each measurement waits for that.
settle() { while pgrep -x leaktracer >/dev/null; do sleep 0.2; done; }
measure() { # mode depth
  for _ in 1 2 3 4 5; do
    settle
    case $1 in
      untraced) "$py" "$work" "$2" "$n" ;;
      native) ./target/release/leaktracer run --no-store --no-python-stacks -o /dev/null -- "$py" "$work" "$2" "$n" 2>/dev/null ;;
      python) ./target/release/leaktracer run --no-store -o /dev/null -- "$py" "$work" "$2" "$n" 2>/dev/null ;;
      sampled|off) ./target/release/leaktracer run --no-store --heap "$1" -o /dev/null -- "$py" "$work" "$2" "$n" 2>/dev/null ;;
    esac
  done | median
}
printf 'ns per allocation (CPython %s, %d allocations, median of 5)\n' "$("$py" -c 'import platform; print(platform.python_version())')" "$n"
printf '%-7s %10s %14s %14s %16s %12s\n' depth untraced 'native only' 'with Python' 'Python walk/ev' 'overhead'
for depth in 1 8 32; do
  u=$(measure untraced "$depth"); nat=$(measure native "$depth"); p=$(measure python "$depth")
  awk -v d="$depth" -v u="$u" -v n="$nat" -v p="$p" 'BEGIN {
    # Each allocation is two events (malloc, free): the walk runs at the malloc only.
    printf "%-7d %10.0f %14.0f %14.0f %16.0f %11.2fx\n", d, u, n, p, p - n, p / u }'
done
printf '\nper heap mode, with the Python walk (ns per allocation, overhead against untraced)\n'
printf '%-7s %10s %18s %18s\n' depth untraced '--heap sampled' '--heap off'
for depth in 1 8 32; do
  u=$(measure untraced "$depth"); s=$(measure sampled "$depth"); o=$(measure off "$depth")
  awk -v d="$depth" -v u="$u" -v s="$s" -v o="$o" 'BEGIN {
    printf "%-7d %10.0f %10.0f %6.2fx %10.0f %6.2fx\n", d, u, s, s / u, o, o / u }'
done
