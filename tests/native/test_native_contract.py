"""The Python <-> C++ contract: conv2d's codes (layouts, precisions, kernel families, dtypes) and
the parameters of the library's workspace query agree with the C++ source, and the plan records
(jaxcnn/_native/plans.py) have a field for every key the plan queries print, so a reordered enum,
a new query parameter or a new plan key fails here, not as a wrong kernel on a GPU."""

import dataclasses
import re
from pathlib import Path

import jax.numpy as jnp
import pytest

from jaxcnn._native import codes, plans, queries
from jaxcnn._native.codes import CONV2D_ALGORITHMS as ALGORITHMS
from jaxcnn._native.codes import CONV2D_PRECISIONS as PRECISIONS
from jaxcnn._native.codes import CONV_POOL_ALGORITHMS, FIRE_ALGORITHMS, LAYOUTS
from jaxcnn.ops.conv2d.config import HANDLER_ALGORITHM, make_config
from cuda_lowering import needs_library

CUDA_OPS = Path(__file__).resolve().parents[2] / "cuda_ops"
PARAMS_HEADER = CUDA_OPS / "common" / "conv2d_params.h"
CONV2D_FFI = CUDA_OPS / "conv" / "conv2d_ffi.cu"
FIRE_FFI = CUDA_OPS / "fusion" / "fire_ffi.cu"
# Plan query -> (its source, the record Python reads its line into, the function that prints
# the line: the query itself or the one printer it shares).
PLAN_QUERIES = {
    "jaxcnn_conv_pool_plan": (CUDA_OPS / "conv_pool" / "conv_pool_ffi.cu", plans.ConvPoolPlan,
                              "jaxcnn_conv_pool_plan"),
    "jaxcnn_fire_plan": (FIRE_FFI, plans.FirePlan, "WritePlanLine"),
    "jaxcnn_fire_plan_for_device": (FIRE_FFI, plans.FirePlan, "WritePlanLine"),
    "jaxcnn_sparse_conv_plan": (CUDA_OPS / "sparse" / "sparse_ffi.cu", plans.SparsePlan,
                                "jaxcnn_sparse_conv_plan"),
}
# Python's "xla" runs lax's own conv; its code is reserved in the C++ enum (never sent).
PYTHON_ONLY = {"xla"}


def header_enum(name: str, header: Path = PARAMS_HEADER) -> dict[str, int]:
    """`kName = code` entries of `enum class <name> : int { ... }` in `header` (conv2d_params.h)."""
    body = re.search(rf"enum class {name}\s*:\s*int\s*\{{(.*?)\}};", header.read_text(), re.S)
    assert body, f"no enum class {name} in {header}"
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


@pytest.mark.parametrize("codes,enum,header", [
    (FIRE_ALGORITHMS, "FireAlgorithm", CUDA_OPS / "fusion" / "fire.h"),
    (CONV_POOL_ALGORITHMS, "ConvPoolAlgorithm", CUDA_OPS / "conv_pool" / "conv_pool.h"),
])
def test_fused_op_algorithm_codes(codes, enum, header):
    assert header_enum(enum, header) == {camel(name): i for i, name in enumerate(codes)}


def query_signature() -> list[tuple[str, str]]:
    """(type, name) of jaxcnn_conv2d_workspace_bytes' parameters in conv2d_ffi.cu."""
    m = re.search(r"jaxcnn_conv2d_workspace_bytes\((.*?)\)\s*\{", CONV2D_FFI.read_text(), re.S)
    assert m, f"no jaxcnn_conv2d_workspace_bytes in {CONV2D_FFI}"
    params = [" ".join(p.split()) for p in m.group(1).split(",")]
    return [tuple(p.rsplit(" ", 1)) for p in params]


def test_workspace_query_parameters():
    sig = query_signature()
    assert [name for _, name in sig[:-1]] == list(queries.CONV2D_QUERY_FIELDS)
    assert all(t == "int64_t" for t, _ in sig[:-1])
    assert sig[-1] == ("const char**", "reason")


def test_dtype_codes_match_the_query_switch():
    body = re.search(r"switch \(dtype\)(.*?)default:", CONV2D_FFI.read_text(), re.S).group(1)
    cases = {int(code): ctype for code, ctype in re.findall(r"case (\d+): plan = jaxcnn::plan_conv2d<([\w:]+)>", body)}
    c_types = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}
    assert cases == {code: c_types[name] for name, code in codes.DTYPE_CODES.items()}


