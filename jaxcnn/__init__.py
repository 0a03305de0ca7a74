"""jaxcnn: memory-efficient CNN kernels for JAX (XLA FFI custom calls with lax fallbacks).

The top-level names load lazily, so `import jaxcnn.store` (the dashboard's path) does not
import jax.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "LAYOUTS": "jaxcnn.ops.layout_axes",
    "conv2d": "jaxcnn.ops",
    "conv2d_pool": "jaxcnn.ops",
    "fire": "jaxcnn.ops",
    "conv1x1_conv3x3": "jaxcnn.ops",
    "conv3x3_conv1x1": "jaxcnn.ops",
    "conv1x1_depthwise": "jaxcnn.ops",
    "inception": "jaxcnn.ops",
    "to_layout": "jaxcnn.ops",
    "relayout_weights": "jaxcnn.ops",
    "fold_weights": "jaxcnn.ops",
    "max_pool2d": "jaxcnn.ops",
    "avg_pool2d": "jaxcnn.ops",
    "softmax": "jaxcnn.ops",
    "log_softmax": "jaxcnn.ops",
    "sparse_conv2d": "jaxcnn.ops",
    "sparse_conv2d_pool": "jaxcnn.ops",
    "conv2d_auto_sparse": "jaxcnn.tuning.sparse_dispatch",
    "cuda_available": "jaxcnn._native.library",
    "cuda_unavailable_reason": "jaxcnn._native.library",
    "require_cuda": "jaxcnn._native.library",
    "jit": "jaxcnn.memory.donation",
    "plan_donation": "jaxcnn.memory.donation",
    "max_batch": "jaxcnn.memory.batch",
    "optimize": "jaxcnn.optimize",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        # jaxcnn.optimize is its (callable) package, so optimize_fused & co. are reachable from it
        value = module if module.__name__ == f"{__name__}.{name}" else getattr(module, name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'jaxcnn' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
