"""Bad input to every public op fails at trace time with a ValueError / TypeError whose message
starts with the offending argument's name; an empty batch (N = 0) gives the empty result of the
right shape without binding a jaxcnn primitive (so no kernel launches).

One table per op. Array operands given as jax.ShapeDtypeStruct are traced with jax.eval_shape
(nothing is allocated, so shapes past int32 cost nothing); anything else (None, strings,
objects) is passed to the op as is.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn
from arrays import BAD_NHWC_X, sds

# jnp.asarray of a list of strings warns (numpy's 'a' dtype alias) before it raises.
pytestmark = pytest.mark.filterwarnings("ignore:Data type alias 'a':DeprecationWarning")

BIG = 2**62  # past int64 once multiplied: XLA's own failure is an MLIR / verifier error
HUGE = 10**7  # fits int32, but pads or windows of it make results of 10**14 elements


def trace(op, operands, kwargs):
    """op(**operands, **kwargs) under eval_shape; ShapeDtypeStruct operands are traced."""
    traced = {k: v for k, v in operands.items() if isinstance(v, jax.ShapeDtypeStruct)}
    fixed = {k: v for k, v in operands.items() if k not in traced}
    return jax.eval_shape(lambda t: op(**fixed, **t, **kwargs), traced)


def check_raises(op, operands, kwargs, error, arg):
    with pytest.raises((TypeError, ValueError)) as info:
        trace(op, operands, kwargs)
    assert info.type is error, f"{info.type.__name__}: {info.value}"
    # The message's subject is the argument, e.g. "padding ((3, 3), (3, 3)) must be ...".
    assert re.match(rf"{re.escape(arg)}(?!\w)", str(info.value)), str(info.value)


def case(arg, error, **changes):
    """One bad call: `changes` replace operands or keyword arguments of the op's good call."""
    # No memory addresses in ids: pytest-xdist workers must collect the same test names.
    label = ",".join(re.sub(r" at 0x[0-9a-fA-F]+", "", f"{k}={v!r}")[:40] for k, v in changes.items())
    return pytest.param(arg, error, changes, id=label)


def split(changes, operand_names, base_operands, base_kwargs):
    operands = dict(base_operands)
    kwargs = dict(base_kwargs)
    for k, v in changes.items():
        (operands if k in operand_names else kwargs)[k] = v
    return operands, kwargs


def not_arrays(name):
    """Values that are not arrays, for operand `name`."""
    return [
        case(name, TypeError, **{name: None}),
        case(name, TypeError, **{name: "abc"}),
        case(name, TypeError, **{name: ["a", "b"]}),
        case(name, TypeError, **{name: object()}),
    ]


def one_non_array_each(*names):
    """One value that is not an array for each operand of names, in turn None, a string, an
    object and a list of strings."""
    values = (None, "w", object(), ["a"])
    return [case(name, TypeError, **{name: values[i % len(values)]}) for i, name in enumerate(names)]


def bad_nhwc_x():
    """What every op on an NHWC x [2, 8, 8, 16] rejects as x: values that are not arrays, the bad
    inputs of arrays.BAD_NHWC_X (rank, dtype, an empty dimension), sizes past int32."""
    return [*not_arrays("x"), *(case("x", error, **changes) for changes, error, _ in BAD_NHWC_X),
            case("x", ValueError, x=sds((2**40, 8, 8, 16))),
            case("x", ValueError, x=sds((1, 2**16, 2**16, 16)))]


