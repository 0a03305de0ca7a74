"""Loads the jaxcnn CUDA library and registers its XLA FFI handlers for platform "CUDA".

Loading never raises and never crashes the interpreter: every failure is turned into a
readable reason that `cuda_unavailable_reason()` returns and `require_cuda()` raises.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import jax
from jaxlib import xla_client

LIBRARY_NAME = "libjaxcnn_cuda.so"
LIBRARY_ENV = "JAXCNN_LIBRARY"
# "0" registers the handlers without the command-buffer trait (XLA then launches them one by
# one, outside its CUDA graphs): an escape hatch when debugging a capture problem.
COMMAND_BUFFERS_ENV = "JAXCNN_COMMAND_BUFFERS"

# custom-call target name -> exported handler symbol in the library.
FFI_TARGETS: dict[str, str] = {
    "jaxcnn_conv2d_fwd": "JaxcnnConv2dFwd",
    "jaxcnn_conv2d_fwd_nobias": "JaxcnnConv2dFwdNoBias",
    "jaxcnn_conv2d_fwd_residual": "JaxcnnConv2dFwdResidual",
    "jaxcnn_layout_transform": "JaxcnnLayoutTransform",
    "jaxcnn_max_pool2d_fwd": "JaxcnnMaxPool2dFwd",
    "jaxcnn_avg_pool2d_fwd": "JaxcnnAvgPool2dFwd",
    "jaxcnn_softmax_fwd": "JaxcnnSoftmaxFwd",
    "jaxcnn_fire_fwd": "JaxcnnFireFwd",
    "jaxcnn_conv2d_pool_fwd": "JaxcnnConv2dPoolFwd",
    "jaxcnn_sparse_conv2d_fwd": "JaxcnnSparseConv2dFwd",
    "jaxcnn_weight_relayout": "JaxcnnWeightRelayout",
    "jaxcnn_weight_fold": "JaxcnnWeightFold",
    "jaxcnn_conv3x3_conv1x1_fwd": "JaxcnnConv3x3Conv1x1Fwd",
    "jaxcnn_conv1x1_depthwise_fwd": "JaxcnnConv1x1DepthwiseFwd",
}


_LOADED: dict[str, ctypes.CDLL] = {}  # the library once its handlers are registered

# Codes of the dtype argument of the library's queries (cuda_ops/conv/conv2d_ffi.cu) by numpy
# dtype name.
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
# The int64 parameters of jaxcnn_conv2d_workspace_bytes (cuda_ops/conv/conv2d_ffi.cu), in the
# C signature's order and spelling (tests/test_native_contract.py checks it against the source);
# a `const char** reason` follows them.
CONV2D_QUERY_FIELDS = (
    "n", "h", "w", "c", "r", "s", "k", "p", "q", "stride_h", "stride_w", "pad_h", "pad_w",
    "dil_h", "dil_w", "groups", "activation", "has_residual", "layout", "precision", "algorithm",
    "dtype",
)


@dataclass(frozen=True)
class LibraryState:
    """What loading found: `registered` means the CUDA lowerings may emit custom calls."""

    path: str | None
    registered: bool
    reason: str  # empty when registered
    build_info: str = ""
    ffi_api_version: tuple[int, int] | None = None
    # Targets whose handler symbol the library lacks (built from older sources): their ops
    # lower to the reference (or fail under JAXCNN_STRICT=1); every other target still runs.
    missing_targets: tuple[str, ...] = ()


def _candidate_paths() -> list[Path]:
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return [Path(env)]
    return [Path(__file__).resolve().parent / "_lib" / LIBRARY_NAME]


def runtime_ffi_api_version() -> tuple[int, int] | None:
    """The XLA FFI API version of the running jaxlib, read from the headers it ships."""
    header = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "c_api.h"
    try:
        text = header.read_text()
    except OSError:
        return None
    major = re.search(r"#define\s+XLA_FFI_API_MAJOR\s+(\d+)", text)
    minor = re.search(r"#define\s+XLA_FFI_API_MINOR\s+(\d+)", text)
    if not (major and minor):
        return None
    return int(major.group(1)), int(minor.group(1))


def check_abi(built: tuple[int, int], runtime: tuple[int, int] | None) -> str:
    """Empty string when a library built against FFI API `built` can run on `runtime`."""
    if runtime is None:
        return ""  # headers missing from this jaxlib: nothing to compare, XLA checks at call time
    if built[0] != runtime[0] or built[1] > runtime[1]:
        return (
            f"ABI mismatch: the library was built against XLA FFI API {built[0]}.{built[1]} "
            f"but the running jaxlib {jax.__version__} provides {runtime[0]}.{runtime[1]}; "
            "rebuild with `pip install --no-build-isolation .` in this environment"
        )
    return ""


def registration_traits() -> xla_client.CustomCallTargetTraits:
    """Traits the handlers are registered with.

    Every handler only enqueues work on the stream XLA hands it (no sync, no allocation), so
    XLA may trace it into a command buffer and replay the whole program as one CUDA graph.
    jaxlib reads the trait from the registration, not from the handler's own metadata.
    """
    if os.environ.get(COMMAND_BUFFERS_ENV, "1").strip() == "0":
        return xla_client.CustomCallTargetTraits.DEFAULT
    return xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE


def _load(path: Path) -> LibraryState:
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return LibraryState(str(path), False, f"cannot load {path}: {e}")
    try:
        built = (int(lib.jaxcnn_ffi_api_version_major()), int(lib.jaxcnn_ffi_api_version_minor()))
        lib.jaxcnn_build_info.restype = ctypes.c_char_p
        info = lib.jaxcnn_build_info().decode()
    except AttributeError as e:
        return LibraryState(str(path), False, f"{path} is not a jaxcnn library: {e}")
    mismatch = check_abi(built, runtime_ffi_api_version())
    if mismatch:
        return LibraryState(str(path), False, mismatch, info, built)
    missing = tuple(t for t, symbol in FFI_TARGETS.items() if not hasattr(lib, symbol))
    try:
        traits = registration_traits()
        for target, symbol in FFI_TARGETS.items():
            if target in missing:
                continue
            capsule = jax.ffi.pycapsule(getattr(lib, symbol))
            jax.ffi.register_ffi_target(target, capsule, platform="CUDA", traits=traits)
    except Exception as e:  # registration errors come from several layers of jaxlib
        return LibraryState(str(path), False, f"registering FFI targets failed: {e}", info, built)
    _LOADED["lib"] = lib
    return LibraryState(str(path), True, "", info, built, missing)


@functools.cache
def library_state() -> LibraryState:
    """Loads the library once per process."""
    for path in _candidate_paths():
        if path.exists():
            return _load(path)
    where = ", ".join(str(p) for p in _candidate_paths())
    return LibraryState(
        None,
        False,
        f"no CUDA library built ({where} not found): install with nvcc available, "
        "e.g. `pip install --no-build-isolation .` (JAXCNN_CUDA=ON to require it)",
    )


def handlers_registered() -> bool:
    """True when CUDA lowerings can emit jaxcnn custom calls (no GPU needed to lower)."""
    return library_state().registered


def target_registered(target: str) -> bool:
    """True when `target`'s handler is registered (the library is loaded and has its symbol)."""
    state = library_state()
    return state.registered and target in FFI_TARGETS and target not in state.missing_targets


