#!/usr/bin/env bash
# Idempotent set-up for a fresh machine of the project's kind: rustup pieces, bpf-linker built against
# the pinned toolchain's own LLVM, apt packages the tests use, and tracefs. A second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

TC=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
log() { printf '[setup] %s\n' "$*" >&2; }

# pip_into DIR PACKAGE...: wheels only, into DIR afresh. A wheel cut short or corrupted on the way
# (pip then names a hash that does not match the index's) is downloaded again, up to three tries,
# without pip's cache the second time.
pip_into() {
  local dir=$1 try
  shift
  for try in 1 2 3; do
    rm -rf "$dir"
    if python3 -m pip install --quiet --no-input --root-user-action=ignore --only-binary=:all: \
         $([ "$try" = 1 ] || echo --no-cache-dir) --target "$dir" "$@"; then
      return 0
    fi
    log "pip could not install into $dir (try $try of 3)"
  done
  echo "setup: pip could not install $* into $dir" >&2
  exit 1
}

if [ "$(id -u)" != 0 ]; then
  echo "setup: must run as root (eBPF probes need CAP_BPF/CAP_PERFMON and tracefs)" >&2
  exit 77
fi

# 1. The pinned nightly with rust-src (RUSTUP_AUTO_INSTALL=0 here: rust-toolchain.toml never installs itself).
if ! rustup run "$TC" rustc --version >/dev/null 2>&1 \
   || ! [ -d "$(rustup run "$TC" rustc --print sysroot)/lib/rustlib/src/rust/library" ]; then
  log "installing toolchain $TC with rust-src"
  rustup toolchain install "$TC" --profile minimal --component rust-src,rustfmt,clippy
fi

