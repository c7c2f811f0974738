#!/usr/bin/env bash
# Realistic leaks beside their controls (tests/fixtures/suite/): runs each case under
# `leaktracer check --no-store` and tabulates whether check caught the leak (exit 1), passed the
# control (exit 0), and printed the line marked LEAK-SITE in the program's source as the site.
#   bash scripts/leak-suite.sh [FILTER]   FILTER: a substring of the case labels to run
#   LT=path/to/leaktracer   EXTRA_FLAGS="--budget 1MiB/min ..." (passed to check before --)
# The C and C++ programs are built twice into target/leak-suite/: NAME-O2 (gcc/g++ -O2 -g -pthread)
# and NAME-O2fp (the same with -fno-omit-frame-pointer). Always exits 0 once the table is printed.
set -euo pipefail
LT=${LT:-$(dirname "$0")/../target/release/leaktracer}
S=$(cd "$(dirname "$0")/../tests/fixtures/suite" && pwd)
B=$(cd "$(dirname "$0")/.." && pwd)/target/leak-suite
filter=${1:-}
read -r -a extra <<<"${EXTRA_FLAGS:-}"

[ -x "$LT" ] || { echo "leak-suite: no leaktracer at $LT (cargo build --release -p tracer)" >&2; exit 2; }
mkdir -p "$B"
for src in "$S"/*.c "$S"/*.cpp; do
  name=$(basename "${src%.*}")
  case $src in *.c) cc=(gcc) ;; *) cc=(g++) ;; esac
  for build in O2 O2fp; do
    flags=(-O2 -g -pthread -Wall)
    [ "$build" = O2fp ] && flags+=(-fno-omit-frame-pointer)
    out=$B/$name-$build
    [ "$out" -nt "$src" ] || "${cc[@]}" "${flags[@]}" -o "$out" "$src"
  done
done

# label (SOURCE:VARIANT[:BUILD])   want   command
CASES="
logcollect.c:leak:O2       1  $B/logcollect-O2 leak
logcollect.c:leak:O2fp     1  $B/logcollect-O2fp leak
logcollect.c:bounded:O2    0  $B/logcollect-O2 bounded
logcollect.c:bounded:O2fp  0  $B/logcollect-O2fp bounded
workpool.c:leak:O2         1  $B/workpool-O2 leak
workpool.c:leak:O2fp       1  $B/workpool-O2fp leak
workpool.c:fixed:O2        0  $B/workpool-O2 fixed
workpool.c:fixed:O2fp      0  $B/workpool-O2fp fixed
inventory.c:leak:O2        1  $B/inventory-O2 leak
inventory.c:leak:O2fp      1  $B/inventory-O2fp leak
inventory.c:fixed:O2       0  $B/inventory-O2 fixed
inventory.c:fixed:O2fp     0  $B/inventory-O2fp fixed
respcache.c:leak:O2        1  $B/respcache-O2 leak
respcache.c:leak:O2fp      1  $B/respcache-O2fp leak
respcache.c:bounded:O2     0  $B/respcache-O2 bounded
respcache.c:bounded:O2fp   0  $B/respcache-O2fp bounded
respcache.c:spike:O2       0  $B/respcache-O2 spike
respcache.c:spike:O2fp     0  $B/respcache-O2fp spike
undo.c:leak:O2             1  $B/undo-O2 leak
undo.c:leak:O2fp           1  $B/undo-O2fp leak
undo.c:bounded:O2          0  $B/undo-O2 bounded
undo.c:bounded:O2fp        0  $B/undo-O2fp bounded
conns.c:leak:O2            1  $B/conns-O2 leak
conns.c:leak:O2fp          1  $B/conns-O2fp leak
conns.c:fixed:O2           0  $B/conns-O2 fixed
conns.c:fixed:O2fp         0  $B/conns-O2fp fixed
conns.c:spike:O2           0  $B/conns-O2 spike
conns.c:spike:O2fp         0  $B/conns-O2fp spike
sessions.cpp:leak:O2       1  $B/sessions-O2 leak
sessions.cpp:leak:O2fp     1  $B/sessions-O2fp leak
sessions.cpp:fixed:O2      0  $B/sessions-O2 fixed
sessions.cpp:fixed:O2fp    0  $B/sessions-O2fp fixed
reqtree.cpp:leak:O2        1  $B/reqtree-O2 leak
reqtree.cpp:leak:O2fp      1  $B/reqtree-O2fp leak
reqtree.cpp:fixed:O2       0  $B/reqtree-O2 fixed
reqtree.cpp:fixed:O2fp     0  $B/reqtree-O2fp fixed
applog.cpp:leak:O2         1  $B/applog-O2 leak
applog.cpp:leak:O2fp       1  $B/applog-O2fp leak
applog.cpp:bounded:O2      0  $B/applog-O2 bounded
applog.cpp:bounded:O2fp    0  $B/applog-O2fp bounded
registry.cpp:leak:O2       1  $B/registry-O2 leak
registry.cpp:leak:O2fp     1  $B/registry-O2fp leak
registry.cpp:fixed:O2      0  $B/registry-O2 fixed
registry.cpp:fixed:O2fp    0  $B/registry-O2fp fixed
docparse.cpp:leak:O2       1  $B/docparse-O2 leak
docparse.cpp:leak:O2fp     1  $B/docparse-O2fp leak
docparse.cpp:fixed:O2      0  $B/docparse-O2 fixed
docparse.cpp:fixed:O2fp    0  $B/docparse-O2fp fixed
docparse.cpp:spike:O2      0  $B/docparse-O2 spike
docparse.cpp:spike:O2fp    0  $B/docparse-O2fp spike
memo.py:leak               1  python3 $S/memo.py leak
memo.py:bounded            0  python3 $S/memo.py bounded
listeners.py:leak          1  python3 $S/listeners.py leak
listeners.py:fixed         0  python3 $S/listeners.py fixed
history.py:leak            1  python3 $S/history.py leak
history.py:bounded         0  python3 $S/history.py bounded
errors.py:leak             1  python3 $S/errors.py leak
errors.py:fixed            0  python3 $S/errors.py fixed
dedup.py:leak              1  python3 $S/dedup.py leak
dedup.py:fixed             0  python3 $S/dedup.py fixed
dedup.py:spike             0  python3 $S/dedup.py spike
"

leaks=0 caught=0 controls=0 passed=0 sites=0 cases=0 expected=0
echo "| case | want | got | site printed | site right |"
echo "|---|---|---|---|---|"
while read -r label want cmdline; do
  [ -n "$label" ] || continue
  [[ $label == *"$filter"* ]] || continue
  read -r -a cmd <<<"$cmdline"
  src=$S/${label%%:*}
  out=$("$LT" check --no-store "${extra[@]}" -- "${cmd[@]}" </dev/null 2>/dev/null) && got=0 || got=$?
  leak_line=$(grep -m1 -E '^[[:space:]]*LEAK ' <<<"$out" || true)
  site=-
  [ -z "$leak_line" ] || site=${leak_line##*: }
  right=-
  cases=$((cases + 1))
  [ "$got" != "$want" ] || expected=$((expected + 1))
  if [ "$want" = 1 ]; then
    leaks=$((leaks + 1))
    [ "$got" != 1 ] || caught=$((caught + 1))
    marked=$(grep -n 'LEAK-SITE' "$src" | head -1 | cut -d: -f1)
    if [[ $site == *"($(basename "$src"):$marked)" ]]; then
      right=yes
      sites=$((sites + 1))
    else
      right="no (want $(basename "$src"):$marked)"
    fi
  else
    controls=$((controls + 1))
    [ "$got" != 0 ] || passed=$((passed + 1))
  fi
  echo "| $label | $want | $got | ${site//|/\\|} | $right |"
done <<<"$CASES"

echo
echo "leak cases caught (exit 1): $caught / $leaks"
echo "controls passed (exit 0): $passed / $controls"
echo "leak cases whose site is the marked line: $sites / $leaks"
echo "exit code as expected: $expected / $cases"