def missing_target_reason(target: str) -> str:
    """Why `target` cannot run although other targets may, or '' when it is registered."""
    if target_registered(target):
        return ""
    state = library_state()
    if not state.registered:
        return state.reason
    return (f"{state.path} has no handler for {target} (built from older sources): rebuild with "
            "`pip install --no-build-isolation .`")


def _gpu_reason() -> str:
    try:
        devices = jax.devices("cuda")
    except RuntimeError as e:
        return f"no CUDA device visible to jax ({jax.__version__}): {e}"
    return "" if devices else "no CUDA device visible to jax"


def cuda_unavailable_reason() -> str:
    """Why the CUDA kernels will not run here, or '' when they will."""
    state = library_state()
    if not state.registered:
        return state.reason
    return _gpu_reason()


def cuda_available() -> bool:
    """True when the library is loaded, its ABI matches and jax sees a CUDA GPU."""
    return cuda_unavailable_reason() == ""


def require_cuda() -> None:
    """Raises RuntimeError with the reason when the CUDA kernels cannot run."""
    reason = cuda_unavailable_reason()
    if reason:
        raise RuntimeError(f"jaxcnn CUDA kernels unavailable: {reason}")


def conv2d_workspace_bytes(x_nhwc, w_shape, y_nhwc, dtype, cfg, residual=False) -> int:
    """Device scratch bytes the conv2d handler needs for these shapes and `cfg`
    (the kernel family it will pick, its filter re-layout and fp32 splits), with or without a
    residual operand. Asks the library, so the size always matches the handler's own choice."""
    if not handlers_registered():
        return 0
    # imported here: jaxcnn.ops holds these codes, and its primitives import this module
    from jaxcnn.ops.conv2d.config import ALGORITHMS, LAYOUTS, PRECISIONS
    from jaxcnn.ops.epilogue import ACTIVATION_CODES

    fn = _LOADED["lib"].jaxcnn_conv2d_workspace_bytes
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64] * len(CONV2D_QUERY_FIELDS) + [ctypes.POINTER(ctypes.c_char_p)]
    (pt, _), (pl, _) = cfg.padding
    n, h, w, c = x_nhwc
    fields = dict(
        n=n, h=h, w=w, c=c, r=w_shape[0], s=w_shape[1], k=w_shape[3], p=y_nhwc[1], q=y_nhwc[2],
        stride_h=cfg.stride[0], stride_w=cfg.stride[1], pad_h=pt, pad_w=pl,
        dil_h=cfg.dilation[0], dil_w=cfg.dilation[1], groups=cfg.groups,
        activation=ACTIVATION_CODES[cfg.activation], has_residual=int(bool(residual)),
        layout=LAYOUTS.index(cfg.layout), precision=PRECISIONS.index(cfg.precision),
        algorithm=ALGORITHMS.index(cfg.algorithm), dtype=DTYPE_CODES[jax.numpy.dtype(dtype).name],
    )
    reason = ctypes.c_char_p()
    size = fn(*(fields[name] for name in CONV2D_QUERY_FIELDS), ctypes.byref(reason))
    if size < 0:
        why = reason.value.decode() if reason.value else "unknown reason"
        raise ValueError(
            f"jaxcnn.conv2d: algorithm={cfg.algorithm!r} cannot run x {tuple(x_nhwc)} (NHWC "
            f"order), w {tuple(w_shape)}, {jax.numpy.dtype(dtype).name}, "
            f"activation={cfg.activation!r}{', with a residual' if residual else ''}: {why}"
        )
    return int(size)