# 2. bpf-linker linked to that toolchain's libLLVM (same LLVM as the code it links).
SR=$(rustup run "$TC" rustc --print sysroot)
MAJOR=$(rustup run "$TC" rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
STAMP="$HOME/.cargo/bin/.bpf-linker-$TC"
if ! [ -x "$HOME/.cargo/bin/bpf-linker" ] || ! [ -f "$STAMP" ]; then
  LIB=$(cd "$SR/lib" && ls libLLVM*.so | head -1 | sed 's/^lib//; s/\.so$//')
  log "building bpf-linker 0.13.0 against $LIB (LLVM $MAJOR)"
  RUSTFLAGS="-L native=$SR/lib -l dylib=$LIB -C link-arg=-Wl,-rpath,$SR/lib" \
    cargo +"$TC" install bpf-linker --version 0.13.0 --locked --force \
      --no-default-features --features "llvm-$MAJOR,no-llvm-linking"
  touch "$STAMP"
fi

# 3. apt packages: gcc, g++ and libc6-dev for fixtures, valgrind as the exit-totals oracle, libc6-dbg for libc line info;
#    the export checkers: protoc with pprof's profile.proto (golang-github-google-pprof-dev) and
#    promtool (prometheus); Node.js and npm to build the explorer page, Chromium to test it.
#    Services are not started (policy-rc.d), only the tools are wanted.
need=()
pkgs=(gcc g++ libc6-dev valgrind libc6-dbg protobuf-compiler golang-github-google-pprof-dev prometheus chromium)
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  apt-get update -qq
  own_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
  [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
fi

# 4. For the Python tests, for the machine's python3, into .pydeps (the tests put it on
#    PYTHONPATH): numpy (a leak through a list of arrays) and PyTorch as users install it, the torch
#    wheel with its dependencies (the CUDA libraries `import torch` loads even on a CPU; ~4.5 GB;
#    triton's package holds the CUDA headers the tests build their stand-in CUDA runtime against).
#    Its torch/ is also the tch harness's libtorch (LIBTORCH in .cargo/config.toml): a CPU-usable
#    libtorch whose libraries find the CUDA runtime they link against beside them.
#    Pinned: the newest numpy for CPython 3.11, and the PyTorch release tch 0.26 is built for.
#
#    A wheel set is installed once per machine, into a directory of $LEAKTRACER_CACHE named by its
#    pins (a set that installed whole is marked so), and .pydeps links to it: a second clone, as
#    the test command's run on a clean clone, does not unpack 4.5 GB again. A .pydeps that is a
#    directory of its own, complete, is kept as it is.
CACHE=${LEAKTRACER_CACHE:-/var/cache/leaktracer}

# wheels_at LINK NAME CHECK PIP_ARGS...: LINK (in the clone) names a wheel set NAME complete when
# CHECK (a file in it) is there; installs the set into $CACHE/NAME when it is not whole there.
wheels_at() {
  local link=$1 name=$2 check=$3
  shift 3
  if [ -d "$link" ] && ! [ -L "$link" ] && [ -f "$link/$check" ]; then
    return 0
  fi
  local dir="$CACHE/$name"
  mkdir -p "$CACHE"
  (
    flock 9
    if ! [ -f "$dir/.installed" ] || ! [ -f "$dir/$check" ]; then
      if ! python3 -m pip --version >/dev/null 2>&1; then
        log "apt-get install python3-pip"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip
      fi
      log "installing $* into $dir"
      pip_into "$dir" "$@"
      [ -f "$dir/$check" ] || { echo "setup: $check did not install into $dir" >&2; exit 1; }
      touch "$dir/.installed"
    fi
  ) 9>"$CACHE/.lock"
  rm -rf "$link"
  ln -s "$dir" "$link"
}

wheels_at .pydeps pydeps-numpy-2.4.6-torch-2.13.0 torch-2.13.0.dist-info/METADATA \
  'numpy==2.4.6' 'torch==2.13.0'
[ -f .pydeps/numpy-2.4.6.dist-info/METADATA ] || { echo "setup: numpy is not in .pydeps" >&2; exit 1; }

# 4b. Hugging Face's Trainer for the test of a job as its users write one (transformers and
#     accelerate over the torch of .pydeps), into .pydeps-hf: each package pinned and without
#     its dependencies (accelerate's would install torch a second time).
wheels_at .pydeps-hf pydeps-hf-transformers-4.46.3 transformers-4.46.3.dist-info/METADATA \
  --no-deps 'transformers==4.46.3' 'accelerate==1.1.1' 'tokenizers==0.20.3' \
  'huggingface-hub==0.29.3' 'safetensors==0.8.0' 'regex==2026.12.2' 'PyYAML==6.0.4' \
  'requests==2.34.2' 'urllib3==2.8.0' 'idna==3.20' 'certifi==2026.10.19.post1' \
  'charset-normalizer==3.5.3' 'tqdm==4.70.1' 'packaging==26.4' 'psutil==7.2.2'

# 4c. Lightning, for the test of a job as its users write one with it (over the torch of .pydeps),
#     into .pydeps-pl, pinned and without dependencies likewise.
wheels_at .pydeps-pl pydeps-pl-lightning-2.6.6 lightning-2.6.6.dist-info/METADATA \
  --no-deps 'lightning==2.6.6' 'lightning-utilities==0.15.3' 'torchmetrics==1.9.0' \
  'PyYAML==6.0.4' 'tqdm==4.70.1' 'packaging==26.4'

# 5. tracefs (syscall tracepoints need it; the tool mounts it too, this keeps the tests' view simple).
if ! [ -e /sys/kernel/tracing/events ]; then
  log "mounting tracefs"
  mount -t tracefs nodev /sys/kernel/tracing
fi

# 6. The explorer page (web/): its npm packages as locked, then the type check and the build into
#    web/dist (embedded by the tracer's build), redone when a source is newer than the build.
if ! [ -f web/node_modules/.package-lock.json ] || [ web/package-lock.json -nt web/node_modules/.package-lock.json ]; then
  log "npm ci in web/"
  (cd web && npm ci --no-audit --no-fund --loglevel=error)
fi
if ! [ -f web/dist/app.js ] || [ -n "$(find web/src web/index.html web/build.mjs web/package-lock.json -newer web/dist/app.js -print -quit)" ]; then
  log "building the explorer page"
  (cd web && npm run --silent typecheck && npm run --silent build)
fi
