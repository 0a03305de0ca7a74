"""jaxcnn.costmodel: DeLTA-style traffic at L1/L2/DRAM and time of implicit-GEMM convolution.

Submodules are imported directly: an editable install made before perfmodel/__init__.py existed
maps jaxcnn.costmodel as a namespace package.
"""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest

from jaxcnn.costmodel.calibration import Sample, calibrate
from jaxcnn.costmodel.factors import Factors, load_factors, save_factors
from jaxcnn.costmodel.kernel_families import impl_of_kernel
from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.costmodel.model import predict, predict_layer_info, predict_table
from jaxcnn.costmodel.tiling import (
    JAXCNN_DIRECT_64x64x16,
    PRESETS,
    auto_tiling,
    parse_kernel_tiling,
)
from jaxcnn.costmodel.traffic import cta_window_pixels, traffic, unique_extent
from jaxcnn.costmodel.validation import (
    attach_counters,
    measurements_from_bench,
    read_ncu_csv,
    split_kernels,
    validate,
)
from jaxcnn.profile.gpu_specs import GPU_SPECS, MODEL_ONLY_SPECS, lookup_gpu_spec, spec_by_name

H200 = spec_by_name("H200")
IDEAL = Factors()
TC_128 = PRESETS["HOPPER_TC_128x128x64"]
SM90_NAME = (
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_"
    "warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn"
)
SM80_FFMA_NAME = (
    "sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize256x64x8_stage3_"
    "warpsize2x2x1_g1_ffma_aligna4_alignc4_execute_kernel__5x_cudnn"
)
DIRECT_KERNEL = "void jaxcnn::conv2d_direct::conv2d_direct_kernel<float>(float const*, ...)"


def vgg_c3_1(dtype="bf16", n=64) -> ConvLayer:
    return ConvLayer(n, 56, 56, 128, 256, 3, 3, padding=1, dtype=dtype, name="vgg_c3_1")


# ---------------------------------------------------------------- layer


def test_layer_gemm_view_and_padding_forms():
    layer = ConvLayer(2, 9, 7, 8, 16, 3, 3, stride=2, padding="SAME", groups=4, dtype="float32")
    assert (layer.p, layer.q) == (5, 4)
    assert (layer.gemm_m, layer.gemm_n, layer.gemm_k) == (2 * 5 * 4, 4, 3 * 3 * 2)
    assert layer.flops == 2.0 * 40 * 4 * 18 * 4
    assert layer.dtype == "fp32" and layer.elem_bytes == 4
    dilated = ConvLayer(1, 64, 64, 8, 8, 3, 3, padding=2, dilation=2)
    assert (dilated.p, dilated.q) == (64, 64)
    assert ConvLayer(1, 8, 8, 4, 4, 3, 3, padding=((0, 1), (1, 0))).padding == ((0, 1), (1, 0))
    with pytest.raises(ValueError):
        ConvLayer(1, 8, 8, 6, 4, 3, 3, groups=4)


def test_unique_extent_and_window():
    assert unique_extent(64, 1, 3, 1) == 66  # overlapping windows merge
    assert unique_extent(10, 2, 1, 1) == 10  # strided 1x1: disjoint single taps
    assert unique_extent(10, 1, 3, 2) == 14  # dilation spreads the window
    wide = ConvLayer(1, 128, 128, 16, 16, 3, 3, padding=1)
    assert cta_window_pixels(wide, 64) == 3 * 66  # one output row segment: 3 input rows
    one_by_one = ConvLayer(4, 14, 14, 16, 16, 1, 1)
    assert cta_window_pixels(one_by_one, 64) == pytest.approx(64)  # 1x1: no reuse to find


# ---------------------------------------------------------------- traffic, hand-computed


def test_one_cta_1x1_l2_is_a_plus_b_plus_c_and_dram_is_unique_bytes():
    layer = ConvLayer(1, 8, 8, 64, 64, 1, 1, dtype="bf16")  # M = 64, N = 64, K = 64
    moved = traffic(layer, TC_128, H200)
    a = b = c = 64 * 64 * 2
    assert moved.grid.ctas == 1 and moved.grid.k_iters == 1
    assert moved.l1_bytes == a + b + c
    assert moved.l2_bytes == a + b + c  # TMA staging: every request reaches L2
    assert moved.dram_bytes == layer.unique_bytes == a + b + c
    # Padded tile work: 128 x 128 x 64 MACs of which 64 x 64 x 64 are useful.
    assert moved.work_flops == 2 * 128 * 128 * 64