_SPARSE_PARAM_FIELDS = ("N", "H", "W", "C", "R", "S", "K", "P", "Q", "stride_h", "stride_w", "pad_h", "pad_w",
                        "dilation_h", "dilation_w", "activation", "pool_h", "pool_w", "pool_stride_h",
                        "pool_stride_w", "pool_pad_h", "pool_pad_w", "PP", "PQ", "elem_bytes")
# Fields a caller may leave out, and their values (elem_bytes: the storage type's size).
_SPARSE_PARAM_DEFAULTS = {"elem_bytes": 4}


def _sparse_params_array(params: dict):
    return (ctypes.c_int64 * len(_SPARSE_PARAM_FIELDS))(
        *(int(params.get(f, _SPARSE_PARAM_DEFAULTS.get(f, 0))) for f in _SPARSE_PARAM_FIELDS))


def _sparse_export(name: str):
    if not target_registered("jaxcnn_sparse_conv2d_fwd") or not hasattr(_LOADED["lib"], name):
        return None
    return getattr(_LOADED["lib"], name)


def sparse_conv_plan(params: dict) -> str | None:
    """The zero-skipping conv's plan for these params on the current device, as the library's
    one line ("kernel=tile tile=2x8 k_per_lane=4 ..." or "kernel=walk ..."), or None when the
    library (or its sparse handler) is not loaded. `params` holds the fields of
    cuda_ops/sparse/sparse_conv.h's SparseConvParams by name."""
    fn = _sparse_export("jaxcnn_sparse_conv_plan")
    if fn is None:
        return None
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
    out = ctypes.create_string_buffer(256)
    fn(_sparse_params_array(params), len(_SPARSE_PARAM_FIELDS), out, len(out))
    return out.value.decode()


