"""The third-party CNNs with inference BatchNorm (benchmarks/thirdparty_models.py: Flax linen,
nnx and Equinox ResNets; benchmarks/keras_models.py: Keras 3 applications on the JAX backend)
and scripts/bench_thirdparty.py, on the CPU at tiny sizes: every model builds and runs, its
BatchNorm uses the running statistics, jaxcnn.optimize(apply) computes what apply does, and the
bench's --smoke run writes its report. The Keras tests skip where keras is not installed."""

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn

pytest.importorskip("flax")
pytest.importorskip("equinox")

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import bench_thirdparty  # noqa: E402
from benchmarks import thirdparty_models as tm  # noqa: E402

needs_keras = pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                                 reason="keras is not installed (pip install 'jaxcnn[keras]')")

BATCHNORM_MODELS = ["linen_resnet18", "linen_resnet50", "nnx_resnet18", "equinox_resnet18"]
KERAS_MODELS = ["keras_resnet50", "keras_mobilenetv2", "keras_vgg16", "keras_inceptionv3"]
CLASSES = 10
# The smallest images the models take (five stride-2 stages; Keras's Inception models need 75).
HW = {"keras_inceptionv3": 75, "keras_inceptionresnetv2": 75}
SMALL_HW = 32
# max |optimized - original| / max |original|. float32: the rewritten ops run their lax
# references on the CPU, and a rewrite may reassociate a conv's sums or fold a BatchNorm into
# its weights: a few float32 ulps (6e-8) per layer, compounded over ~50 layers and grown by the
# BatchNorm scales, stay below 2e-4. bfloat16: one rounding of a bf16 output (2^-8) may differ
# per layer where the arithmetic is reordered.
REL_TOL = {jnp.float32: 2e-4, jnp.bfloat16: 5e-2}


@functools.lru_cache(maxsize=4)  # a test reuses a model the tests just before it built
def build(name, dtype):
    """Model `name` at batch 2, its smallest images and CLASSES classes."""
    return tm.build(name, batch=2, hw=HW.get(name, SMALL_HW), dtype=dtype, num_classes=CLASSES)


