"""predict(): traffic and time of one convolution on one GPU; predict_table(): store rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.costmodel.factors import Factors, load_factors
from jaxcnn.costmodel.streaming import StreamFactors, StreamPrediction, is_depthwise, is_stream_family, predict_stream
from jaxcnn.costmodel.tiling import Tiling, resolve_tiling
from jaxcnn.costmodel.timing import Keys, TimeBreakdown, kernel_keys, kernel_time, math_precision
from jaxcnn.costmodel.traffic import Traffic, traffic
from jaxcnn.profile.gpu_specs import GpuSpec, spec_by_name

MODEL_NAME = "delta"
IMPLS = ("xla", "jaxcnn_direct")
# Backend names of jaxcnn.models / the profiler -> the kernel family that runs a conv2d.
BACKEND_IMPLS = {"xla": "xla", "jaxcnn": "jaxcnn_direct", "jaxcnn_direct": "jaxcnn_direct"}


@dataclass(frozen=True)
class Prediction:
    layer: ConvLayer
    gpu: str
    impl: str
    precision: str  # "default" | "highest" (XLA's float32 precision)
    tiling: Tiling
    keys: Keys  # the ceiling and the factors it ran at
    traffic: Traffic
    times: TimeBreakdown

    @property
    def time_ms(self) -> float:
        return self.times.time_s * 1e3

    @property
    def bound(self) -> str:
        return self.times.bound

    def to_row(self) -> dict[str, Any]:
        """A row for Store.add_predictions (caller adds layer_id); the rest in `extra`."""
        grid = self.traffic.grid
        return dict(
            model=MODEL_NAME,
            tiling=self.tiling.name,
            l1_bytes=round(self.traffic.l1_bytes),
            l2_bytes=round(self.traffic.l2_bytes),
            dram_bytes=round(self.traffic.dram_bytes),
            time_ms=self.time_ms,
            extra=dict(
                bound=self.bound,
                layer=self.layer.name,
                gpu=self.gpu,
                impl=self.impl,
                precision=self.precision,
                math=self.keys.ceiling,
                tile=[self.tiling.mt, self.tiling.nt, self.tiling.kt],
                ctas=grid.ctas,
                occupancy=grid.occupancy,
                waves=grid.waves,
                quantization=self.times.quantization,
                bound_ms={k: v * 1e3 for k, v in self.times.bound_times().items()},
                latency_ms=self.times.latency_s * 1e3,
                smem_read_bytes=round(self.traffic.smem_read_bytes),
                work_flops=self.traffic.work_flops,
                bytes_by_operand=self.traffic.by_operand,
            ),
        )


def as_spec(gpu: str | GpuSpec) -> GpuSpec:
    return gpu if isinstance(gpu, GpuSpec) else spec_by_name(gpu)


@dataclass(frozen=True)
class KernelSetup:
    """What a prediction needs besides the factors: the kernel's tiling, its timing keys, its traffic."""

    tiling: Tiling
    keys: Keys
    traffic: Traffic


def kernel_setup(layer: ConvLayer, spec: GpuSpec, tiling: str | Tiling, impl: str, precision: str) -> KernelSetup:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, not {impl!r}")
    math = math_precision(layer.dtype, impl, precision)
    chosen = resolve_tiling(tiling, layer, impl, math, spec.sm_count)
    keys = kernel_keys(chosen, layer.dtype, impl, precision)
    return KernelSetup(chosen, keys, traffic(layer, chosen, spec))


def predict(
    layer: ConvLayer,
    gpu: str | GpuSpec = "H200",
    tiling: str | Tiling = "auto",
    impl: str = "xla",
    precision: str = "default",
    factors: Factors | None = None,
) -> Prediction:
    """Traffic at L1/L2/DRAM and time of `layer` run by `impl` on `gpu`.

    tiling: "auto" (auto_tiling), a preset name, a cuDNN kernel name or a Tiling. factors:
    default the calibration stored for the GPU (calibration/factors.json), else ideal ones.
    """
    spec = as_spec(gpu)
    setup = kernel_setup(layer, spec, tiling, impl, precision)
    used = factors if factors is not None else load_factors(spec.name)
    times = kernel_time(setup.traffic, spec, setup.keys, used)
    return Prediction(
        layer, spec.name, impl, precision, setup.tiling, setup.keys, setup.traffic, times
    )