def test_direct_kernel_stores_repeat_sectors_and_l1_serves_the_window():
    layer = ConvLayer(1, 8, 8, 64, 64, 1, 1, dtype="bf16")
    moved = traffic(layer, JAXCNN_DIRECT_64x64x16, H200)
    a = b = c = 64 * 64 * 2
    # Each thread stores its 4 columns one at a time: 4 x the sectors of C reach L2.
    assert moved.by_operand["l2"] == {"a": a, "b": b, "c": 4 * c}
    assert moved.dram_bytes == a + b + c

    wide = ConvLayer(1, 128, 128, 16, 16, 3, 3, padding=1, dtype="bf16")
    moved = traffic(wide, JAXCNN_DIRECT_64x64x16, H200)
    requested = 64 * (3 * 3 * 16) * 2  # one CTA's im2col rows
    window = 3 * 66 * 16 * 2  # 3 input rows x 66 columns x 16 channels
    ratio = moved.by_operand["l2"]["a"] / moved.by_operand["l1"]["a"]
    assert ratio == pytest.approx(window / requested)


def test_dram_refetches_the_streamed_operand_once_x_exceeds_l2():
    # 1x1 conv, x = 102.8 MB > 50 MB L2, 4 N tiles walked one after another (m fastest).
    layer = ConvLayer(64, 112, 112, 64, 256, 1, 1, dtype="bf16")
    moved = traffic(layer, JAXCNN_DIRECT_64x64x16, H200)
    assert moved.grid.tiles_n == 4 and moved.grid.tiles_m > moved.grid.wave_ctas
    assert moved.by_operand["dram"]["a"] == 4 * layer.x_bytes
    assert moved.dram_bytes == 4 * layer.x_bytes + layer.w_bytes + layer.y_bytes
    # The same launch on a GPU whose L2 holds x: fetched once.
    big_l2 = dataclasses.replace(H200, l2_bytes=256 * 2**20)
    assert traffic(layer, JAXCNN_DIRECT_64x64x16, big_l2).dram_bytes == layer.unique_bytes
    # cuDNN-like n-fastest raster reads A once and keeps the small weights in L2.
    assert traffic(layer, TC_128, H200).dram_bytes == layer.unique_bytes


def test_depthwise_sector_waste():
    layer = ConvLayer(8, 32, 32, 64, 64, 3, 3, padding=1, groups=64, dtype="bf16")
    moved = traffic(layer, JAXCNN_DIRECT_64x64x16, H200)
    # One 2-byte channel per pixel still moves a 32-byte sector.
    assert moved.by_operand["l1"]["a"] == pytest.approx(16 * layer.gemm_m * 9 * 64 * 2)
    assert moved.grid.ctas == math.ceil(layer.gemm_m / 64) * 64


# ---------------------------------------------------------------- tilings


def test_parse_sm90_kernel_name():
    tiling = parse_kernel_tiling(SM90_NAME)
    assert (tiling.mt, tiling.nt, tiling.kt) == (128, 128, 64)
    assert tiling.threads == 256 and tiling.stages is None and tiling.wgmma
    assert tiling.k_per_tap and tiling.staging == "smem" and tiling.unit == "tensor"
    assert tiling.occupancy(H200, 2) == 1


def test_parse_sm80_and_other_kernel_names():
    ffma = parse_kernel_tiling(SM80_FFMA_NAME)
    assert (ffma.mt, ffma.nt, ffma.kt, ffma.stages, ffma.threads) == (256, 64, 8, 3, 128)
    assert ffma.unit == "fma" and ffma.mma_tile == (128, 32) and not ffma.wgmma
    grouped = parse_kernel_tiling(
        "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_"
        "stage4_warpsize1x4x1_g16_tensor16x8x16_t1r3s3_execute_kernel__5x_cudnn"
    )
    assert grouped.groups_per_cta == 16 and grouped.threads == 128
    direct_loads = parse_kernel_tiling(
        "sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_tf32f32_tf32f32_f32_nhwckrsc_nhwc_"
        "tilesize128x32x16_stage1_warpsize4x1x1_g1_tensor16x8x8_aligna4_alignc8"
    )
    assert direct_loads.staging == "l1"
    nvjet = parse_kernel_tiling("nvjet_sm90_tst_16x256_64x6_1x2_h_ssched_bz_relubias_TNN")
    assert (nvjet.mt, nvjet.nt, nvjet.kt, nvjet.stages) == (256, 16, 64, 6)
    assert parse_kernel_tiling("wrapped_transpose") is None


