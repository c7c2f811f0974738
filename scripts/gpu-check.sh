#!/usr/bin/env bash
# The check for a machine with an NVIDIA GPU, its driver, and a python3 with a CUDA build of
# torch (none of it is installed here: such a machine comes with them). Runs the training loop of
# tests/fixtures/python/train_loop.py on the GPU (DEVICE=cuda: PyTorch's caching allocator)
# untraced and under `leaktracer check` with default options, and prints one table: check's exit
# code and the site it names, the tensor blocks (torch_block) at the script's lines beside what
# PyTorch says the kept tensors hold and torch.cuda.memory_allocated(), the device verdicts,
# NVML, losses, and wall times.
#   LT=path/to/leaktracer PY=path/to/python3 bash scripts/gpu-check.sh [STEPS]
set -uo pipefail
cd "$(dirname "$0")/.."
LT=${LT:-target/release/leaktracer}
PY=${PY:-python3}
STEPS=${1:-200}
OUT=${OUT:-$(mktemp -d)}
[ -x "$LT" ] || { echo "gpu-check: no leaktracer at $LT" >&2; exit 2; }
"$PY" -c 'import torch; assert torch.cuda.is_available(); print("torch", torch.__version__, torch.cuda.get_device_name(0))' \
  || { echo "gpu-check: $PY has no CUDA torch" >&2; exit 2; }
SCRIPT=tests/fixtures/python/train_loop.py
for args in "hook $STEPS abrupt" "validation $STEPS abrupt" "validation $STEPS" "bounded $STEPS" "spike $STEPS"; do
  name=${args// /-}
  start=$(date +%s.%N)
  DEVICE=cuda "$PY" "$SCRIPT" $args > "$OUT/$name.untraced" 2>&1
  echo "$(date +%s.%N) - $start" | bc > "$OUT/$name.untraced-s"
  start=$(date +%s.%N)
  "$LT" check --no-store --json -o "$OUT/$name.json" -- /usr/bin/env DEVICE=cuda "$PY" "$SCRIPT" $args \
    > "$OUT/$name.out" 2> "$OUT/$name.err"
  echo $? > "$OUT/$name.rc"
  echo "$(date +%s.%N) - $start" | bc > "$OUT/$name.traced-s"
done
"$PY" - "$OUT" "$SCRIPT" <<'PYEOF'
import json, os, sys
out, script = sys.argv[1], os.path.abspath(sys.argv[2])
print("| case | exit | site check names | torch_block at the script's lines (blocks) | PyTorch: kept (storages) | memory_allocated | torch_block total | device: bytes, verdicts | NVML (at s) | lost | untraced s | traced s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in sorted(f[:-3] for f in os.listdir(out) if f.endswith(".rc")):
    rd = lambda ext: open(os.path.join(out, name + ext)).read()
    rc = rd(".rc").strip()
    text = rd(".out")
    figures = next((json.loads(l) for l in text.splitlines() if l.startswith("{")), {})
    site = next((l.rsplit(": ", 1)[-1] for l in text.splitlines() if l.strip().startswith("LEAK")), "-")
    try:
        r = json.loads(rd(".json").strip().splitlines()[-1])
    except Exception as e:
        print(f"| {name} | {rc} | no report: {e} |"); continue
    def own(s):
        return any(f.get("module") == "python" and f.get("file") == script for f in s["frames"])
    blocks = [s for s in r["stacks"] if s["kind"] == "torch_block" and own(s)]
    dev = [s for s in r["stacks"] if s["kind"] == "device"]
    verdicts = sorted({(s.get("verdict") or {}).get("verdict", "none") for s in dev})
    gpu = [p for p in r["gpu"]["processes"] if p.get("nvml_bytes")]
    nvml = ", ".join(f"{p['nvml_bytes']} ({p.get('nvml_at_s') or 0:.1f})" for p in gpu) or "-"
    print(f"| {name} | {rc} | {site} | {sum(s['bytes'] for s in blocks)} ({sum(s['blocks'] for s in blocks)}) "
          f"| {figures.get('kept_bytes')} ({figures.get('kept_blocks')}) | {figures.get('memory_allocated')} "
          f"| {r['totals']['torch_block']['bytes']} | {r['totals']['device']['bytes']}, {'/'.join(verdicts)} "
          f"| {nvml} | {r['losses']['ringbuf_full']} | {float(rd('.untraced-s')):.1f} | {float(rd('.traced-s')):.1f} |")
PYEOF
