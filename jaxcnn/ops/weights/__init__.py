"""Whole-model weight transforms in one launch: fold (`fold_weights`: per-channel scale, cast and
permute) and relayout (`relayout_weights`: permute)."""

from jaxcnn.ops.weights.fold import fold_weights
from jaxcnn.ops.weights.relayout import relayout_weights

__all__ = ["fold_weights", "relayout_weights"]