def test_auto_tiling_follows_cudnn_picks():
    assert auto_tiling(vgg_c3_1(), "xla", "bf16").name == "HOPPER_TC_128x128x64"
    assert auto_tiling(vgg_c3_1("fp32"), "xla", "tf32").name == "HOPPER_TC_128x128x32"
    assert auto_tiling(vgg_c3_1(n=1), "xla", "bf16").name == "HOPPER_TC_64x128x64"
    alex = ConvLayer(64, 27, 27, 96, 256, 5, 5, padding=2)
    assert auto_tiling(alex, "xla", "bf16").kt == 32  # 64 does not divide 96 channels
    assert auto_tiling(vgg_c3_1("fp32"), "xla", "fp32").name == "SM80_FFMA_256x64x8"
    assert auto_tiling(vgg_c3_1(), "jaxcnn_direct", "fp32") is JAXCNN_DIRECT_64x64x16


def test_direct_kernel_occupancy_from_registers():
    # 95 registers x 256 threads: 2 CTAs fit in 64K registers.
    assert JAXCNN_DIRECT_64x64x16.occupancy(H200, 2) == 2


# ---------------------------------------------------------------- time


@pytest.mark.parametrize("impl", ["xla", "jaxcnn_direct"])
def test_bigger_layer_takes_longer(impl):
    def time_ms(layer):
        return predict(layer, "H200", impl=impl, factors=IDEAL).time_ms

    times = [time_ms(vgg_c3_1(n=n)) for n in (1, 8, 64)]
    assert times == sorted(times) and times[0] < times[-1]
    assert time_ms(ConvLayer(64, 56, 56, 256, 256, 3, 3, padding=1)) > time_ms(vgg_c3_1())


def test_time_is_the_largest_bound_times_quantization_plus_latency():
    factors = Factors(wave_latency_us={"xla:tensor": 2.0}, launch_us={"xla:tensor": 5.0})
    p = predict(vgg_c3_1(), "H200", TC_128, "xla", factors=factors)
    bounds = p.times.bound_times()
    assert p.bound == max(bounds, key=bounds.get)
    grid = p.traffic.grid
    q = grid.quantization
    assert p.times.quantization == pytest.approx(q)
    # Per-SM ceilings (math, L1) scale with the quantization; L2 / DRAM only as far as the
    # busy SMs' L2 ports limit them.
    ports = 64 * H200.sm_count * H200.boost_clock_hz
    scaled = [
        bounds["compute"] * q,
        bounds["l1"] * q,
        max(bounds["l2"], p.traffic.l2_bytes * q / ports) if q > 1 else bounds["l2"],
        max(bounds["dram"], p.traffic.dram_bytes * q / ports) if q > 1 else bounds["dram"],
    ]
    expected = max(scaled) + 1e-6 * (2.0 * grid.waves + 5.0)
    assert p.times.time_s == pytest.approx(expected)
    assert p.times.compute_s == pytest.approx(p.traffic.work_flops / 708e12)


def test_highest_precision_runs_on_cuda_cores_and_v100_has_no_bf16():
    p = predict(vgg_c3_1("fp32"), precision="highest", factors=IDEAL)
    assert p.tiling.unit == "fma" and p.keys.ceiling == "fp32"
    assert predict(vgg_c3_1("fp32"), factors=IDEAL).keys.ceiling == "tf32"
    direct = predict(vgg_c3_1(), impl="jaxcnn_direct", factors=IDEAL)
    assert direct.keys.efficiency == "jaxcnn_direct:bf16>fp32"  # bf16 operands, fp32 FMAs
    with pytest.raises(ValueError):
        predict(vgg_c3_1("bf16"), "V100 SXM2", factors=IDEAL)
    assert predict(vgg_c3_1("fp16"), "V100 SXM2", factors=IDEAL).time_ms > 0