# ---------------------------------------------------------------------------- pools
POOL_X = sds((2, 8, 8, 4))
POOL_CASES = [
    *not_arrays("x"),
    case("x", TypeError, x=b"bytes"),
    case("x", TypeError, x=[[1.0, 2.0], [3.0]]),  # ragged
    case("x", ValueError, x=sds((8, 8, 4))),
    case("x", TypeError, x=sds((2, 8, 8, 4), jnp.int32)),
    case("x", TypeError, x=sds((2, 8, 8, 4), jnp.complex64)),
    case("x", ValueError, x=sds((2, 0, 8, 4))),
    case("window", ValueError, x=sds((2, 1, 8, 4)), layout="CHWN"),  # H = 1 < the window
    case("x", ValueError, x=sds((2, 2**16, 2**16, 4))),  # 2**34 elements per image
    case("x", ValueError, x=sds((2**40, 8, 8, 4))),
    case("window", TypeError, window=None),
    case("window", ValueError, window=0),
    case("window", ValueError, window=(2, -1)),
    case("window", TypeError, window=2.0),
    case("window", TypeError, window="2"),
    case("window", TypeError, window=(1, 2, 3)),
    case("window", ValueError, window=9),
    case("window", ValueError, window=HUGE),
    case("window", ValueError, window=BIG),
    case("window", ValueError, window=HUGE, padding=HUGE // 2),  # 10**14 taps
    case("stride", ValueError, stride=0),
    case("stride", TypeError, stride="1"),
    case("stride", ValueError, stride=2**31),
    case("stride", ValueError, stride=BIG),
    case("padding", ValueError, padding=-1),
    case("padding", ValueError, padding=((0, -1), (0, 0))),
    case("padding", ValueError, padding=2),  # == window: the window lies wholly in padding
    case("padding", ValueError, padding=((0, 0), (0, 2))),
    case("padding", ValueError, padding=HUGE),
    case("padding", ValueError, padding=BIG),
    case("padding", ValueError, padding="FULL"),
    case("padding", TypeError, padding=None),
    case("padding", TypeError, padding=1.5),
    case("layout", ValueError, layout="NWHC"),
    case("layout", TypeError, layout=None),
    case("layout", TypeError, layout=0),
]


@pytest.mark.parametrize("arg,error,changes", POOL_CASES)
@pytest.mark.parametrize("pool", [jaxcnn.max_pool2d, jaxcnn.avg_pool2d], ids=["max", "avg"])
def test_pool(pool, arg, error, changes):
    operands, kwargs = split(changes, ("x",), {"x": POOL_X}, {"window": 2})
    check_raises(pool, operands, kwargs, error, arg)


@pytest.mark.parametrize("arg,error,changes", [
    case("count_include_pad", TypeError, count_include_pad="yes"),
    case("count_include_pad", TypeError, count_include_pad=None),
    case("count_include_pad", TypeError, count_include_pad=1),
])
def test_avg_pool_count_include_pad(arg, error, changes):
    operands, kwargs = split(changes, ("x",), {"x": POOL_X}, {"window": 2})
    check_raises(jaxcnn.avg_pool2d, operands, kwargs, error, arg)


# ---------------------------------------------------------------------------- softmax
SOFTMAX_CASES = [
    *not_arrays("x"),
    case("x", TypeError, x={"a": 1}),
    case("x", TypeError, x=b"bytes"),
    case("x", ValueError, x=sds(())),
    case("x", TypeError, x=sds((4, 10), jnp.int32)),
    case("x", TypeError, x=sds((4, 10), jnp.int8)),
    case("x", TypeError, x=sds((4, 10), jnp.bool_)),
    case("x", TypeError, x=sds((4, 10), jnp.complex64)),
    case("x", ValueError, x=sds((2, 2**31))),  # a row past int32
    case("x", ValueError, x=sds((2**31, 2))),
    case("axis", ValueError, axis=2),
    case("axis", ValueError, axis=-3),
    case("axis", ValueError, axis=BIG),
    case("axis", TypeError, axis=1.0),
    case("axis", TypeError, axis=None),
    case("axis", TypeError, axis="1"),
    case("axis", TypeError, axis=True),
    case("axis", TypeError, axis=(0, 1)),
]


@pytest.mark.parametrize("arg,error,changes", SOFTMAX_CASES)
@pytest.mark.parametrize("op", [jaxcnn.softmax, jaxcnn.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax(op, arg, error, changes):
    operands, kwargs = split(changes, ("x",), {"x": sds((4, 10))}, {})
    check_raises(op, operands, kwargs, error, arg)


# ---------------------------------------------------------------------------- fire
FIRE = {"x": sds((2, 8, 8, 16)), "squeeze_w": sds((1, 1, 16, 8)),
        "expand1_w": sds((1, 1, 8, 4)), "expand3_w": sds((3, 3, 8, 4))}
FIRE_OPERANDS = (*FIRE, "squeeze_b", "expand1_b", "expand3_b")
FIRE_CASES = [
    *bad_nhwc_x(),
    case("squeeze_w", TypeError, squeeze_w=None),
    case("expand1_w", TypeError, expand1_w="w"),
    case("expand3_w", TypeError, expand3_w=object()),
    case("squeeze_b", TypeError, squeeze_b="b"),
    case("expand3_b", TypeError, expand3_b=["a"]),
    case("squeeze_w", ValueError, squeeze_w=sds((1, 1, 15, 8))),
    case("squeeze_w", ValueError, squeeze_w=sds((3, 3, 16, 8))),
    case("squeeze_w", TypeError, squeeze_w=sds((1, 1, 16, 8), jnp.bfloat16)),
    case("expand1_w", ValueError, expand1_w=sds((1, 1, 7, 4))),
    case("expand1_w", ValueError, expand1_w=sds((3, 3, 8, 4))),
    case("expand3_w", ValueError, expand3_w=sds((1, 1, 8, 4))),
    case("expand3_w", ValueError, expand3_w=sds((3, 3, 9, 4))),
    case("squeeze_b", ValueError, squeeze_b=sds((7,))),
    case("expand1_b", ValueError, expand1_b=sds((4, 1))),
    case("expand3_b", TypeError, expand3_b=sds((4,), jnp.float16)),
    case("algorithm", ValueError, algorithm="winograd"),
    case("algorithm", ValueError, algorithm=None),
]


@pytest.mark.parametrize("arg,error,changes", FIRE_CASES)
def test_fire(arg, error, changes):
    check_raises(jaxcnn.fire, *split(changes, FIRE_OPERANDS, FIRE, {}), error, arg)


# ---------------------------------------------------------------------------- inception
INCEPTION = {"x": sds((2, 8, 8, 16)), "w_1x1": sds((1, 1, 16, 4)),
             "w_3x3_reduce": sds((1, 1, 16, 4)), "w_3x3": sds((3, 3, 4, 6)),
             "w_5x5_reduce": sds((1, 1, 16, 2)), "w_5x5": sds((5, 5, 2, 3)),
             "w_pool_proj": sds((1, 1, 16, 5))}
INCEPTION_OPERANDS = (*INCEPTION, "b_1x1", "b_3x3_reduce", "b_3x3", "b_5x5_reduce", "b_5x5",
                      "b_pool_proj")
INCEPTION_CASES = [
    *bad_nhwc_x(),
    case("w_1x1", TypeError, w_1x1=None),
    case("w_3x3", TypeError, w_3x3="w"),
    case("w_pool_proj", TypeError, w_pool_proj=object()),
    case("b_5x5", TypeError, b_5x5="b"),
    case("w_1x1", ValueError, w_1x1=sds((3, 3, 16, 4))),
    case("w_3x3_reduce", ValueError, w_3x3_reduce=sds((1, 1, 15, 4))),
    case("w_3x3", ValueError, w_3x3=sds((3, 3, 5, 6))),
    case("w_3x3", ValueError, w_3x3=sds((2, 2, 4, 6))),
    case("w_5x5", ValueError, w_5x5=sds((5, 3, 2, 3))),
    case("w_5x5_reduce", TypeError, w_5x5_reduce=sds((1, 1, 16, 2), jnp.bfloat16)),
    case("w_pool_proj", ValueError, w_pool_proj=sds((1, 1, 16))),
    case("b_1x1", ValueError, b_1x1=sds((5,))),
    case("b_3x3", TypeError, b_3x3=sds((6,), jnp.float16)),
    case("algorithm", ValueError, algorithm="fast"),
    case("precision", ValueError, precision="float64"),
]


@pytest.mark.parametrize("arg,error,changes", INCEPTION_CASES)
def test_inception(arg, error, changes):
    check_raises(jaxcnn.inception, *split(changes, INCEPTION_OPERANDS, INCEPTION, {}), error, arg)


# ---------------------------------------------------------------------------- conv2d_pool
CONV = {"x": sds((2, 8, 8, 4)), "w": sds((3, 3, 4, 8)), "bias": sds((8,))}
CONV_BAD_COMMON = [  # conv2d's arguments, shared by conv2d, conv2d_pool and sparse_conv2d
    *not_arrays("x"),
    case("w", TypeError, w=None),
    case("w", TypeError, w="w"),
    case("bias", TypeError, bias="b"),
    case("bias", TypeError, bias=object()),
    case("x", ValueError, x=sds((8, 8, 4))),
    case("w", ValueError, w=sds((3, 4, 8))),
    case("x", TypeError, x=sds((2, 8, 8, 4), jnp.int32), w=sds((3, 3, 4, 8), jnp.int32),
         bias=sds((8,), jnp.int32)),
    case("w", TypeError, w=sds((3, 3, 4, 8), jnp.bfloat16)),
    case("w", ValueError, w=sds((3, 3, 5, 8))),
    case("bias", ValueError, bias=sds((7,))),
    case("bias", TypeError, bias=sds((8,), jnp.float16)),
    case("stride", ValueError, stride=0),
    case("stride", TypeError, stride="2"),
    case("padding", ValueError, padding="FULL"),
    case("padding", ValueError, padding=-1),
    case("dilation", ValueError, dilation=(1, 0)),
    case("precision", ValueError, precision="float64"),
]
CONV_INT32 = [  # the kernels' int32 limits (conv2d_pool and sparse_conv2d)
    case("stride", ValueError, stride=BIG),
    case("padding", ValueError, padding=HUGE),
    case("padding", ValueError, padding=BIG),
    case("dilation", ValueError, dilation=BIG),
    case("x", ValueError, x=sds((2, 2**16, 2**16, 4))),
    case("x", ValueError, x=sds((2**40, 8, 8, 4))),
]
CONV_POOL_CASES = [
    *CONV_BAD_COMMON,
    *CONV_INT32,
    case("pool_window", ValueError, pool_window=0),
    case("pool_window", TypeError, pool_window=2.0),
    case("pool_window", ValueError, pool_window=BIG),
    case("pool_window", ValueError, pool_window=9),
    case("pool_stride", ValueError, pool_stride=(2, 0)),
    case("pool_stride", ValueError, pool_stride=BIG),
    case("pool_padding", ValueError, pool_padding=2),
    case("pool_padding", ValueError, pool_padding=-1),
    case("pool_padding", ValueError, pool_padding="FULL"),
    case("pool_padding", ValueError, pool_padding=HUGE),
    case("layout", ValueError, layout="HWCN"),
    case("algorithm", ValueError, algorithm="winograd"),
    case("sparse", TypeError, sparse=1),
]


@pytest.mark.parametrize("arg,error,changes", CONV_POOL_CASES)
def test_conv2d_pool(arg, error, changes):
    check_raises(jaxcnn.conv2d_pool, *split(changes, CONV, CONV, {}), error, arg)


# ---------------------------------------------------------------------------- sparse_conv2d
SPARSE_CASES = [
    *CONV_BAD_COMMON,
    *CONV_INT32,
    case("activation", ValueError, activation="gelu"),
    case("activation", ValueError, activation=1),
    case("layout", ValueError, layout="NWHC"),
]


@pytest.mark.parametrize("arg,error,changes", SPARSE_CASES)
def test_sparse_conv2d(arg, error, changes):
    check_raises(jaxcnn.sparse_conv2d, *split(changes, CONV, CONV, {}), error, arg)


@pytest.mark.parametrize("arg,error,changes", [
    *not_arrays("x"),
    case("pool_window", ValueError, pool_window=0),
    case("pool_window", ValueError, pool_window=BIG),
    case("pool_stride", ValueError, pool_stride=BIG),
    case("pool_padding", ValueError, pool_padding=2),
    case("pool_padding", ValueError, pool_padding="FULL"),
    case("padding", ValueError, padding=HUGE),
])
def test_sparse_conv2d_pool(arg, error, changes):
    check_raises(jaxcnn.sparse_conv2d_pool, *split(changes, CONV, CONV, {}), error, arg)


# ---------------------------------------------------------------------------- conv2d
# conv2d's validation is conv2d's config (shared with the ops above); these are the rows it passes.
CONV2D_CASES = [
    *CONV_BAD_COMMON,
    case("groups", ValueError, groups=0),
    case("groups", TypeError, groups=1.0),
    case("activation", ValueError, activation="gelu"),
    case("layout", ValueError, layout="NWHC"),
    case("algorithm", ValueError, algorithm="fft"),
]


@pytest.mark.parametrize("arg,error,changes", CONV2D_CASES)
def test_conv2d(arg, error, changes):
    check_raises(jaxcnn.conv2d, *split(changes, CONV, CONV, {}), error, arg)


# ---------------------------------------------------------------------------- chains
CHAIN_X = sds((2, 8, 8, 16))
CHAIN_COMMON = [
    *bad_nhwc_x(),
    case("activations", ValueError, activations=("relu",)),
    case("activations", ValueError, activations=("gelu", "relu")),
    case("activations", ValueError, activations=None),
    case("activations", ValueError, activations="relu"),
]
DEPTHWISE = {"x": CHAIN_X, "w1": sds((1, 1, 16, 32)), "wd": sds((3, 3, 1, 32))}
DEPTHWISE_CASES = [
    *CHAIN_COMMON,
    *one_non_array_each("w1", "wd", "b1", "bd"),
    case("w1", ValueError, w1=sds((1, 1, 15, 32))),
    case("w1", ValueError, w1=sds((3, 3, 16, 32))),
    case("w1", TypeError, w1=sds((1, 1, 16, 32), jnp.bfloat16)),
    case("w1", ValueError, w1=sds((1, 1, 16, 2**31)), wd=sds((3, 3, 1, 2**31))),
    case("wd", ValueError, wd=sds((3, 3, 2, 32))),
    case("wd", ValueError, wd=sds((3, 3, 1, 16))),
    case("b1", ValueError, b1=sds((31,))),
    case("bd", TypeError, bd=sds((32,), jnp.float16)),
    case("stride", ValueError, stride=3),
    case("stride", TypeError, stride=2.0),
    case("stride", TypeError, stride=None),
    case("stride", ValueError, stride=BIG),
]


@pytest.mark.parametrize("arg,error,changes", DEPTHWISE_CASES)
def test_conv1x1_depthwise(arg, error, changes):
    operands, kwargs = split(changes, (*DEPTHWISE, "b1", "bd"), DEPTHWISE, {})
    check_raises(jaxcnn.conv1x1_depthwise, operands, kwargs, error, arg)


CONV3X3 = {"x": CHAIN_X, "w3": sds((3, 3, 16, 8)), "w1": sds((1, 1, 8, 4))}
CONV3X3_CASES = [
    *CHAIN_COMMON,
    *one_non_array_each("w3", "w1", "b3", "b1"),
    case("w3", ValueError, w3=sds((3, 3, 15, 8))),
    case("w3", ValueError, w3=sds((1, 1, 16, 8))),
    case("w3", ValueError, w3=sds((3, 3, 16))),
    case("w3", TypeError, w3=sds((3, 3, 16, 8), jnp.bfloat16)),
    case("w1", ValueError, w1=sds((1, 1, 7, 4))),
    case("w1", ValueError, w1=sds((3, 3, 8, 4))),
    case("w1", ValueError, w1=sds((1, 1, 8, 2**31))),
    case("b3", ValueError, b3=sds((7,))),
    case("b1", TypeError, b1=sds((4,), jnp.float16)),
    case("algorithm", ValueError, algorithm="winograd"),
    case("algorithm", ValueError, algorithm=None),
]


@pytest.mark.parametrize("arg,error,changes", CONV3X3_CASES)
def test_conv3x3_conv1x1(arg, error, changes):
    operands, kwargs = split(changes, (*CONV3X3, "b3", "b1"), CONV3X3, {})
    check_raises(jaxcnn.conv3x3_conv1x1, operands, kwargs, error, arg)


# ---------------------------------------------------------------------------- to_layout
TO_LAYOUT_CASES = [
    *not_arrays("x"),
    case("x", TypeError, x={"a": 1}),
    case("x", TypeError, x=b"bytes"),
    case("x", TypeError, x=[[1.0, 2.0], [3.0]]),
    case("x", ValueError, x=3.0),
    case("x", ValueError, x=sds((8, 8, 4))),
    case("x", ValueError, x=sds((1, 2, 8, 8, 4))),
    case("x", TypeError, x=sds((2, 8, 8, 4), jnp.complex64)),
    case("x", ValueError, x=sds((BIG, 8, 8, 4))),  # XLA itself aborts compiling this
    case("src", ValueError, src="NWHC"),
    case("src", ValueError, src="nhwc"),
    case("src", TypeError, src=None),
    case("src", TypeError, src=0),
    case("dst", ValueError, dst="HWCN"),
    case("dst", ValueError, dst=""),
    case("dst", TypeError, dst=None),
    case("dst", TypeError, dst=["NCHW"]),
    case("dst", TypeError, dst=1.5),
]


@pytest.mark.parametrize("arg,error,changes", TO_LAYOUT_CASES)
def test_to_layout(arg, error, changes):
    operands, kwargs = split(changes, ("x",), {"x": sds((2, 8, 8, 4))}, {"src": "NHWC", "dst": "NCHW"})
    check_raises(jaxcnn.to_layout, operands, kwargs, error, arg)


# ---------------------------------------------------------------------------- relayout_weights
@pytest.mark.parametrize("arg,error,weights,perms", [
    pytest.param("weights", TypeError, None, [], id="weights=None"),
    pytest.param("weights", TypeError, "w", ["0123"], id="weights=str"),
    pytest.param("weights[0]", TypeError, [None], [(0, 1, 2, 3)], id="weights[0]=None"),
    pytest.param("weights[1]", TypeError, [np.ones((1, 1, 1, 1)), "w"], [(0, 1, 2, 3)] * 2,
                 id="weights[1]=str"),
    pytest.param("perms", TypeError, [np.ones((1, 1, 1, 1))], None, id="perms=None"),
    pytest.param("perms[0]", TypeError, [np.ones((1, 1, 1, 1))], [None], id="perms[0]=None"),
    pytest.param("perms[0]", TypeError, [np.ones((1, 1, 1, 1))], [(0.0, 1, 2, 3)], id="perms[0]=float"),
    pytest.param("perms[0]", ValueError, [np.ones((1, 1, 1, 1))], [(0, 1, 2, 2)], id="perms[0]=dup"),
])
def test_relayout_weights(arg, error, weights, perms):
    with pytest.raises(error, match=rf"^{re.escape(arg)}(?!\w)"):
        jaxcnn.relayout_weights(weights, perms)


# ---------------------------------------------------------------------------- N = 0
def _primitives(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args)
    return {str(eqn.primitive) for eqn in jaxpr.jaxpr.eqns}


def zeros(shape):
    return jnp.zeros(shape, jnp.float32)


# (op, its arguments with an empty batch, the empty result's shape).
EMPTY_BATCH = [
    pytest.param(lambda x: jaxcnn.max_pool2d(x, 3, 2, padding=1), (zeros((0, 9, 8, 4)),),
                 (0, 5, 4, 4), id="max_pool2d"),
    pytest.param(lambda x: jaxcnn.avg_pool2d(x, 2, layout="CHWN"), (zeros((4, 8, 6, 0)),),
                 (4, 4, 3, 0), id="avg_pool2d_chwn"),
    pytest.param(lambda x: jaxcnn.avg_pool2d(x, 2, layout="NCHW", count_include_pad=False),
                 (zeros((0, 4, 8, 6)),), (0, 4, 4, 3), id="avg_pool2d_nchw"),
    pytest.param(jaxcnn.softmax, (zeros((0, 10)),), (0, 10), id="softmax"),
    pytest.param(lambda x: jaxcnn.log_softmax(x, axis=0), (zeros((0, 10)),), (0, 10),
                 id="log_softmax"),
    pytest.param(jaxcnn.fire, (zeros((0, 8, 8, 16)), zeros((1, 1, 16, 8)), zeros((1, 1, 8, 4)),
                               zeros((3, 3, 8, 6))), (0, 8, 8, 10), id="fire"),
    pytest.param(jaxcnn.inception,
                 (zeros((0, 8, 8, 16)), *(zeros(v.shape) for k, v in INCEPTION.items() if k != "x")),
                 (0, 8, 8, 18), id="inception"),
    pytest.param(lambda x, w: jaxcnn.conv2d_pool(x, w, layout="NCHW"),
                 (zeros((0, 4, 8, 8)), zeros((3, 3, 4, 8))), (0, 8, 4, 4), id="conv2d_pool_nchw"),
    pytest.param(lambda x, w: jaxcnn.sparse_conv2d(x, w, padding="VALID"),
                 (zeros((0, 8, 8, 4)), zeros((3, 3, 4, 8))), (0, 6, 6, 8), id="sparse_conv2d"),
    pytest.param(lambda x, w: jaxcnn.sparse_conv2d(x, w, layout="CHWN"),
                 (zeros((4, 8, 8, 0)), zeros((3, 3, 4, 8))), (8, 8, 8, 0), id="sparse_conv2d_chwn"),
    pytest.param(lambda x, w: jaxcnn.sparse_conv2d_pool(x, w, pool_window=3, pool_stride=2),
                 (zeros((0, 9, 9, 4)), zeros((3, 3, 4, 8))), (0, 4, 4, 8), id="sparse_conv2d_pool"),
    pytest.param(lambda x, w1, wd: jaxcnn.conv1x1_depthwise(x, w1, wd, stride=2),
                 (zeros((0, 9, 8, 16)), zeros((1, 1, 16, 32)), zeros((3, 3, 1, 32))),
                 (0, 5, 4, 32), id="conv1x1_depthwise"),
    pytest.param(jaxcnn.conv3x3_conv1x1,
                 (zeros((0, 8, 8, 16)), zeros((3, 3, 16, 8)), zeros((1, 1, 8, 4))),
                 (0, 8, 8, 4), id="conv3x3_conv1x1"),
    pytest.param(lambda x: jaxcnn.to_layout(x, "NHWC", "CHWN"), (zeros((0, 8, 6, 4)),),
                 (4, 8, 6, 0), id="to_layout"),
]


@pytest.mark.parametrize("op,args,want", EMPTY_BATCH)
def test_empty_batch_gives_the_empty_result_without_a_kernel(op, args, want):
    y = op(*args)
    assert y.shape == want and y.dtype == jnp.float32
    assert not any(p.startswith("jaxcnn") for p in _primitives(op, *args))
    # Gradients of an empty batch are empty too.
    grad = jax.grad(lambda *a: jnp.sum(op(*a)))(*args)
    assert grad.shape == args[0].shape
