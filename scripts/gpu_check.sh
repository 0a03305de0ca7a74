#!/usr/bin/env bash
# GPU check for a machine with no network: build against the local jaxlib, run the GPU tests,
# run compute-sanitizer on the standalone kernel self-test, run the layer benchmark, and write
# a report (<gpu>-<date>-foundation.{json,md}) into the directory given as $1.
#   usage: bash scripts/gpu_check.sh OUTDIR [--quick]
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUTDIR [--quick]}
QUICK=${2:-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# An absolute path that keeps a venv's python a venv python (no symlink resolution).
PY_ABS=$(cd "$(dirname "$(command -v "$PY")")" && pwd)/$(basename "$PY")
LOG="$OUT/gpu_check.log"
STEPS="$OUT/.steps.tsv"
: >"$LOG"
: >"$STEPS"
export PYTHONUNBUFFERED=1 JAXCNN_STRICT=1

# step NAME CMD...: runs CMD, appends its output to the log, records rc and seconds.
step() {
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*" | tee -a "$LOG"
  "$@" >>"$LOG" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$STEPS"
  echo "=== $name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$LOG"
  return $rc
}

step environment bash -c "nvidia-smi; $PY -c 'import jax, jaxlib; print(jax.__version__, jaxlib.__version__, jax.devices())'; nvcc --version; cmake --version | head -1"

# Build against this machine's jaxlib (FFI headers must not be newer than the runtime's).
JAXCNN_CUDA=ON step build $PY -m pip install --no-build-isolation --no-deps -e . || true
step import $PY -c "import jaxcnn; jaxcnn.require_cuda(); from jaxcnn import _ffi; print(_ffi.library_state())"

step pytest_gpu $PY -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/.pytest_gpu.xml" tests
if [ "$QUICK" != "--quick" ]; then
  # The default suite on a GPU machine runs the kernels too (default device is the GPU).
  step pytest_default $PY -m pytest -q -p no:cacheprovider --junitxml="$OUT/.pytest_default.xml" tests
fi

# Standalone self-test (no JAX) under compute-sanitizer.
SELFTEST_BUILD=build/selftest
step selftest_build bash -c "cmake -S . -B $SELFTEST_BUILD -G Ninja -DJAXCNN_CUDA=ON -DJAXCNN_BUILD_SELFTEST=ON -DPython_EXECUTABLE=$PY_ABS -DCMAKE_BUILD_TYPE=Release && cmake --build $SELFTEST_BUILD --target conv2d_selftest"
SELFTEST=$SELFTEST_BUILD/conv2d_selftest
step selftest "$SELFTEST"
step memcheck compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 "$SELFTEST"
step racecheck compute-sanitizer --tool racecheck --error-exitcode 3 "$SELFTEST"
step synccheck compute-sanitizer --tool synccheck --error-exitcode 3 "$SELFTEST"
step initcheck compute-sanitizer --tool initcheck --error-exitcode 3 "$SELFTEST"

BENCH_ARGS=(--out "$OUT")
[ "$QUICK" = "--quick" ] && BENCH_ARGS+=(--quick)
step bench $PY scripts/bench_layers.py "${BENCH_ARGS[@]}"

$PY scripts/foundation_report.py --out "$OUT" --steps "$STEPS" --log "$LOG"
