#!/usr/bin/env bash
# GPU check for a machine with no network: build against the local jaxlib, then run the chosen
# sections and write a report (<gpu>-<date>-check_<label>.{json,md}) into the directory given as $1.
#   usage: bash scripts/gpu_check.sh OUTDIR [SECTIONS] [--quick]
#   --quick skips the default (non-GPU-marked) test suite; benchmarks take their own *_ARGS
#   (BENCH_LAYERS_ARGS="--quick" for the smoke-test conv bench).
#   SECTIONS (comma list, default tests,sanitizer,bench):
#     tests      pytest -m gpu, then the default suite (its kernels run on the GPU too, slow tests
#                included), each on GPU_TEST_WORKERS (default 8; 1 = serial) pytest-xdist workers
#                sharing the GPU, with a persistent XLA compilation cache (JAX_COMPILATION_CACHE_DIR,
#                default build/jax_compilation_cache); pytest-xdist from the image, else from
#                .whl/ (pytest_xdist + execnet wheels), else serial
#     sanitizer  compute-sanitizer memcheck/racecheck/synccheck/initcheck on cuda_ops/selftest
#                (SELFTESTS: conv2d_selftest conv2d_tc_selftest depthwise_selftest layout_selftest)
#     bench      scripts/bench_layers.py: jaxcnn.conv2d vs XLA per layer, device time
#     layout     scripts/bench_layout_transform.py: jaxcnn.to_layout vs XLA transpose vs copy
#     poolsoftmax scripts/bench_pool_softmax.py: pooling and softmax vs XLA vs copy
#     layoutchoice scripts/bench_layout_choice.py: autotuned per-layer layouts + chain DP vs XLA
#     fusion     fused fire module: fire_selftest (standalone nvcc build), pytest -m gpu
#                tests/ops/test_fire_gpu.py, scripts/bench_fusion.py (FUSION_BENCH_ARGS)
#     chain      straight conv chains (3x3->1x1, 1x1->depthwise): chain_selftest (standalone nvcc
#                build) + memcheck/racecheck (--small), pytest -m gpu tests/ops/test_chain_gpu.py,
#                scripts/bench_chain.py (CHAIN_BENCH_ARGS, e.g. "--batches 64"; its report lands in OUTDIR),
#                scripts/bench_mobilenetv2.py: MobileNetV2 end to end, XLA vs the fusion plan
#     convpool   fused conv + bias + ReLU + max-pool: conv_pool_selftest (standalone nvcc build),
#                pytest -m gpu tests/ops/test_conv2d_pool_gpu.py, scripts/bench_conv_pool.py
#                (CONVPOOL_BENCH_ARGS, e.g. "--quick")
#     sparse     zero-skipping conv: sparse_selftest (standalone nvcc build) + memcheck/racecheck
#                (--skip-large), pytest -m gpu tests/ops/test_sparse_conv2d_gpu.py, scripts/bench_sparse.py
#                (SPARSE_BENCH_ARGS, e.g. "--quick"; its report lands in OUTDIR)
#     fusionplan fusion planner + fused inception: pytest -m gpu tests/tuning/test_fusion_planner_gpu.py
#                tests/ops/test_inception_gpu.py, scripts/bench_squeezenet.py (FUSIONPLAN_BENCH_ARGS,
#                e.g. "--quick"): SqueezeNet 1.0/1.1 end to end, fire modules, inception blocks
#     shipped    scripts/make_shipped.py --out OUTDIR/shipped (SHIPPED_ARGS, e.g. "--parts zoo,optimized"): the
#                dashboard's shipped data from this code (zoo, optimize(fn), third-party, plans, memory), one
#                export per part; copy them into dashboard/shipped/ (older exports of a part go)
#     planner    scripts/plan_zoo.py (+ bench_memory_planning.py): packing vs XLA's assignment
#     zoo        scripts/profile_zoo.py: every zoo model at batch 1 and 64 into a store + JSON
#     ncu        ncu memory counters (DRAM, L2, L1) of bench layers, jaxcnn and XLA (NCU_LAYERS,
#                NCU_TIMEOUT, NCU_XLA_FLAGS)
#     perfmodel  scripts/validate_perfmodel.py on the bench (and ncu) results
#     flax       jaxcnn.optimize on Flax/Equinox models: pytest -m gpu tests/optimize/test_optimize_gpu.py,
#                scripts/bench_optimize_flax.py (FLAX_BENCH_ARGS, e.g. "--quick"; FLAX_BENCH_AUTOTUNE=1
#                adds a --policy autotune run; a --fuse auto run of SqueezeNet/VGG-19 follows);
#                needs flax + equinox
#     thirdparty scripts/bench_thirdparty.py (THIRDPARTY_ARGS, e.g. "--quick", "--weights args,closed" or "--generalization"; THIRDPARTY_TIMEOUT): Keras 3
#                applications and Flax/Equinox ResNets, XLA vs jaxcnn.optimize(fn); needs keras + flax + equinox
#     weightfold scripts/bench_weight_fold.py (WEIGHTFOLD_ARGS): fold_weights' batched kernel vs XLA's fusion per
#                weight on ResNet-50 / MobileNetV2 weight sets, then ncu sections of the kernel
#     convsweep  scripts/bench_conv_sweep.py (CONVSWEEP_ARGS, e.g. "--quick"; CONVSWEEP_TIMEOUT):
#                conv2d(algorithm="auto") vs XLA on >= 300 random conv shapes + every zoo conv layer, correctness
#                vs float64, ratio distribution and issue 33's goals; report in OUTDIR, its decision caches in raw/
#     multigpu   tests/ops/test_sharding.py on the GPUs' host, scripts/bench_multigpu.py (MULTIGPU_ARGS):
#                data-parallel optimized SqueezeNet 1.1 / VGG-19, 1 vs all visible GPUs
#   REPORT_LABEL names the report (default: the sections joined by '+').
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUTDIR [SECTIONS] [--quick]}
SECTIONS=${2:-tests,sanitizer,bench}
QUICK=${3:-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# An absolute path that keeps a venv's python a venv python (no symlink resolution).
PY_ABS=$(cd "$(dirname "$(command -v "$PY")")" && pwd)/$(basename "$PY")
LABEL=${REPORT_LABEL:-${SECTIONS//,/_}}
RAW="$OUT/raw"
LOG="$OUT/gpu_check.log"
STEPS="$RAW/steps.tsv"
mkdir -p "$RAW"
: >"$LOG"
: >"$STEPS"
export PYTHONUNBUFFERED=1 JAXCNN_STRICT=1

has() { [[ ",$SECTIONS," == *",$1,"* ]]; }

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

# standalone_selftest NAME ARCH FALLBACK SMALL: builds cuda_ops/selftest/NAME.cu with nvcc, linked
# against the build step's kernel archive (FALLBACK, a source or a missing name, when there is none),
# runs it, then memcheck and racecheck on its small cases (SMALL: the selftest's flag for them).
# Steps: NAME_build, NAME, NAME-memcheck, NAME-racecheck.
standalone_selftest() {
  local name=$1 arch=$2 fallback=$3 small=$4
  local bin=build/$name archive
  archive=$(ls build/cp*/libjaxcnn_kernels.a 2>/dev/null | head -1)
  step "${name}_build" nvcc -std=c++17 -O3 -arch="$arch" -I cuda_ops \
    "cuda_ops/selftest/$name.cu" "${archive:-$fallback}" -o "$bin"
  step "$name" "$bin"
  for tool in memcheck racecheck; do
    step "$name-$tool" compute-sanitizer --tool "$tool" --error-exitcode 3 "$bin" "$small"
  done
}

step environment bash -c "nvidia-smi; $PY -c 'import jax, jaxlib; print(jax.__version__, jaxlib.__version__, jax.devices())'; nvcc --version; cmake --version | head -1"
# Build against this machine's jaxlib (FFI headers must not be newer than the runtime's).
# JAXCNN_PREBUILT_LIB=PATH: where a library of these exact sources is kept on this machine (name
# it by a hash of cuda_ops/ and CMakeLists.txt); an existing one is loaded (JAXCNN_LIBRARY)
# instead of building, a fresh build is copied there.
if [ -n "${JAXCNN_PREBUILT_LIB:-}" ] && [ -f "$JAXCNN_PREBUILT_LIB" ]; then
  echo "=== build: reusing $JAXCNN_PREBUILT_LIB" | tee -a "$LOG"
else
  JAXCNN_CUDA=ON step build $PY -m pip install --no-build-isolation --no-deps -e .
  if [ -n "${JAXCNN_PREBUILT_LIB:-}" ]; then
    mkdir -p "$(dirname "$JAXCNN_PREBUILT_LIB")"
    cp "$(ls build/cp*/libjaxcnn_cuda.so | head -1)" "$JAXCNN_PREBUILT_LIB.tmp" && mv "$JAXCNN_PREBUILT_LIB.tmp" "$JAXCNN_PREBUILT_LIB"
  fi
fi
[ -n "${JAXCNN_PREBUILT_LIB:-}" ] && [ -f "$JAXCNN_PREBUILT_LIB" ] && export JAXCNN_LIBRARY=$JAXCNN_PREBUILT_LIB
step import $PY -c "import jaxcnn; jaxcnn.require_cuda(); from jaxcnn import _native; print(_native.library_state())"

if has tests; then
  # pytest-xdist workers share the GPU (tests/conftest.py caps each one's share of its memory);
  # compiled programs persist in JAX_COMPILATION_CACHE_DIR (build/ survives between runs on one
  # machine). Without an importable xdist, the wheels in .whl/ are installed aside; failing that,
  # the tests run serially.
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/build/jax_compilation_cache}
  if ! $PY -c "import xdist" 2>/dev/null && ls .whl/pytest_xdist-*.whl .whl/execnet-*.whl >/dev/null 2>&1; then
    XDIST_SITE=$(mktemp -d)
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$XDIST_SITE" .whl/pytest_xdist-*.whl \
      .whl/execnet-*.whl >>"$LOG" 2>&1 && export PYTHONPATH="$XDIST_SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
  WORKERS=()
  if [ "${GPU_TEST_WORKERS:-8}" -gt 1 ] && $PY -c "import xdist" 2>/dev/null; then
    WORKERS=(-n "${GPU_TEST_WORKERS:-8}" --dist worksteal)
  else
    echo "note: pytest runs serially (pytest-xdist not importable or GPU_TEST_WORKERS=${GPU_TEST_WORKERS:-8})" | tee -a "$LOG"
  fi
  step pytest_gpu $PY -m pytest -q -m gpu -p no:cacheprovider "${WORKERS[@]}" --durations=30 \
    --junitxml="$RAW/pytest_gpu.xml" tests
  [ "$QUICK" = "--quick" ] || \
    step pytest_default $PY -m pytest -q -p no:cacheprovider "${WORKERS[@]}" --durations=30 \
      --junitxml="$RAW/pytest_default.xml" tests
fi

if has sanitizer; then
  SELFTEST_BUILD=build/selftest
  SELFTESTS=${SELFTESTS:-conv2d_selftest conv2d_tc_selftest depthwise_selftest layout_selftest}
  step selftest_build bash -c "cmake -S . -B $SELFTEST_BUILD -G Ninja -DJAXCNN_CUDA=ON -DJAXCNN_BUILD_SELFTEST=ON -DPython_EXECUTABLE=$PY_ABS -DCMAKE_BUILD_TYPE=Release && cmake --build $SELFTEST_BUILD --target ${SELFTESTS// / --target }"
  for name in $SELFTESTS; do
    SELFTEST=$SELFTEST_BUILD/$name
    step "$name" "$SELFTEST"
    # The tensor-core selftest's large layers take minutes under the sanitizers.
    args=(); [ "$name" = conv2d_tc_selftest ] && args=(--skip-large)
    for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}; do
      extra=(); [ "$tool" = memcheck ] && extra=(--leak-check full)
      step "$name-$tool" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 3 "$SELFTEST" "${args[@]}"
    done
  done
fi

if has bench; then
  # shellcheck disable=SC2086
  step bench $PY scripts/bench_layers.py --out "$RAW" ${BENCH_LAYERS_ARGS:-}
fi

if has layout; then
  LAYOUT_ARGS=(--out "$RAW")
  # LAYOUT_BENCH_ARGS narrows the suite, e.g. "--batches 64 --dtypes bf16".
  # shellcheck disable=SC2086
  step layout_bench $PY scripts/bench_layout_transform.py "${LAYOUT_ARGS[@]}" ${LAYOUT_BENCH_ARGS:-}
fi

if has poolsoftmax; then
  POOL_ARGS=(--out "$RAW")
  # shellcheck disable=SC2086
  step pool_softmax_bench $PY scripts/bench_pool_softmax.py "${POOL_ARGS[@]}" ${POOL_BENCH_ARGS:-}
fi

if has layoutchoice; then
  # LAYOUT_CHOICE_ARGS narrows it, e.g. "--models squeezenet1_1 --batches 64 --dtypes bf16".
  # shellcheck disable=SC2086
  step layout_choice timeout "${LAYOUT_CHOICE_TIMEOUT:-1800}" $PY scripts/bench_layout_choice.py --out "$RAW" ${LAYOUT_CHOICE_ARGS:-}
fi

if has fusion; then
  # The fire launcher's wgmma path calls the CUTLASS conv kernels: link the selftest against the
  # build step's kernel archive (no second CUTLASS compile).
  standalone_selftest fire_selftest "${FIRE_SELFTEST_ARCH:-sm_90a}" missing-libjaxcnn_kernels.a --skip-large
  step pytest_fire_gpu $PY -m pytest -q -m gpu -p no:cacheprovider --junitxml="$RAW/pytest_fire_gpu.xml" tests/ops/test_fire_gpu.py
  # shellcheck disable=SC2086
  step fusion_bench $PY scripts/bench_fusion.py --out "$RAW" --label "${FUSION_LABEL:-fire}" ${FUSION_BENCH_ARGS:-}
fi

if has chain; then
  # Links the build step's kernel archive, like the fusion section.
  standalone_selftest chain_selftest "${CHAIN_SELFTEST_ARCH:-sm_90a}" missing-libjaxcnn_kernels.a --small
  step pytest_chain_gpu $PY -m pytest -q -m gpu -p no:cacheprovider --junitxml="$RAW/pytest_chain_gpu.xml" tests/ops/test_chain_gpu.py
  # shellcheck disable=SC2086
  step chain_bench $PY scripts/bench_chain.py --out "$OUT" ${CHAIN_BENCH_ARGS:-}
  step mobilenetv2_e2e $PY scripts/bench_mobilenetv2.py --out "$OUT"
fi

if has convpool; then
  # The launcher's wgmma kernel is a CUTLASS/CuTe sm_90a TU: link the build step's kernel archive.
  standalone_selftest conv_pool_selftest "${CONVPOOL_SELFTEST_ARCH:-sm_90a}" missing-libjaxcnn_kernels.a --skip-large
  step pytest_conv2d_pool_gpu $PY -m pytest -q -m gpu -p no:cacheprovider --junitxml="$RAW/pytest_conv2d_pool_gpu.xml" tests/ops/test_conv2d_pool_gpu.py
  # shellcheck disable=SC2086
  step conv_pool_bench $PY scripts/bench_conv_pool.py --out "$RAW" ${CONVPOOL_BENCH_ARGS:-}
fi

if has sparse; then
  # Links the build step's kernel archive (sparse_conv.cu alone compiles for minutes); without
  # one (a failed build) it compiles the launcher standalone.
  standalone_selftest sparse_selftest "${SPARSE_SELFTEST_ARCH:-sm_90a}" cuda_ops/sparse/sparse_conv.cu --skip-large
  step pytest_sparse_gpu $PY -m pytest -q -m gpu -p no:cacheprovider --junitxml="$RAW/pytest_sparse_gpu.xml" \
    tests/ops/test_sparse_conv2d_gpu.py
  # shellcheck disable=SC2086
  step sparse_bench timeout "${SPARSE_BENCH_TIMEOUT:-3600}" $PY scripts/bench_sparse.py --out "$OUT" \
    --label "${SPARSE_LABEL:-sparse}" ${SPARSE_BENCH_ARGS:-}
fi

if has fusionplan; then
  step pytest_fusionplan_gpu $PY -m pytest -q -m gpu -p no:cacheprovider --junitxml="$RAW/pytest_fusionplan_gpu.xml" \
    tests/tuning/test_fusion_planner_gpu.py tests/ops/test_inception_gpu.py
  # shellcheck disable=SC2086
  step fusionplan_bench timeout "${FUSIONPLAN_TIMEOUT:-1800}" $PY scripts/bench_squeezenet.py --out "$OUT" \
    --cache "$RAW/fusion_autotune.json" ${FUSIONPLAN_BENCH_ARGS:-}
fi

if has planner; then
  # The memory planner on the GPU's compiled programs: ours vs peers vs XLA's own assignment.
  # shellcheck disable=SC2086
  step plan_zoo timeout "${PLANNER_TIMEOUT:-600}" $PY scripts/plan_zoo.py --out "$RAW" --label planner_zoo \
    --db "$RAW/plans.sqlite" ${PLAN_ZOO_ARGS:-}
  if [ -f scripts/bench_memory_planning.py ]; then
    # shellcheck disable=SC2086
    step memory_planning timeout "${PLANNER_TIMEOUT:-600}" $PY scripts/bench_memory_planning.py --out "$RAW" \
      --label memory_planning ${MEMORY_PLANNING_ARGS:-}
  fi
fi

if has shipped; then
  step make_shipped $PY scripts/make_shipped.py --out "$OUT/shipped" ${SHIPPED_ARGS:-}
fi

if has zoo; then
  GPU_SLUG=$($PY -c "import jax, re; print(re.sub('[^a-z0-9]+', '', jax.devices()[0].device_kind.lower().replace('nvidia', '')) or 'gpu')")
  ZOO_BATCHES=${ZOO_BATCHES:-1,64}
  ZOO_MODELS=${ZOO_MODELS:-$($PY -c "from jaxcnn.models import list_models; print(','.join(list_models()))")}
  step zoo $PY scripts/profile_zoo.py --db "$RAW/zoo.sqlite" --batches "$ZOO_BATCHES" --models "$ZOO_MODELS" \
    --iters "${ZOO_ITERS:-20}" \
    --export "$OUT/$GPU_SLUG-$(date +%F)-zoo_profiles.json"
fi

if has ncu; then
  NCU_LAYERS=${NCU_LAYERS:-"vgg_c3_1:bf16 vgg_c5_1:bf16 sq_fire_sq:bf16 sq_fire_ex3:bf16 resnet_1x1_b64:bf16 vgg_c3_1:fp32"}
  cases=()
  # Our modelled kernel (the CUDA-core direct conv) and XLA's choice.
  for layer in $NCU_LAYERS; do cases+=("$layer:${NCU_OURS:-jaxcnn_direct}" "$layer:xla_default"); done
  # NCU_XLA_FLAGS (e.g. --xla_gpu_autotune_level=0) for the profiled processes only.
  step ncu env XLA_FLAGS="${NCU_XLA_FLAGS:-${XLA_FLAGS:-}}" timeout "${NCU_TIMEOUT:-300}" $PY scripts/ncu_collect.py --per-case --out "$RAW/ncu.csv" "${cases[@]}"
fi

if has perfmodel; then
  PM_ARGS=(--bench "$RAW/bench_layers.json" --out "$RAW" --fit --cross-validate)
  [ -s "$RAW/ncu.csv" ] && PM_ARGS+=(--ncu "$RAW/ncu.csv")
  [ -f "$RAW/zoo.sqlite" ] && PM_ARGS+=(--store "$RAW/zoo.sqlite")
  step perfmodel $PY scripts/validate_perfmodel.py "${PM_ARGS[@]}"
fi

if has flax; then
  step flax_import $PY -c "import flax, equinox; print('flax', flax.__version__, 'equinox', equinox.__version__)"
  step pytest_optimize_gpu $PY -m pytest -q -m gpu -p no:cacheprovider --junitxml="$RAW/pytest_optimize_gpu.xml" \
    tests/optimize/test_optimize_gpu.py
  # shellcheck disable=SC2086
  step bench_optimize_flax timeout "${FLAX_BENCH_TIMEOUT:-2400}" $PY scripts/bench_optimize_flax.py --out "$OUT" \
    ${FLAX_BENCH_ARGS:-}
  if [ "${FLAX_BENCH_AUTOTUNE:-0}" = 1 ]; then
    # The same with each conv autotuned (jaxcnn.layouts, XLA's conv kept where it wins).
    # shellcheck disable=SC2086
    step bench_optimize_flax_autotune timeout "${FLAX_BENCH_TIMEOUT:-2400}" $PY scripts/bench_optimize_flax.py \
      --out "$OUT" --policy autotune --name optimize_flax_autotune ${FLAX_BENCH_ARGS:-}
  fi
  # Fusion through optimize: fire modules (NHWC and Equinox's NCHW), inception blocks and
  # conv->max-pool pairs, each where the planner measures it faster.
  # shellcheck disable=SC2086
  step bench_optimize_flax_fuse timeout "${FLAX_BENCH_TIMEOUT:-2400}" $PY scripts/bench_optimize_flax.py \
    --out "$OUT" --fuse auto --name optimize_flax_fuse --models linen_squeezenet1_1,linen_vgg19,equinox_squeezenet1_1,linen_googlenet_head ${FLAX_BENCH_ARGS:-}
fi

if has thirdparty; then
  step thirdparty_import $PY -c "import os; os.environ['KERAS_BACKEND'] = 'jax'; import keras, flax, equinox; print('keras', keras.__version__, 'flax', flax.__version__, 'equinox', equinox.__version__)"
  # shellcheck disable=SC2086
  step bench_thirdparty timeout "${THIRDPARTY_TIMEOUT:-3000}" $PY scripts/bench_thirdparty.py --out "$OUT" \
    ${THIRDPARTY_ARGS:-}
fi

if has weightfold; then
  # shellcheck disable=SC2086
  step weight_fold_bench $PY scripts/bench_weight_fold.py --out "$OUT" ${WEIGHTFOLD_ARGS:-}
  # The limiter of the batched fold kernel: ncu's throughput, memory, occupancy and stall sections
  # of its first launch (ResNet-50's weights, XLA's OHWI layout), into the log (WEIGHTFOLD_NCU=0 skips it).
  if [ "${WEIGHTFOLD_NCU:-1}" = 1 ] && command -v ncu >/dev/null 2>&1; then
    step weight_fold_ncu ncu --kernel-name regex:weight_fold_kernel --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats $PY scripts/bench_weight_fold.py --out "$RAW/weight_fold_ncu" --models resnet50 \
      --layouts ohwi --iters 1 --warmup 0
  fi
fi

if has convsweep; then
  # Its own --budget-s (default 270 s) stops starting chunks; CONVSWEEP_ARGS="--resume <earlier report JSON>"
  # runs the cases that one lacks and writes a report of all.
  # shellcheck disable=SC2086
  step conv_sweep timeout "${CONVSWEEP_TIMEOUT:-1800}" $PY scripts/bench_conv_sweep.py --out "$OUT" \
    --cache-dir "$RAW/conv_sweep_autotune" ${CONVSWEEP_ARGS:-}
fi

if has multigpu; then
  step gpu_count $PY -c "import jax; print(jax.device_count(), jax.devices())"
  # The CPU sharding checks (8 forced host devices) and the optimize'd-model data-parallel test.
  step pytest_sharding env JAX_PLATFORMS=cpu $PY -m pytest -q -p no:cacheprovider --junitxml="$RAW/pytest_sharding.xml" \
    tests/ops/test_sharding.py tests/ops/test_pool_softmax_sharding.py
  step pytest_multigpu $PY -m pytest -q -m gpu -p no:cacheprovider tests/optimize/test_optimize_gpu.py -k data_parallel
  # shellcheck disable=SC2086
  step bench_multigpu timeout "${MULTIGPU_TIMEOUT:-2400}" $PY scripts/bench_multigpu.py --out "$OUT" ${MULTIGPU_ARGS:-}
  # The unmodified models' scaling: is a wall-time gap jaxcnn's or the multi-device dispatch's?
  # shellcheck disable=SC2086
  step bench_multigpu_xla timeout "${MULTIGPU_TIMEOUT:-2400}" $PY scripts/bench_multigpu.py --out "$OUT" \
    --policy xla --name multigpu_xla ${MULTIGPU_ARGS:-}
fi

EXTRA=()
for f in "$RAW/perfmodel_validation.json"; do [ -f "$f" ] && EXTRA+=("$f"); done
$PY scripts/gpu_check_report.py --out "$OUT" --raw "$RAW" --steps "$STEPS" --log "$LOG" --label "$LABEL" --extra "${EXTRA[@]}"
rc=$?
# Everything else travels back as one archive (the device tool returns at most 8 files).
tar -czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$RAW"
exit $rc
