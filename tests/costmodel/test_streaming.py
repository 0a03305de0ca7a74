"""The stream families of the cost model (jaxcnn.costmodel.streaming): depthwise convs priced
from the bytes they move and the FMAs they do, fitted per family, stored with the GEMM factors
and used by calibrate, validation and the store's per-layer predictions."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from jaxcnn.costmodel.calibration import Sample, calibrate
from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.costmodel.factors import Factors, load_factors, save_factors
from jaxcnn.costmodel.model import predict_layer_info, predict_ms
from jaxcnn.costmodel.streaming import StreamFactors, fit_stream, is_depthwise, predict_stream
from jaxcnn.costmodel.validation import make_measurement, measurements_from_store, prediction_rows, validate
from jaxcnn.profile.gpu_specs import spec_by_name
from jaxcnn.store import Store

H200 = spec_by_name("H200")


def dw(n, hw, c, stride=1, dtype="bf16"):
    return ConvLayer(n, hw, hw, c, c, 3, 3, stride=stride, padding="SAME", groups=c, dtype=dtype,
                     name=f"dw{n}x{hw}x{c}s{stride}")


LAYERS = [dw(n, hw, c, s) for n in (1, 64) for hw, c in ((112, 32), (56, 144), (28, 192), (14, 576), (7, 960))
          for s in (1, 2)]


def test_prediction_adds_launch_bytes_and_fma_time():
    layer = dw(64, 56, 144)
    p = predict_stream(layer, "depthwise", H200, StreamFactors(launch_us=2.0, dram=0.5, compute=0.25))
    memory_ms = layer.unique_bytes / (0.5 * H200.memory.per_s) * 1e3
    compute_ms = layer.flops / (0.25 * H200.fp32_fma_peak.per_s) * 1e3
    assert p.time_ms == pytest.approx(0.002 + memory_ms + compute_ms)
    assert p.bound == ("dram" if memory_ms >= compute_ms else "compute")
    assert layer.flops == 2 * 64 * 56 * 56 * 144 * 9 and is_depthwise(layer)
    with pytest.raises(ValueError, match="family must be one of"):
        predict_stream(layer, "stem", H200, StreamFactors())


def test_fit_recovers_the_factors_it_was_made_with():
    truth = StreamFactors(launch_us=2.5, dram=0.8, compute=0.3)
    times = [predict_stream(layer, "depthwise", H200, truth).time_ms for layer in LAYERS]
    got = fit_stream(LAYERS, times, H200)
    predicted = [predict_stream(layer, "depthwise", H200, got).time_ms for layer in LAYERS]
    np.testing.assert_allclose(predicted, times, rtol=0.05)  # the grid's resolution
    assert got.launch_us == pytest.approx(2.5, rel=0.1) and got.dram == pytest.approx(0.8, rel=0.05)
    with pytest.raises(ValueError, match="at least one"):
        fit_stream([], [], H200)


def test_calibrate_fits_stream_families_apart_and_keeps_them_in_the_factors():
    truth = StreamFactors(launch_us=3.0, dram=0.6, compute=0.2)
    samples = [Sample(layer, predict_stream(layer, "jaxcnn_depthwise", H200, truth).time_ms, "jaxcnn_depthwise")
               for layer in LAYERS]
    fitted = calibrate(H200, samples, initial=Factors(dram=0.9))
    assert fitted.n == len(samples) and fitted.median_abs_rel_error < 0.05
    assert fitted.factors.dram == 0.9  # the GEMM factors are left as they were
    assert set(fitted.factors.streaming) == {"jaxcnn_depthwise"}
    assert predict_ms(LAYERS[3], H200, impl="jaxcnn_depthwise", factors=fitted.factors) == pytest.approx(
        samples[3].time_ms, rel=0.05)


def test_stream_factors_round_trip_through_the_store(tmp_path):
    path = tmp_path / "factors.json"
    factors = Factors(dram=0.9, streaming={"depthwise": StreamFactors(2.0, 0.7, 0.3).to_dict()})
    save_factors("H200", factors, {"n": 1}, path=path)
    assert load_factors("H200", path=path).streaming == {"depthwise": dict(launch_us=2.0, dram=0.7, compute=0.3)}
    assert "streaming" not in Factors().to_dict()


def test_validation_prices_depthwise_measurements_as_streams():
    layer = dw(64, 56, 144)
    factors = Factors(streaming={"depthwise": StreamFactors(2.0, 0.8, 0.3).to_dict()})
    m = make_measurement(layer, "bf16", "xla_default", 0.05, [("conv2d_c1_k1_nhwc", 48.0), ("wrapped_transpose", 2.0)],
                         source="store")
    assert m.impl == "depthwise" and m.in_scope and m.measured_ms == pytest.approx(0.048)
    (row,) = validate(prediction_rows([m], "H200", factors))["rows"]
    want = predict_stream(layer, "depthwise", H200, StreamFactors(2.0, 0.8, 0.3))
    assert row["tiling"] == "stream:depthwise" and row["predicted_ms"] == pytest.approx(want.time_ms)
    assert row["abs_rel_error"] == pytest.approx(abs(want.time_ms - 0.048) / 0.048)
    assert row["predicted_bytes"]["dram"] == layer.unique_bytes


def test_store_predictions_of_depthwise_layers_follow_the_backend():
    info = SimpleNamespace(op="conv2d", name="dw", input_shapes=[(8, 28, 28, 64)], weight_shape=(3, 3, 1, 64),
                           stride=1, padding="SAME", dilation=1, groups=64, dtype="bfloat16")
    factors = Factors(streaming={"depthwise": StreamFactors(2.0, 0.8, 0.3).to_dict(),
                                 "jaxcnn_depthwise": StreamFactors(7.0, 0.5, 0.3).to_dict()})
    xla = predict_layer_info(info, "H200", "xla", factors=factors)
    ours = predict_layer_info(info, "H200", "jaxcnn", factors=factors)
    assert (xla["tiling"], xla["extra"]["impl"]) == ("stream:depthwise", "depthwise")
    assert ours["extra"]["impl"] == "jaxcnn_depthwise" and ours["time_ms"] > xla["time_ms"]
    dense = predict_layer_info(SimpleNamespace(**{**vars(info), "weight_shape": (3, 3, 64, 64), "groups": 1}),
                               "H200", "xla", factors=factors)
    assert dense["extra"]["impl"] == "xla"  # the implicit-GEMM model


def test_stored_factors_predict_the_shipped_depthwise_layers(tmp_path):
    """The stored H200 factors against the shipped profiles' recorded times of cuDNN's depthwise
    kernels (the report's 5.3% median includes the layer bench's rows as well)."""
    shipped = Path(__file__).resolve().parents[2] / "dashboard" / "shipped"
    with Store(tmp_path / "shipped.sqlite") as store:
        for name in ("h200-2026-11-29-zoo.json", "h200-2026-11-29-thirdparty.json"):
            store.import_json(shipped / name)
    rows = validate(prediction_rows([m for m in measurements_from_store(tmp_path / "shipped.sqlite")
                                     if m.impl == "depthwise"], "H200"))["rows"]
    errors = [r["abs_rel_error"] for r in rows]
    assert len(errors) >= 50
    assert np.median(errors) <= 0.08 and max(errors) <= 0.25