def rel_diff(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def check_model(name, dtype=jnp.float32):
    """Builds `name`, runs it under jit, checks its BatchNorm is per example (running statistics,
    not the batch's) and that jaxcnn.optimize(apply) gives the same outputs. Returns the model."""
    m = build(name, dtype)
    run = jax.jit(m.apply)
    y = run(m.params, m.x)
    assert y.shape == (2, CLASSES) and y.dtype == dtype
    assert np.all(np.isfinite(np.asarray(y, np.float32)))
    # Inference BatchNorm normalises each example alone: the first example's output does not
    # change with the second (batch statistics would couple them), which changes its output.
    other = run(m.params, m.x.at[1].multiply(-2))
    assert rel_diff(other[:1], y[:1]) <= REL_TOL[dtype] < rel_diff(other[1:], y[1:])
    got = jax.jit(jaxcnn.optimize(m.apply))(m.params, m.x)
    assert got.shape == y.shape and got.dtype == y.dtype
    assert rel_diff(got, y) <= REL_TOL[dtype]
    return m


@pytest.mark.slow
@pytest.mark.parametrize("name", BATCHNORM_MODELS)
def test_batchnorm_model_runs_and_optimize_matches(name):
    check_model(name)


@pytest.mark.slow
def test_batchnorm_values_are_like_trained():
    """The builders replace a fresh BatchNorm's identity values (which would hide a wrong fold)."""
    stats = jax.tree.leaves(build("linen_resnet18", jnp.float32).params["batch_stats"])
    assert stats and all(not np.allclose(np.asarray(a), 0) and not np.allclose(np.asarray(a), 1) for a in stats)
    with pytest.raises(ValueError, match="role"):
        tm.like_trained_batchnorm("gamma", (4,), jnp.float32, np.random.default_rng(0))


def test_listing_models_imports_no_model_library():
    code = ("import sys; from benchmarks import thirdparty_models as tm; assert 'keras_resnet50' in tm.MODELS; "
            "loaded = [m for m in ('keras', 'flax', 'equinox') if m in sys.modules]; assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)


def test_keras_build_rejects_bad_arguments_before_importing_keras():
    from benchmarks import keras_models

    with pytest.raises(ValueError, match="name"):
        keras_models.build("linen_resnet18")
    with pytest.raises(ValueError, match="hw"):
        keras_models.build("keras_inceptionv3", hw=64)


@pytest.mark.slow
@needs_keras
@pytest.mark.parametrize("name", KERAS_MODELS + bench_thirdparty.GENERALIZATION_MODELS)
def test_keras_model_runs_and_optimize_matches(name):
    m = check_model(name)
    assert m.layout == "NHWC" and len(m.params) == 2  # (trainable, non-trainable) values


@pytest.mark.slow
@needs_keras
def test_keras_bf16_policy_applies_to_one_build_only():
    from benchmarks import keras_models

    keras = keras_models.import_keras()
    before = keras.config.dtype_policy().name
    m = build("keras_vgg16", jnp.bfloat16)
    assert keras.config.dtype_policy().name == before == "float32"
    assert {leaf.dtype for leaf in jax.tree.leaves(m.params)} == {jnp.dtype(jnp.bfloat16)}
    assert m.x.dtype == jnp.bfloat16 and jax.jit(m.apply)(m.params, m.x).dtype == jnp.bfloat16
    m32 = build("keras_vgg16", jnp.float32)
    assert {leaf.dtype for leaf in jax.tree.leaves(m32.params)} == {jnp.dtype(jnp.float32)}


@pytest.mark.slow
@needs_keras
@pytest.mark.xfail(reason="BatchNorm folded into bf16 weights: the rounding of w * scale to bf16, which XLA's "
                          "unfolded program does not make, leaves the optimized output of this small random "
                          "MobileNetV2 ~2x further from float32 than XLA's (with the folded weights kept in float32 "
                          "it is as close as XLA's; issue 32)", strict=False)
def test_keras_bf16_optimize_is_as_accurate_as_xla():
    """Two bf16 programs that round differently drift apart in a deep model (MobileNetV2's output
    moves by ~0.1 relative), so the optimized one is judged as the benchmark judges it: against
    the same model in float32 (relative RMS error over bench_thirdparty.ACCURACY_IMAGES images),
    its error at most bench_thirdparty.ERROR_GROWTH x XLA's own."""
    name = "keras_mobilenetv2"
    m = build(name, jnp.bfloat16)
    optimized = jax.jit(jaxcnn.optimize(m.apply, policy="all"))
    errors = bench_thirdparty.float32_errors(name, m.x.shape[0], m.x.shape[1], CLASSES, m, optimized,
                                             jax.jit(m.apply))
    assert errors["accuracy_images"] >= bench_thirdparty.ACCURACY_IMAGES
    assert errors["err_f32_optimized"] <= max(REL_TOL[jnp.bfloat16],
                                              bench_thirdparty.ERROR_GROWTH * errors["err_f32_xla"]), errors


def test_accuracy_inputs_fill_the_images_with_fresh_batches():
    x = jnp.ones((3, 4, 4, 2), jnp.bfloat16)
    inputs = bench_thirdparty.accuracy_inputs(x, images=8)
    assert len(inputs) == 3 and inputs[0] is x  # 9 images >= 8
    assert all(i.shape == x.shape and i.dtype == x.dtype for i in inputs)
    assert not np.array_equal(np.asarray(inputs[1], np.float32), np.asarray(inputs[2], np.float32))
    assert bench_thirdparty.accuracy_inputs(jnp.ones((64, 4, 4, 2)), images=8)[1:] == []


def test_rel_rms_is_the_error_norm_over_the_reference_norm():
    assert bench_thirdparty.rel_rms(1.0, 4.0) == 0.5
    assert bench_thirdparty.rel_rms(1.0, 0.0) == float("inf")


# -- scripts/bench_thirdparty.py ----------------------------------------------------------------

def _row(model, n, dtype, ratio, device_time=True):
    return dict(model=model, n=n, dtype=dtype, ratio=ratio, device_time=device_time)


def test_geomean_over_the_keras_models_against_the_goal():
    rows = [_row(m, 64, "bf16", r) for m, r in zip(KERAS_MODELS, (1.0, 2.0, 4.0, 1.0))]
    rows += [_row("linen_resnet50", 64, "bf16", 100.0)]  # not a Keras model: not in the geomean
    rows += [_row(m, 1, "bf16", 1.2) for m in KERAS_MODELS]
    rows += [_row(m, 1, "fp32", 2.0) for m in KERAS_MODELS[:3]]
    got = {(g["n"], g["dtype"]): g for g in bench_thirdparty.geomeans(rows)}
    assert got[(64, "bf16")]["geomean"] == pytest.approx(2 ** 0.75)  # (1 * 2 * 4 * 1) ** (1 / 4)
    assert got[(64, "bf16")]["goal"] == 1.5 and got[(64, "bf16")]["met"] is True
    assert got[(1, "bf16")]["goal"] == 1.3 and got[(1, "bf16")]["met"] is False
    assert got[(1, "fp32")]["goal"] == 1.2 and got[(1, "fp32")]["models"] == 3
    assert got[(1, "fp32")]["met"] is None  # 3 of 4 models: no verdict
    wall = [_row(m, 64, "bf16", 2.0, device_time=False) for m in KERAS_MODELS]
    assert bench_thirdparty.geomeans(wall)[0]["met"] is None  # host wall time says nothing of the goal


def test_generalization_models_get_their_own_geomean_without_a_goal():
    general = bench_thirdparty.GENERALIZATION_MODELS
    assert not set(general) & set(KERAS_MODELS) and set(general) <= set(tm.MODELS)
    rows = [_row(m, 64, "bf16", 2.0) for m in KERAS_MODELS] + [_row(m, 64, "bf16", 0.5) for m in general[:2]]
    got = {g["set"]: g for g in bench_thirdparty.geomeans(rows)}
    assert got["goal"]["geomean"] == pytest.approx(2.0) and got["goal"]["met"] is True
    assert got["generalization"]["geomean"] == pytest.approx(0.5)
    assert got["generalization"]["goal"] is None and got["generalization"]["met"] is None
    assert (got["generalization"]["models"], got["generalization"]["of"]) == (2, len(general))


@pytest.mark.slow
@needs_keras
def test_bench_smoke_run_writes_its_report(tmp_path):
    models = ["keras_mobilenetv2", "linen_resnet18"]
    subprocess.run([sys.executable, "scripts/bench_thirdparty.py", "--smoke", "--out", str(tmp_path), "--models",
                    ",".join(models), "--dtypes", "fp32", "--weights", "args,closed"], cwd=REPO_ROOT, check=True,
                   timeout=1200, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    (report,) = tmp_path.glob("*-thirdparty.json")
    markdown = report.with_suffix(".md").read_text()
    assert markdown.startswith("# jaxcnn.optimize on third-party CNNs")
    assert "keras_mobilenetv2 (weights closed over)" in markdown
    data = json.loads(report.read_text())
    assert {"environment", "rows", "geomeans", "goals"} <= set(data)
    assert [(r["model"], r["weights"]) for r in data["rows"]] == [(m, w) for w in ("args", "closed") for m in models]
    closed = [r for r in data["rows"] if r["weights"] == "closed"]
    # BatchNorm of closed-over weights folds when the program is traced
    assert all("fold once, when the program is traced" in r["explain"] for r in closed if "weight prologue" in r["explain"])
    for row in data["rows"]:
        assert row["ok"] and "error" not in row and "optimize_error" not in row, row.get("traceback")
        assert {"xla", "optimized"} == set(row["timings"]) == set(row["wall_ms"]) == set(row["first_call_s"])
        assert row["ratio"] > 0 and row["max_rel_diff"] <= bench_thirdparty.TOLERANCE["fp32"]
        assert set(row["rewrites"]) == {"ops", "patterns"} and row["explain"]
        assert row["cost"]["flops"] > 0 and row["cost"]["bytes_accessed"] > 0 and row["io_bytes"] > 0
        assert row["input_shape"] == [1, 64, 64, 3] and row["n"] == 1 and row["dtype"] == "fp32"
        assert row["floor"] is None  # the CPU has no gpu_specs entry
        # the CPU measures nothing: the rules decide
        assert row["first_call_measuring"] == dict(measurements=0, sites=0, runs=0, compile_s=0, timing_s=0)


def test_first_call_measuring_sums_the_decision_owners_measurements():
    from jaxcnn.tuning.decision import MeasurementCost

    costs = [MeasurementCost(3, 10, 2.0, 0.5), MeasurementCost(1, 2, 1.5, 0.25)]
    assert bench_thirdparty.measuring_summary(costs) == dict(measurements=2, sites=4, runs=12, compile_s=3.5,
                                                             timing_s=0.75)
