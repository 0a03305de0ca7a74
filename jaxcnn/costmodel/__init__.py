"""Analytical GPU traffic/time model of implicit-GEMM convolution (after DeLTA, Lym et al. 2019).

    from jaxcnn.costmodel import ConvLayer, predict
    p = predict(ConvLayer(64, 56, 56, 128, 256, 3, 3, padding=1, dtype="bf16"), gpu="H200")
    p.traffic.l2_bytes, p.time_ms, p.bound

Modules: kernel_families (which of the model's kernel families a measured GPU kernel is; jax-free),
layer (shapes, GEMM view), tiling (CTA tilings, presets, kernel-name parsing), traffic
(bytes at L1/L2/DRAM), timing (bounds -> time), streaming (the depthwise kernels, priced from
their bytes and FMAs), factors (fitted parameters per GPU and their JSON), calibration (fitting
them), model (predict, predict_ms for any family, predict_table), validation (predicted vs
measured), roofline (the kernel floor, DRAM and fp32 FMA time every estimate shares),
layout_cost (the layout choice's estimates: sector traffic per layout, transforms, conv
candidates).
"""

import importlib
from typing import TYPE_CHECKING

# Public name -> its module. Resolved on first use (PEP 562), so a jax-free reader of one small
# module (the dashboard reads kernel_families) does not import the model and jax with it.
_EXPORTS = {
    "Calibration": "calibration", "Sample": "calibration", "calibrate": "calibration",
    "ConvLayer": "conv_layer",
    "Factors": "factors", "load_factors": "factors", "save_factors": "factors",
    "impl_of_kernel": "kernel_families",
    "Prediction": "model", "predict": "model", "predict_layer_info": "model", "predict_ms": "model",
    "predict_table": "model",
    "STREAM_FAMILIES": "streaming", "StreamFactors": "streaming",
    "JAXCNN_DIRECT_64x64x16": "tiling", "PRESETS": "tiling", "Tiling": "tiling", "auto_tiling": "tiling",
    "get_tiling": "tiling", "parse_kernel_tiling": "tiling",
    "Traffic": "traffic", "traffic": "traffic",
    "validate": "validation",
}

if TYPE_CHECKING:
    from jaxcnn.costmodel.calibration import Calibration, Sample, calibrate
    from jaxcnn.costmodel.conv_layer import ConvLayer
    from jaxcnn.costmodel.factors import Factors, load_factors, save_factors
    from jaxcnn.costmodel.kernel_families import impl_of_kernel
    from jaxcnn.costmodel.model import Prediction, predict, predict_layer_info, predict_ms, predict_table
    from jaxcnn.costmodel.streaming import STREAM_FAMILIES, StreamFactors
    from jaxcnn.costmodel.tiling import (
        JAXCNN_DIRECT_64x64x16,
        PRESETS,
        Tiling,
        auto_tiling,
        get_tiling,
        parse_kernel_tiling,
    )
    from jaxcnn.costmodel.traffic import Traffic, traffic
    from jaxcnn.costmodel.validation import validate


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jaxcnn.costmodel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"jaxcnn.costmodel.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "Calibration",
    "ConvLayer",
    "Factors",
    "JAXCNN_DIRECT_64x64x16",
    "PRESETS",
    "Prediction",
    "STREAM_FAMILIES",
    "Sample",
    "StreamFactors",
    "Tiling",
    "Traffic",
    "auto_tiling",
    "calibrate",
    "get_tiling",
    "impl_of_kernel",
    "load_factors",
    "parse_kernel_tiling",
    "predict",
    "predict_layer_info",
    "predict_ms",
    "predict_table",
    "save_factors",
    "traffic",
    "validate",
]
