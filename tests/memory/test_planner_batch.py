"""Batch planning: max_batch's answer is checked by compiling independently at the answer and
the next batch (footprint from XLA's memory_analysis on CPU)."""

import json

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxcnn.memory import footprint_bytes, max_batch, max_batch_curve, parse_bytes
from jaxcnn.memory.batch import AffineFit, compile_stats, model_program
from jaxcnn.memory.footprint import memory_stats


def _check_boundary(result, program):
    """The answer fits and the next batch does not, by compiles of our own."""
    assert result.verified
    at = compile_stats(program, result.batch)["footprint_bytes"]
    after = compile_stats(program, result.batch + 1)["footprint_bytes"]
    assert at == result.footprint and after == result.next_footprint
    assert at <= result.budget_bytes < after


def test_parse_bytes_units():
    assert parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes("1000") == 1000
    assert parse_bytes(4096.7) == 4096
    for bad in ("8 parsecs", "GiB", "-1GiB", ""):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    with pytest.raises(ValueError):
        parse_bytes(0)
    with pytest.raises(TypeError):
        parse_bytes([8])


@given(st.integers(1, 2**50), st.sampled_from(["", "B", "KiB", "MiB", "GiB"]))
def test_parse_bytes_round_trips_whole_units(n, unit):
    scale = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    assert parse_bytes(f"{n}{unit}") == n * scale


def test_footprint_is_arguments_plus_unaliased_outputs_plus_temp():
    f = lambda w, x: (w * 2, jnp.tanh(x @ x.T).sum())  # noqa: E731
    w, x = jnp.ones((64, 64)), jnp.ones((32, 16))
    for donate in ((), (0,)):
        stats = memory_stats(jax.jit(f, donate_argnums=donate).lower(w, x).compile())
        expected = (stats["argument_size_in_bytes"] + stats["output_size_in_bytes"]
                    - stats["alias_size_in_bytes"] + stats["temp_size_in_bytes"])
        assert footprint_bytes(stats) == expected
    assert stats["alias_size_in_bytes"] == 64 * 64 * 4
    with pytest.raises(ValueError, match="memory analysis"):
        footprint_bytes({})


def test_affine_fit_is_exact_on_a_line():
    fit = AffineFit.of([1, 2, 4], [110, 120, 140])
    assert fit.intercept == pytest.approx(100) and fit.slope == pytest.approx(10)
    assert fit.max_relative_residual == pytest.approx(0, abs=1e-12)
    assert fit.largest_batch_under(1000, 1 << 16) == 90
    assert fit.largest_batch_under(50, 1 << 16) == 0
    with pytest.raises(ValueError):
        AffineFit.of([2, 2], [1, 1])


def test_lenet_inference_max_batch_is_verified():
    program = model_program("lenet5")
    result = max_batch("lenet5", "8MiB")
    _check_boundary(result, program)
    assert result.fit.max_relative_residual < 0.01
    assert abs(result.prediction_error) <= 2
    assert result.compiles == len(result.stats) <= 6
    assert "largest batch" in result.explain()


@pytest.mark.slow
def test_lenet_training_max_batch_donates_and_is_verified():
    program = model_program("lenet5", train=True)
    result = max_batch("lenet5", "3MiB", train=True, probe_batches=(2, 8))
    _check_boundary(result, program)
    stats = result.stats[result.batch]
    assert stats["alias_size_in_bytes"] > 0  # params and momentum alias the new ones
    undonated = max_batch("lenet5", "3MiB", train=True, probe_batches=(2, 8), donate=False)
    assert undonated.batch < result.batch  # the aliased bytes buy a larger batch


def test_squeezenet_inference_max_batch_is_verified():
    program = model_program("squeezenet1_1")
    result = max_batch("squeezenet1_1", "96MiB")
    _check_boundary(result, program)
    assert result.batch >= 8


def test_nonlinear_footprint_is_corrected_by_search():
    # The output is batch x batch: the affine fit over 1, 2, 4 underestimates large batches.
    def program(batch):
        return (lambda x: x @ x.T), (jax.ShapeDtypeStruct((batch, 256), jnp.float32),)

    result = max_batch(program, "4MiB")
    _check_boundary(result, program)
    assert result.predicted_batch > result.batch  # the line was too optimistic
    assert result.fit.max_relative_residual > 0


def test_nothing_fits_and_compile_cap():
    result = max_batch("lenet5", 1000)
    assert result.batch == 0 and result.footprint is None
    assert result.next_footprint == result.stats[1]["footprint_bytes"] > 1000

    capped = max_batch(lambda b: ((lambda x: x @ x.T), (jax.ShapeDtypeStruct((b, 256), jnp.float32),)),
                       "4MiB", max_compiles=5)
    assert not capped.verified and capped.compiles == 5
    assert capped.footprint <= capped.budget_bytes


def test_max_batch_curve_grows_with_the_batch():
    points = max_batch_curve("lenet5", [4, 1, 2])
    assert [p.batch for p in points] == [1, 2, 4]
    assert points[0].footprint < points[1].footprint < points[2].footprint
    assert points[1].footprint == compile_stats(model_program("lenet5"), 2)["footprint_bytes"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="probe_batches"):
        max_batch("lenet5", "1GiB", probe_batches=(2,))
    with pytest.raises(ValueError, match="limit"):
        max_batch("lenet5", "1GiB", limit=2)
    with pytest.raises(TypeError, match="train"):
        max_batch(lambda b: None, "1GiB", train=True)
    with pytest.raises(TypeError, match="program"):
        max_batch(42, "1GiB")
    with pytest.raises(ValueError, match="unknown model"):
        max_batch("lenet6", "1GiB")
    with pytest.raises(ValueError, match="batches"):
        max_batch_curve("lenet5", [0, 1])


def test_cli_maxbatch_prints_and_records(tmp_path, capsys):
    from jaxcnn.cli import main
    from jaxcnn.store import Store

    db, out = tmp_path / "plans.sqlite", tmp_path / "lenet.json"
    assert main(["maxbatch", "lenet5", "--budget", "8MiB", "--dtype", "fp32", "--curve",
                 "--json", str(out), "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert "largest batch" in text and "batch      1:" in text
    expected = max_batch("lenet5", "8MiB")
    with Store(db) as store:
        runs = store.runs()
        assert list(runs["kind"]) == ["plan"] and list(runs["note"]) == ["max_batch"]
        rows = store.measurements(int(runs["id"][0]))
    verified = rows[(rows.metric == "max_batch") & (rows.variant == "verified")]
    assert list(verified["median"]) == [expected.batch]
    peaks = rows[rows.metric == "peak_bytes"].set_index("variant")["median"]
    assert peaks[f"batch={expected.batch}"] == expected.footprint
    saved = json.loads(out.read_text())
    assert saved["batch"] == expected.batch and saved["model"] == "lenet5"

    assert main(["maxbatch", "lenet5", "--budget", "8 parsecs"]) == 2
    assert main(["maxbatch", "lenet5", "--budget", "8MiB", "--train", "--optimizer", "lion"]) == 2
