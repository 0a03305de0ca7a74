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
    return [Path(__file__).resolve().parent.parent / "_lib" / LIBRARY_NAME]


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


def loaded_library() -> ctypes.CDLL:
    """The loaded library, for the host-side queries (jaxcnn._native.queries); only once
    `handlers_registered()` is True."""
    return _LOADED["lib"]


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
