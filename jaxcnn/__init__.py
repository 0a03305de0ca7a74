"""jaxcnn: memory-efficient CNN kernels for JAX (XLA FFI custom calls with lax fallbacks)."""

from jaxcnn._ffi import cuda_available, cuda_unavailable_reason, require_cuda
from jaxcnn.ops import conv2d

__version__ = "0.1.0"

__all__ = ["conv2d", "cuda_available", "cuda_unavailable_reason", "require_cuda", "__version__"]