def test_predict_table_rows_fit_the_store():
    rows = predict_table([vgg_c3_1(), vgg_c3_1(n=1)], impl="jaxcnn_direct", factors=IDEAL)
    allowed = {"model", "layer_id", "tiling", "l1_bytes", "l2_bytes", "dram_bytes", "time_ms"}
    allowed.add("extra")
    for row in rows:
        assert set(row) <= allowed and row["model"] == "delta"
        assert row["tiling"] == "JAXCNN_DIRECT_64x64x16" and row["extra"]["bound"]
        assert row["l1_bytes"] >= row["l2_bytes"] > 0 and row["time_ms"] > 0
        json.dumps(row)


def test_predictions_go_into_the_store(tmp_path):
    store_module = pytest.importorskip("jaxcnn.store")
    with store_module.Store(tmp_path / "s.sqlite") as store:
        run = store.add_run("bench")
        store.add_predictions(run, predict_table([vgg_c3_1()], factors=IDEAL))
        frame = store.predictions(run)
    assert frame["model"].tolist() == ["delta"] and frame["extra"][0]["bound"]


def test_measurements_from_a_profile_store(tmp_path):
    store_module = pytest.importorskip("jaxcnn.store")
    from jaxcnn.costmodel.validation import measurements_from_store

    path = tmp_path / "zoo.sqlite"
    with store_module.Store(path) as store:
        run = store.add_run("profile", model="vgg", batch=64, dtype="bfloat16")
        conv, pool = store.add_layers(run, [
            dict(idx=0, name="c3_1", op="conv2d", input_shapes=[[64, 56, 56, 128]],
                 weight_shape=[3, 3, 128, 256], output_shape=[64, 56, 56, 256],
                 params=dict(stride=[1, 1], padding=[[1, 1], [1, 1]], groups=1, dtype="bfloat16")),
            dict(idx=1, name="pool", op="max_pool", input_shapes=[[64, 56, 56, 256]]),
        ])
        kernels = [dict(name=SM90_NAME, us_per_call=159.8), dict(name="Memset 3", us_per_call=0.8)]
        store.add_measurements(run, [
            dict(layer_id=conv, backend="xla", metric="device_time_ms", median=0.161,
                 extra=dict(kernels=kernels)),
            dict(layer_id=conv, backend="jaxcnn", metric="device_time_ms", median=6.36),
            dict(layer_id=pool, backend="xla", metric="device_time_ms", median=0.05),
        ])
    xla_m, direct_m = measurements_from_store(path)
    assert xla_m.layer == dataclasses.replace(vgg_c3_1(), name="run1:c3_1")
    assert xla_m.kernel_ms == pytest.approx(0.1598) and xla_m.tiling.mt == 128
    assert direct_m.impl == "jaxcnn_direct" and direct_m.measured_ms == 6.36


def test_predict_layer_info():
    info = SimpleNamespace(
        op="conv2d", name="c", input_shapes=((8, 56, 56, 64),), weight_shape=(3, 3, 64, 64),
        stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, dtype="bfloat16",
    )
    row = predict_layer_info(info, "NVIDIA H200", impl="jaxcnn", factors=IDEAL)
    assert row["model"] == "delta" and row["extra"]["impl"] == "jaxcnn_direct"
    assert predict_layer_info(SimpleNamespace(op="max_pool"), "NVIDIA H200") is None
    assert predict_layer_info(info, "NVIDIA GH999") is None


# ---------------------------------------------------------------- GPU specs


def test_every_model_spec_has_a_memory_hierarchy_with_sources():
    for spec in GPU_SPECS + MODEL_ONLY_SPECS:
        assert spec.l2_bytes > 0 and spec.smem_per_sm_bytes <= spec.l1_smem_per_sm_bytes
        for ceiling in spec.ceilings().values():
            assert ceiling.source in ("measured", "datasheet", "derived") and ceiling.per_s > 0
            assert ceiling.source != "derived" or "*" in ceiling.note  # formula given
    assert spec_by_name("A100 SXM 80GB").fp32_fma_peak.per_s == pytest.approx(19.5e12, rel=0.01)
    assert spec_by_name("NVIDIA A100-SXM4-80GB").name == "A100 SXM 80GB"
    assert spec_by_name("V100 SXM2").fp32_fma_peak.per_s == pytest.approx(15.7e12, rel=0.01)
    assert lookup_gpu_spec("NVIDIA A100-SXM4-80GB") is None  # bench floors stay H100/H200 only
    with pytest.raises(KeyError):
        spec_by_name("TPU v5e")


