"""Analytical GPU traffic/time model of implicit-GEMM convolution (after DeLTA, Lym et al. 2019).

    from jaxcnn.costmodel import ConvLayer, predict
    p = predict(ConvLayer(64, 56, 56, 128, 256, 3, 3, padding=1, dtype="bf16"), gpu="H200")
    p.traffic.l2_bytes, p.time_ms, p.bound

Modules: layer (shapes, GEMM view), tiling (CTA tilings, presets, kernel-name parsing), traffic
(bytes at L1/L2/DRAM), timing (bounds -> time), factors (fitted parameters per GPU and their
JSON), calibration (fitting them), model (predict, predict_table), validation (predicted vs
measured), roofline (the kernel floor, DRAM and fp32 FMA time every estimate shares),
layout_cost (the layout choice's estimates: sector traffic per layout, transforms, conv
candidates).
"""

from jaxcnn.costmodel.calibration import Calibration, Sample, calibrate
from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.costmodel.factors import Factors, load_factors, save_factors
from jaxcnn.costmodel.model import Prediction, predict, predict_layer_info, predict_table
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

__all__ = [
    "Calibration",
    "ConvLayer",
    "Factors",
    "JAXCNN_DIRECT_64x64x16",
    "PRESETS",
    "Prediction",
    "Sample",
    "Tiling",
    "Traffic",
    "auto_tiling",
    "calibrate",
    "get_tiling",
    "load_factors",
    "parse_kernel_tiling",
    "predict",
    "predict_layer_info",
    "predict_table",
    "save_factors",
    "traffic",
    "validate",
]