def predict_family(
    layer: ConvLayer,
    family: str,
    gpu: str | GpuSpec = "H200",
    factors: Factors | None = None,
) -> StreamPrediction:
    """A stream family's prediction (costmodel.streaming) with `gpu`'s stored (or given) factors."""
    spec = as_spec(gpu)
    used = factors if factors is not None else load_factors(spec.name)
    return predict_stream(layer, family, spec, StreamFactors.from_dict(used.streaming.get(family, {})))


def predict_ms(
    layer: ConvLayer,
    gpu: str | GpuSpec = "H200",
    tiling: str | Tiling = "auto",
    impl: str = "xla",
    precision: str = "default",
    factors: Factors | None = None,
) -> float:
    """The predicted time of `layer` run by any family the model describes: an implicit-GEMM
    impl (predict) or a stream family (predict_family; tiling and precision do not apply)."""
    if is_stream_family(impl):
        return predict_family(layer, impl, gpu, factors).time_ms
    return predict(layer, gpu, tiling, impl, precision, factors).time_ms


def stream_row(p: StreamPrediction) -> dict[str, Any]:
    """A stream family's prediction as a row for Store.add_predictions (caller adds layer_id)."""
    return dict(model=MODEL_NAME, tiling=f"stream:{p.family}", l1_bytes=round(p.dram_bytes),
                l2_bytes=round(p.dram_bytes), dram_bytes=round(p.dram_bytes), time_ms=p.time_ms,
                extra=dict(bound=p.bound, impl=p.family, work_flops=p.work_flops,
                           bound_ms=p.bound_ms, latency_ms=p.launch_ms))


def predict_table(
    layers: Iterable[ConvLayer],
    gpu: str | GpuSpec = "H200",
    tiling: str | Tiling = "auto",
    impl: str = "xla",
    precision: str = "default",
    factors: Factors | None = None,
) -> list[dict[str, Any]]:
    """predict() for each layer, as rows for the store's `predictions` table."""
    return [predict(layer, gpu, tiling, impl, precision, factors).to_row() for layer in layers]


def predict_layer_info(
    info: Any,
    gpu: str | GpuSpec,
    impl: str = "xla",
    precision: str = "default",
    factors: Factors | None = None,
) -> dict[str, Any] | None:
    """predict() as a store row for a jaxcnn.models LayerInfo run by a profiler backend
    ("xla", "jaxcnn"); None when the model does not cover it (not a conv2d, unknown GPU or
    backend, a dtype the GPU has no math for). A depthwise conv is predicted as a depthwise
    stream family: cuDNN's for the XLA backend, jaxcnn's for the jaxcnn backend."""
    if getattr(info, "op", None) != "conv2d" or impl not in BACKEND_IMPLS:
        return None
    try:
        layer = ConvLayer.from_layer_info(info)
        if is_depthwise(layer):
            family = "depthwise" if BACKEND_IMPLS[impl] == "xla" else "jaxcnn_depthwise"
            return stream_row(predict_family(layer, family, gpu, factors))
        return predict(layer, gpu, "auto", BACKEND_IMPLS[impl], precision, factors).to_row()
    except (KeyError, ValueError, TypeError):
        return None


def model_rows(info: Any, gpu: str | GpuSpec, factors: Factors | None = None) -> list[dict[str, Any]]:
    """The traffic model's store rows for one layer: one per kernel family the model describes
    (predict_layer_info for each impl), whichever backend ran it (a jaxcnn layer may run XLA's
    kernel; readers pick the family of the kernel that ran). Empty for what it does not cover."""
    rows = (predict_layer_info(info, gpu, impl, factors=factors) for impl in IMPLS)
    return [row for row in rows if row is not None]


def stored_layer_info(row: Mapping[str, Any], name: str | None = None) -> SimpleNamespace:
    """A layer row of the store (or of its JSON export) as the LayerInfo fields predict_layer_info
    and ConvLayer.from_layer_info read: op, name, shapes, stride, padding, dilation, groups, dtype."""
    params = row.get("params") or {}
    return SimpleNamespace(
        op=row.get("op"), name=row["name"] if name is None else name, input_shapes=row["input_shapes"],
        weight_shape=row.get("weight_shape"),
        **{key: params.get(key) for key in ("stride", "padding", "dilation", "groups")},
        dtype=params.get("dtype", "float32"),
    )