# ---------------------------------------------------------------- validation and calibration


def test_validate_math_and_scope():
    def row(label, impl, predicted_ms, measured_ms, **more):
        return dict(label=label, impl=impl, predicted_ms=predicted_ms, measured_ms=measured_ms,
                    predicted_bytes=more.pop("predicted_bytes", {}), **more)

    rows = [
        row("a", "xla", 1.1, 1.0, predicted_bytes={"l2": 90.0}, ncu_bytes={"l2": 100.0}),
        row("b", "xla", 0.7, 1.0),
        row("c", "jaxcnn_direct", 2.0, 2.0),
        row("d", "xla", 9.0, 1.0, in_scope=False),
    ]
    report = validate(rows)
    errors = [r["abs_rel_error"] for r in report["rows"]]
    assert errors == pytest.approx([0.1, 0.3, 0.0, 8.0])
    summary = report["summary"]
    assert summary["n"] == 3 and summary["out_of_scope"] == 1
    assert summary["median_abs_rel_error"] == pytest.approx(0.1)
    assert summary["max_abs_rel_error"] == pytest.approx(0.3)
    assert summary["by_impl"]["xla"]["n"] == 2
    assert summary["bytes"]["l2"]["median_abs_rel_error"] == pytest.approx(0.1)


def _synthetic_layers() -> list[tuple[ConvLayer, str]]:
    """Compute-, memory- and latency-bound layers, both impls: every factor binds somewhere."""
    layers = []
    for n in (1, 4, 16, 64):
        layers += [
            (ConvLayer(n, 56, 56, 128, 256, 3, 3, padding=1), "xla"),
            (ConvLayer(n, 56, 56, 256, 64, 1, 1), "xla"),
            (ConvLayer(n, 28, 28, 512, 32, 1, 1), "xla"),
            (ConvLayer(n, 28, 28, 64, 64, 3, 3, padding=1), "jaxcnn_direct"),
            (ConvLayer(n, 56, 56, 32, 32, 3, 3, padding=1, groups=32), "jaxcnn_direct"),
        ]
    return layers


def test_partial_wave_quantization_with_latency_hiding():
    from jaxcnn.costmodel.traffic import make_grid

    spec = H200
    # our kernel: 8 warps, 2 CTAs per SM; 66 CTAs = one per SM on half the SMs
    grid = make_grid(ConvLayer(1, 8, 66 * 8, 64, 64, 1, 1), JAXCNN_DIRECT_64x64x16, spec)
    assert grid.occupancy == 2 and grid.ctas == 66
    waves = grid.ctas / (spec.sm_count * 2)
    h = 16.0
    assert grid.quantization_with(h) == pytest.approx(((8 + h) / (16 + h)) / waves)
    assert grid.quantization_with(None) == grid.quantization
    assert grid.quantization_with(0.0) == pytest.approx(0.5 / waves)  # no latency: 1 of 2 CTAs
    # exact whole waves cost nothing extra
    full = make_grid(ConvLayer(1, 8, 264 * 8, 64, 64, 1, 1), JAXCNN_DIRECT_64x64x16, spec)
    assert full.ctas == 264 and full.quantization_with(h) == pytest.approx(1.0)


def test_calibration_recovers_the_factors_it_was_generated_with():
    truth = Factors(
        compute={"xla:bf16": 0.6, "jaxcnn_direct:bf16>fp32": 0.4},
        dram=0.9,
        wave_latency_us={"xla:tensor": 0.5, "jaxcnn_direct:fma": 3.0},
        launch_us={"xla:tensor": 4.0, "jaxcnn_direct:fma": 2.0},
        hiding_warps=12.0,
    )
    samples = [
        Sample(layer, predict(layer, H200, "auto", impl, factors=truth).time_ms, impl)
        for layer, impl in _synthetic_layers()
    ]
    fitted = calibrate(H200, samples, prior_weight=1e-4, loss="linear")
    assert fitted.max_abs_rel_error < 1e-3
    for key, value in truth.compute.items():
        assert fitted.factors.compute[key] == pytest.approx(value, rel=0.02)
    assert fitted.factors.dram == pytest.approx(0.9, rel=0.02)
    assert fitted.factors.hiding_warps == pytest.approx(12.0, rel=0.05)
    for fitted_us, true_us in (
        (fitted.factors.wave_latency_us, truth.wave_latency_us),
        (fitted.factors.launch_us, truth.launch_us),
    ):
        for key, value in true_us.items():
            assert fitted_us[key] == pytest.approx(value, rel=0.05)


