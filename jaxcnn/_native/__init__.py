"""Everything between Python and the CUDA library (jaxcnn/_lib/libjaxcnn_cuda.so), by job:

  library   loading, the FFI ABI check, handler registration, availability
  codes     integer codes Python sends the library that no jaxcnn.ops table holds (dtypes)
  queries   the host-side ctypes queries: workspace sizes and kernel plans
  plans     the typed plan records the plan queries return, read from the library's lines

Code that monkeypatches a function patches the submodule that holds it (the function's callers
read it there); this package only re-exports the public names.
"""

from jaxcnn._native.codes import DTYPE_CODES, dtype_code
from jaxcnn._native.library import (
    FFI_TARGETS,
    LibraryState,
    cuda_available,
    cuda_unavailable_reason,
    handlers_registered,
    library_state,
    missing_target_reason,
    require_cuda,
    target_registered,
)
from jaxcnn._native.plans import ConvPoolPlan, FirePlan, SparsePlan, plan_text
from jaxcnn._native.queries import (
    conv2d_workspace_bytes,
    conv_pool_plan,
    fire_plan,
    fire_workspace_bytes,
    sparse_conv_plan,
    sparse_conv_scratch_bytes,
)

__all__ = [
    "DTYPE_CODES", "FFI_TARGETS", "ConvPoolPlan", "FirePlan", "LibraryState", "SparsePlan",
    "conv2d_workspace_bytes", "conv_pool_plan", "cuda_available", "cuda_unavailable_reason",
    "dtype_code", "fire_plan", "fire_workspace_bytes", "handlers_registered", "library_state",
    "missing_target_reason", "plan_text", "require_cuda", "sparse_conv_plan", "sparse_conv_scratch_bytes",
    "target_registered",
]
