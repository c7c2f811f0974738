#!/usr/bin/env bash
# The check for a machine with an NVIDIA GPU, its driver, and a python3 with a CUDA build of
# torch (none of it is installed here: such a machine comes with them). Runs the training loop of
# tests/fixtures/python/train_loop.py on the GPU (PyTorch's caching allocator) in eight cases:
# leaks (predictions kept with their graphs, left with os._exit so that the bytes held at the end
# can be compared, and the same with a normal exit that frees them; a hook keeping activations;
# the first leak with expandable segments and with a DataLoader of two workers) and controls
# (fixed, left with os._exit too; a bounded cache and a spike, which exit normally). Each case runs three times:
#   - with PyTorch's own allocation history (ORACLE=1; all cases at once, first): the oracle, the
#     bytes and blocks still allocated at the end, per line of the script;
#   - untraced, for the wall time and the loop's time;
#   - under `leaktracer check` with default options.
# It prints one table: check's exit code and the line it names, the tensor blocks (torch_block)
# at the script's lines beside the oracle and torch.cuda.memory_allocated(), the device segments
# and their verdicts, NVML, losses, and the times untraced and traced. Then the start-up alone
# (import torch, a first tensor on the device), untraced twice and traced: the libraries looked at
# while the process was held, the layers that went in, what the probes cost in the kernel.
#   LT=path/to/leaktracer PY=path/to/python3 [ONLY="leak fixed"] bash scripts/gpu-check.sh [STEPS]
# DEVICE=cpu runs the same cases on the CPU (no oracle, no blocks): a dry run of the script.
# STANDIN=DIR runs them on a machine without a GPU, on the stand-in CUDA libraries the tests
# build (target/debug/test-scratch/fixtures/fakecuda, once `cargo test -p tests --test it
# torch_cuda` ran): the wheel's real caching allocator and PyTorch's own history, kernels that
# compute nothing, so that the bytes and lines are checked and the times are not a GPU's.
set -uo pipefail
cd "$(dirname "$0")/.."
LT=${LT:-target/release/leaktracer}
PY=${PY:-python3}
STEPS=${1:-200}
DEVICE=${DEVICE:-cuda}
DIR=${DIR:-$(mktemp -d)}
mkdir -p "$DIR"
# The script's environment: the stand-in runtime and cuBLAS in place of the wheel's.
PYENV=()
if [ -n "${STANDIN:-}" ]; then
  PYENV=("LD_PRELOAD=$STANDIN/libcudart.so.13 $STANDIN/libcublas.so.13 $STANDIN/libcublasLt.so.13"
         "LD_LIBRARY_PATH=$STANDIN")
fi
[ -x "$LT" ] || { echo "gpu-check: no leaktracer at $LT" >&2; exit 2; }
if [ "$DEVICE" = cuda ]; then
  env "${PYENV[@]}" "$PY" -c 'import torch; assert torch.cuda.is_available(); print("torch", torch.__version__, torch.cuda.get_device_name(0))' \
    || { echo "gpu-check: $PY has no CUDA torch" >&2; exit 2; }
fi
SCRIPT=tests/fixtures/python/train_loop.py
# name|expected|environment|arguments
CASES=(
  "leak|leak||validation $STEPS abrupt"
  "released|leak||validation $STEPS"
  "hook|leak||hook $STEPS abrupt"
  "expandable|leak|PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True|validation $STEPS abrupt"
  "loader|leak|LOADER=2|validation $STEPS abrupt"
  "fixed|none||metrics-fixed $STEPS abrupt"
  "bounded|none||bounded $STEPS"
  "spike|none||spike $STEPS"
)
# ONLY="leak fixed" runs those cases alone.
if [ -n "${ONLY:-}" ]; then
  for i in "${!CASES[@]}"; do
    [[ " $ONLY " == *" ${CASES[$i]%%|*} "* ]] || unset 'CASES[i]'
  done
  CASES=("${CASES[@]}")
fi
field() { cut -d'|' -f"$2" <<<"$1"; }
stamp() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(stamp)" 'BEGIN { printf "%.2f\n", b - a }'; }

for case in "${CASES[@]}"; do
  name=$(field "$case" 1)
  # shellcheck disable=SC2046
  env "${PYENV[@]}" DEVICE="$DEVICE" ORACLE=1 $(field "$case" 3) timeout 300 "$PY" "$SCRIPT" $(field "$case" 4) \
    > "$DIR/$name.oracle" 2>&1 &
done
wait
for case in "${CASES[@]}"; do
  name=$(field "$case" 1)
  echo "$(field "$case" 2)" > "$DIR/$name.expected"
  start=$(stamp)
  # shellcheck disable=SC2046
  env "${PYENV[@]}" DEVICE="$DEVICE" $(field "$case" 3) timeout 300 "$PY" "$SCRIPT" $(field "$case" 4) \
    > "$DIR/$name.untraced" 2>&1
  since "$start" > "$DIR/$name.untraced-s"
  start=$(stamp)
  # shellcheck disable=SC2046
  timeout 300 "$LT" check --no-store --json -o "$DIR/$name.json" -- \
    /usr/bin/env "${PYENV[@]}" DEVICE="$DEVICE" $(field "$case" 3) "$PY" "$SCRIPT" $(field "$case" 4) \
    > "$DIR/$name.out" 2> "$DIR/$name.err"
  echo $? > "$DIR/$name.rc"
  since "$start" > "$DIR/$name.traced-s"
done
"$PY" scripts/gpu_check_table.py "$DIR" "$SCRIPT" "${CASES[@]%%|*}"

# Start-up alone (import torch, a first tensor on the device), untraced twice and traced with
# the tracer's timeline and its probes' cost: where a traced job's seconds before its loop go.
FIRST="import time, torch; t = time.monotonic(); torch.zeros(1, device='$DEVICE').sum().item(); print(f'first tensor {time.monotonic() - t:.2f} s')"
: > "$DIR/startup.untraced-s"
for _ in 1 2; do
  start=$(stamp)
  timeout 120 env "${PYENV[@]}" "$PY" -c "$FIRST" > "$DIR/startup.untraced.out" 2>&1
  since "$start" >> "$DIR/startup.untraced-s"
done
start=$(stamp)
RUST_LOG=info,tracer::probes::prober=debug,tracer::probes::objects=debug,tracer::session::owner=debug \
  timeout 120 "$LT" run --no-store --probe-cost --json -o "$DIR/startup.json" -- /usr/bin/env "${PYENV[@]}" "$PY" -c "$FIRST" \
  > "$DIR/startup.out" 2> "$DIR/startup.err"
since "$start" > "$DIR/startup.traced-s"
"$PY" scripts/gpu_check_startup.py "$DIR"
