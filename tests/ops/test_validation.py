"""Bad input fails at trace time with an error that names the argument."""

import jax
import jax.numpy as jnp
import pytest

import jaxcnn

X = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32)
W = jax.ShapeDtypeStruct((3, 3, 4, 6), jnp.float32)


def trace(x=X, w=W, bias=None, **kw):
    args = (x, w) if bias is None else (x, w, bias)
    return jax.jit(lambda *a: jaxcnn.conv2d(*a, **kw)).trace(*args)


def sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(x=sds((8, 8, 4))), ValueError, "x must be rank 4"),
        (dict(w=sds((3, 4, 6))), ValueError, "w must be rank 4"),
        (dict(x=sds((2, 8, 8, 4), jnp.int32), w=sds((3, 3, 4, 6), jnp.int32)), TypeError, "x dtype"),
        (dict(x=sds((2, 8, 8, 4), jnp.float16), w=sds((3, 3, 4, 6), jnp.float16),
              bias=sds((6,), jnp.float32)), TypeError, "bias dtype"),
        (dict(w=sds((3, 3, 4, 6), jnp.bfloat16)), TypeError, "w dtype"),
        (dict(bias=sds((6,), jnp.float16)), TypeError, "bias dtype"),
        (dict(bias=sds((5,))), ValueError, "bias must have shape"),
        (dict(w=sds((3, 3, 3, 6))), ValueError, "w input channels"),
        (dict(groups=3, w=sds((3, 3, 1, 6))), ValueError, "x channels .4. must be divisible by groups"),
        (dict(groups=2, w=sds((3, 3, 2, 5))), ValueError, "w output channels"),
        (dict(groups=0), ValueError, "groups must be >= 1"),
        (dict(groups=1.0), TypeError, "groups must be an int"),
        (dict(stride=0), ValueError, "stride must be >= 1"),
        (dict(stride=(1, -2)), ValueError, "stride must be >= 1"),
        (dict(stride="2"), TypeError, "stride must be an int"),
        (dict(dilation=0), ValueError, "dilation must be >= 1"),
        (dict(padding=-1), ValueError, "padding must be >= 0"),
        (dict(padding=((0, -1), (0, 0))), ValueError, r"padding\[0\] must be >= 0"),
        (dict(padding="FULL"), ValueError, "padding must be"),
        (dict(activation="gelu"), ValueError, "activation must be one of"),
        (dict(x=sds((2, 0, 8, 4))), ValueError, "x must not have zero-size"),
        (dict(w=sds((3, 0, 4, 6))), ValueError, "w must not have zero-size"),
        (dict(x=sds((2, 2, 2, 4)), padding="VALID"), ValueError, "does not fit"),
    ],
)
def test_bad_arguments_raise_at_trace_time(kwargs, error, match):
    with pytest.raises(error, match=match):
        trace(**kwargs)


def test_primitive_bind_validates_too():
    """The abstract eval checks operands even when the public wrapper is bypassed."""
    from jaxcnn.ops.conv2d.primitive import Conv2dPrimitive
    from jaxcnn.ops.conv2d.config import make_config

    cfg = make_config((2, 8, 8, 4), (3, 3, 4, 6))
    with pytest.raises(ValueError, match="w input channels"):
        jax.eval_shape(
            lambda x, w: Conv2dPrimitive.outer.bind(x, w, cfg=cfg, operand_names=("x", "w")),
            X, sds((3, 3, 2, 6)),
        )


def test_float64_is_rejected():
    with jax.enable_x64(True):
        with pytest.raises(TypeError, match="x dtype must be one of float32, bfloat16, float16, got float64"):
            trace(x=sds((2, 8, 8, 4), jnp.float64), w=sds((3, 3, 4, 6), jnp.float64))