def test_fp16_uses_the_bf16_fraction():
    factors = Factors(compute={"xla:bf16": 0.5, "jaxcnn_direct:bf16>fp32": 0.25})
    assert factors.compute_fraction("xla:fp16") == 0.5
    assert factors.compute_fraction("jaxcnn_direct:fp16>fp32") == 0.25
    assert factors.compute_fraction("xla:fp32>tf32") == 1.0


def test_factors_json_round_trip(tmp_path):
    path = tmp_path / "factors.json"
    assert load_factors("H200", path) == Factors()  # nothing stored: ideal
    factors = Factors(compute={"xla:bf16": 0.9}, dram=0.8, launch_us={"xla:tensor": 3.0})
    save_factors("H200", factors, {"n": 3}, path)
    save_factors("A100 SXM 80GB", Factors(l2=0.5), path=path)
    assert load_factors("H200", path) == factors
    assert load_factors("A100 SXM 80GB", path).l2 == 0.5
    assert json.loads(path.read_text())["H200"]["fit"] == {"n": 3}


def test_stored_calibration_is_used_by_default():
    stored = load_factors("H200")
    assert predict(vgg_c3_1()).time_ms == pytest.approx(predict(vgg_c3_1(), factors=stored).time_ms)


# ---------------------------------------------------------------- bench rows and ncu


def _bench_row() -> dict:
    config = dict(n=64, h=56, w=56, c=128, k=256, r=3, s=3, stride=1, padding=1, dilation=1)
    return dict(
        layer="vgg_c3_1",
        dtype="bf16",
        config=config,
        timings=dict(
            jaxcnn=dict(median_ms=6.36, kernels=[dict(name=DIRECT_KERNEL, us_per_call=6364.5)]),
            xla_default=dict(
                median_ms=0.1626,
                kernels=[
                    dict(name=SM90_NAME, us_per_call=159.8),
                    dict(name="wrapped_transpose", us_per_call=2.1),
                    dict(name="Memset 3", us_per_call=0.8),
                ],
            ),
        ),
    )


def test_measurements_from_bench_rows():
    jax_m, xla_m = measurements_from_bench([_bench_row()])
    assert jax_m.impl == "jaxcnn_direct" and jax_m.kernel_ms == pytest.approx(6.3645)
    assert xla_m.kernel_ms == pytest.approx(0.1598) and xla_m.total_ms == 0.1626  # glue left out
    assert xla_m.tiling.mt == 128 and xla_m.in_scope
    fft = [("void fft2d_r2c_16x16<float>", 5.0), ("flip_filter", 1.0)]
    assert split_kernels(fft)[2] == "FFT algorithm"
    assert split_kernels([("conv2d_c1_k1_nhwc", 5.0)])[2] == ""  # a stream family of the model
    assert split_kernels([("void jaxcnn::conv_pool::conv_pool_stem_kernel<bf16>", 5.0)])[2] == "jaxcnn stem kernel"