@needs_library
def test_the_loaded_library_answers_the_query():
    cfg = make_config((2, 16, 16, 32), (3, 3, 32, 64), algorithm="tensor_core")
    size = queries.conv2d_workspace_bytes((2, 16, 16, 32), (3, 3, 32, 64), (2, 16, 16, 64), jnp.bfloat16, cfg)
    assert size >= 0
    with pytest.raises(ValueError, match="depthwise|groups"):
        queries.conv2d_workspace_bytes((2, 16, 16, 32), (3, 3, 32, 64), (2, 16, 16, 64), jnp.bfloat16,
                                    cfg.replace(algorithm="depthwise"))


def function_body(source: Path, name: str) -> str:
    """The text of function `name` in `source`, from its name to its closing brace."""
    body = re.search(rf"\b{name}\(.*?\n}}\n", source.read_text(), re.S)
    assert body, f"no {name} in {source}"
    return body.group(0)


def plan_keys(source: Path, function: str) -> set[str]:
    """The `key=` names in the string literals of `function`'s body in `source`."""
    body = function_body(source, function)
    return {key for literal in re.findall(r'"([^"]*)"', body) for key in re.findall(r"(\w+)=", literal)}


@pytest.mark.parametrize("query", sorted(PLAN_QUERIES))
def test_plan_records_have_a_field_for_every_printed_key(query):
    source, record, printer = PLAN_QUERIES[query]
    if printer != query:
        assert f"{printer}(" in function_body(source, query), f"{query} does not print with {printer}"
    keys = plan_keys(source, printer)
    assert "kernel" in keys
    fields = {f.name for f in dataclasses.fields(record)} - {"text", "why"}
    assert keys == fields


def test_fire_plan_for_device_takes_the_device_limits_fields():
    """jaxcnn_fire_plan_for_device's parameters: jaxcnn_fire_plan's shape, dtype and algorithm,
    then DeviceLimits' fields in order (queries.fire_plan passes them so), then the buffer."""
    def params(name):
        m = re.search(rf"\b{name}\((.*?)\)\s*\{{", FIRE_FFI.read_text(), re.S)
        assert m, f"no {name} in {FIRE_FFI}"
        return [" ".join(p.split()).rsplit(" ", 1)[1] for p in m.group(1).split(",")]

    plain, for_device = params("jaxcnn_fire_plan"), params("jaxcnn_fire_plan_for_device")
    device = [f.name for f in dataclasses.fields(plans.DeviceLimits)]
    assert for_device == plain[:-2] + device + plain[-2:]


def test_plan_lines_read_into_typed_fields():
    pool = plans.parse_conv_pool_plan("kernel=tensor_core block=8x16 pooled=4x8 block_k=64 grid=25088 "
                                      "smem=59392 recompute=1.00 flat_k=0")
    assert (pool.kernel, pool.block, pool.pooled, pool.block_k, pool.grid, pool.smem, pool.recompute,
            pool.flat_k, pool.tma, pool.why) == ("tensor_core", (8, 16), (4, 8), 64, 25088, 59392, 1.0,
                                                 False, None, None)
    direct = plans.parse_conv_pool_plan("kernel=direct (float32 at precision 'highest' (fp32 FMA)) grid=50176")
    assert (direct.kernel, direct.why, direct.grid) == (
        "direct", "float32 at precision 'highest' (fp32 FMA)", 50176)
    fire = plans.parse_fire_plan("kernel=wgmma launches=1 squeeze=fused workspace=0 (s=32: one launch)")
    assert (fire.kernel, fire.launches, fire.squeeze, fire.workspace, fire.why) == (
        "wgmma", 1, "fused", 0, "s=32: one launch")
    sparse = plans.parse_sparse_plan("kernel=tile tile=4x8 k_per_lane=4 warps=2x4 region=8x32 chunk=16 "
                                     "splits=1 grid=14x2 smem=206848 scratch=0")
    assert (sparse.tile, sparse.warps, sparse.grid, sparse.splits, sparse.scratch) == ((4, 8), (2, 4), (14, 2), 1, 0)
    reason = "the wgmma fire path is bf16/fp16 only (float32 runs the CUDA-core kernel)"
    refused = plans.parse_fire_plan(reason)
    assert (refused.text, refused.kernel, refused.why) == (reason, None, None)
    assert plans.plan_text(refused) == reason and plans.plan_text(None) is None
