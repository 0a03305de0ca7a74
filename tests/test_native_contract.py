"""The Python <-> C++ contract of conv2d: the codes jaxcnn sends (layouts, precisions, kernel
families, dtypes) and the parameters of the library's workspace query agree with the C++ source,
so a reordered enum or a new query parameter fails here, not as a wrong kernel on a GPU."""

import re
from pathlib import Path

import jax.numpy as jnp
import pytest

from jaxcnn import _ffi
from jaxcnn.ops.conv2d.config import ALGORITHMS, HANDLER_ALGORITHM, LAYOUTS, PRECISIONS, make_config
from cuda_lowering import needs_library

CUDA_OPS = Path(__file__).resolve().parent.parent / "cuda_ops"
PARAMS_HEADER = CUDA_OPS / "common" / "conv2d_params.h"
CONV2D_FFI = CUDA_OPS / "conv" / "conv2d_ffi.cu"
# Python's "xla" runs lax's own conv; its code is reserved in the C++ enum (never sent).
PYTHON_ONLY = {"xla"}


def header_enum(name: str) -> dict[str, int]:
    """`kName = code` entries of `enum class <name> : int { ... }` in conv2d_params.h."""
    body = re.search(rf"enum class {name}\s*:\s*int\s*\{{(.*?)\}};", PARAMS_HEADER.read_text(), re.S)
    assert body, f"no enum class {name} in {PARAMS_HEADER}"
    return {k: int(v) for k, v in re.findall(r"\bk(\w+)\s*=\s*(\d+)", body.group(1))}


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def test_layout_codes():
    assert header_enum("TensorLayout") == {name: i for i, name in enumerate(LAYOUTS)}


def test_precision_codes():
    assert header_enum("MathPrecision") == {camel(name): i for i, name in enumerate(PRECISIONS)}


def test_algorithm_codes():
    want = {camel(name): i
            for i, name in enumerate(ALGORITHMS) if name not in PYTHON_ONLY}
    assert header_enum("Conv2dAlgorithm") == want
    assert set(header_enum("Conv2dAlgorithm").values()).isdisjoint(ALGORITHMS.index(n) for n in PYTHON_ONLY)
    assert HANDLER_ALGORITHM not in ALGORITHMS  # a public alias of "auto", never a code


def query_signature() -> list[tuple[str, str]]:
    """(type, name) of jaxcnn_conv2d_workspace_bytes' parameters in conv2d_ffi.cu."""
    m = re.search(r"jaxcnn_conv2d_workspace_bytes\((.*?)\)\s*\{", CONV2D_FFI.read_text(), re.S)
    assert m, f"no jaxcnn_conv2d_workspace_bytes in {CONV2D_FFI}"
    params = [" ".join(p.split()) for p in m.group(1).split(",")]
    return [tuple(p.rsplit(" ", 1)) for p in params]


def test_workspace_query_parameters():
    sig = query_signature()
    assert [name for _, name in sig[:-1]] == list(_ffi.CONV2D_QUERY_FIELDS)
    assert all(t == "int64_t" for t, _ in sig[:-1])
    assert sig[-1] == ("const char**", "reason")


def test_dtype_codes_match_the_query_switch():
    body = re.search(r"switch \(dtype\)(.*?)default:", CONV2D_FFI.read_text(), re.S).group(1)
    cases = {int(code): ctype for code, ctype in re.findall(r"case (\d+): plan = jaxcnn::plan_conv2d<([\w:]+)>", body)}
    c_types = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}
    assert cases == {code: c_types[name] for name, code in _ffi.DTYPE_CODES.items()}


@needs_library
def test_the_loaded_library_answers_the_query():
    cfg = make_config((2, 16, 16, 32), (3, 3, 32, 64), algorithm="tensor_core")
    size = _ffi.conv2d_workspace_bytes((2, 16, 16, 32), (3, 3, 32, 64), (2, 16, 16, 64), jnp.bfloat16, cfg)
    assert size >= 0
    with pytest.raises(ValueError, match="depthwise|groups"):
        _ffi.conv2d_workspace_bytes((2, 16, 16, 32), (3, 3, 32, 64), (2, 16, 16, 64), jnp.bfloat16,
                                    cfg.replace(algorithm="depthwise"))