def sparse_conv_scratch_bytes(params: dict) -> int | None:
    """Device scratch the zero-skipping conv's handler uses for these params (the walk kernel's
    masks or the tile kernel's split partial sums), or None when the library is not loaded.
    Asks the library, so the size matches the handler's own plan."""
    fn = _sparse_export("jaxcnn_sparse_conv_scratch_bytes")
    if fn is None:
        return None
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    size = fn(_sparse_params_array(params), len(_SPARSE_PARAM_FIELDS))
    return None if size < 0 else int(size)


def fire_plan(x_nhwc, squeeze, expand1, expand3, dtype, algorithm="auto") -> str | None:
    """The fire module's kernel configuration for these shapes on the current device, as the
    library's one line ("kernel=tensor_core tile=8x16 split=1 grid=132 smem=... ...", or
    "kernel=wgmma launches=2 workspace=..."): what the handler will launch. None when the library
    is not loaded (or predates the query)."""
    if not handlers_registered() or not hasattr(_LOADED["lib"], "jaxcnn_fire_plan"):
        return None
    # imported here: jaxcnn.ops holds these codes, and its primitives import this module
    from jaxcnn.ops.fire.config import ALGORITHMS

    fn = _LOADED["lib"].jaxcnn_fire_plan
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64] * 9 + [ctypes.c_char_p, ctypes.c_int64]
    out = ctypes.create_string_buffer(256)
    n, h, w, c = x_nhwc
    fn(n, h, w, c, squeeze, expand1, expand3, DTYPE_CODES[jax.numpy.dtype(dtype).name],
       ALGORITHMS.index(algorithm), out, len(out))
    return out.value.decode()


def fire_workspace_bytes(x_nhwc, squeeze, expand1, expand3, dtype, algorithm) -> int:
    """Device scratch bytes the fire handler needs (the squeeze output when it runs the three
    wgmma convs; 0 for the fused kernels). Asks the library, so the size matches the handler's
    own choice; 0 when the library is not loaded. A kernel that cannot run is the handler's
    error to report, at run time."""
    if not handlers_registered():
        return 0
    # imported here: jaxcnn.ops holds these codes, and its primitives import this module
    from jaxcnn.ops.fire.config import ALGORITHMS

    fn = _LOADED["lib"].jaxcnn_fire_workspace_bytes
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64] * 9
    n, h, w, c = x_nhwc
    return int(fn(n, h, w, c, squeeze, expand1, expand3,
                  DTYPE_CODES[jax.numpy.dtype(dtype).name], ALGORITHMS.index(algorithm)))


def conv_pool_plan(x_nhwc, w_shape, dtype, cfg) -> str | None:
    """The fused conv+pool kernel's configuration for an NHWC x, HWIO w and a ConvPoolConfig on
    the current device, as the library's one line ("kernel=tensor_core block=8x16 pooled=4x8
    block_k=64 grid=... smem=... recompute=1.00", or "kernel=direct (why) grid=..."): what the
    handler will launch. None when the library is not loaded (or predates the query)."""
    if not handlers_registered() or not hasattr(_LOADED["lib"], "jaxcnn_conv_pool_plan"):
        return None
    # imported here: jaxcnn.ops holds these codes, and its primitives import this module
    from jaxcnn.ops.conv2d.config import PRECISIONS
    from jaxcnn.ops.conv2d_pool.config import ALGORITHMS

    fn = _LOADED["lib"].jaxcnn_conv_pool_plan
    fn.restype = ctypes.c_int64
    i64s = ctypes.POINTER(ctypes.c_int64)
    fn.argtypes = [i64s, i64s, i64s, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_char_p, ctypes.c_int64]
    conv = cfg.conv
    (pt, pb), (pl, pr) = conv.padding
    (qt, qb), (ql, qr) = cfg.pool_padding
    dims = (ctypes.c_int64 * 7)(*x_nhwc, w_shape[0], w_shape[1], w_shape[3])
    conv_attrs = (ctypes.c_int64 * 8)(*conv.stride, pt, pb, pl, pr, *conv.dilation)
    pool_attrs = (ctypes.c_int64 * 8)(*cfg.pool_window, *cfg.pool_stride, qt, qb, ql, qr)
    out = ctypes.create_string_buffer(256)
    fn(dims, conv_attrs, pool_attrs, DTYPE_CODES[jax.numpy.dtype(dtype).name],
       PRECISIONS.index(conv.precision), ALGORITHMS.index(cfg.algorithm), out, len(out))
    return out.value.decode()