def test_ncu_counters_attach_by_case_and_in_order(tmp_path):
    measurements = measurements_from_bench([_bench_row()])
    tidy = tmp_path / "tidy.csv"
    tidy.write_text(
        "layer,dtype,variant,kernel,metric,unit,value\n"
        f'vgg_c3_1,bf16,xla_default,{SM90_NAME},dram__bytes.sum,Mbyte,"1,234.5"\n'
        f"vgg_c3_1,bf16,xla_default,{SM90_NAME},lts__t_bytes.sum,Gbyte,2\n"
        "vgg_c3_1,bf16,xla_default,wrapped_transpose,lts__t_bytes.sum,Mbyte,9\n"
    )
    _, xla_m = attach_counters(measurements, read_ncu_csv(tidy))
    assert xla_m.counters == {"dram": pytest.approx(1234.5e6), "l2": pytest.approx(2e9)}

    raw = tmp_path / "raw.csv"
    header = '"ID","Kernel Name","Grid Size","Metric Name","Metric Unit","Metric Value"\n'
    rows = [
        f'"{i}","conv2d_direct_kernel","(3136, 4, 1)","dram__bytes.sum","byte","{v}"\n'
        for i, v in ((0, 100), (1, 300))
    ]
    raw.write_text("==PROF== Connected\n" + header + "".join(rows))
    jax_m, _ = attach_counters(measurements, read_ncu_csv(raw))
    assert jax_m.counters == {"dram": pytest.approx(200.0)}  # mean of the layer's launches


def test_validate_script_writes_reports(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "validate_perfmodel.py"
    spec = importlib.util.spec_from_file_location("validate_perfmodel", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bench = tmp_path / "bench_layers.json"
    environment = dict(device_kind="NVIDIA H200")
    bench.write_text(json.dumps(dict(environment=environment, rows=[_bench_row()])))
    assert module.main(["--bench", str(bench), "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "perfmodel_validation.json").read_text())
    assert report["gpu"] == "H200" and report["summary"]["n"] == 2
    assert (tmp_path / "perfmodel_validation.md").read_text() in capsys.readouterr().out


def test_deduplication_and_leave_one_model_out_groups():
    from jaxcnn.costmodel.validation import (
        cross_validated_by_group,
        deduplicated_samples,
        make_measurement,
        model_group,
    )

    def measure(name, ms, source="store"):
        layer = ConvLayer(1, 14, 14, 64, 64, 3, 3, padding=1, name=name)
        kernels = [("conv2d_direct_kernel", ms * 1e3)]
        return make_measurement(layer, "bf16", "jaxcnn", ms, kernels, source)

    a, b = measure("run1:c1", 0.010), measure("run2:c1", 0.030)
    other = make_measurement(
        ConvLayer(1, 28, 28, 32, 64, 3, 3, padding=1, name="run3:c2"), "bf16", "jaxcnn", 0.02,
        [("conv2d_direct_kernel", 20.0)], "store",
    )
    samples = deduplicated_samples([a, b, other])
    assert len(samples) == 2  # a and b: one shape, one sample at their median
    assert sorted(s.time_ms for s in samples) == pytest.approx([0.02, 0.02])
    runs = {1: "vgg16", 2: "vgg19", 3: "alexnet"}
    assert model_group(a, runs) == "vgg16" and model_group(measure("x", 1.0, "bench"), runs) == "bench"
    groups = {m.label: model_group(m, runs) for m in (a, b, other)}
    held = cross_validated_by_group([a, b, other], groups, "H200")
    # vgg16 held out: its shape is removed from training too, leaving alexnet's row alone
    assert set(held) == {a.label, b.label, other.label}


@pytest.mark.parametrize("kernel, family", [
    ("void jaxcnn::conv2d_direct::conv2d_direct_kernel<__nv_bfloat16>(int, int)", "jaxcnn_direct"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "xla"),
    ("nvjet_sm90_tst_64x8_64x16_1x4_h_bz_relubias_TNT", "xla"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>(Params)", "xla"),
    # the stream families (costmodel.streaming): depthwise kernels, cuDNN's and ours
    ("conv2d_c1_k1_nhwc_specialized", "depthwise"),
    ("void jaxcnn::conv2d_depthwise::dw_vec_kernel<__nv_bfloat16, true, 4, 8, 3, 3>(Params)", "jaxcnn_depthwise"),
    # families the model does not describe: our other kernels, cuDNN's direct engine
    ("void jaxcnn::conv_pool::conv_pool_stem_kernel<__nv_bfloat16, 1>(Params)", None),
    ("void jaxcnn::chain::conv1x1_depthwise_kernel<__nv_bfloat16, 1, false>(Params)", None),
    ("void convolve_common_engine_float_NHWC<__nv_bfloat16, __nv_bfloat16, 128, 5, 5>(int)", None),
    ("", None),
])
def test_kernel_family_of_a_measured_kernel(kernel, family):
    assert impl_of_kernel(kernel) == family
