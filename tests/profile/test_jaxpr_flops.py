"""jaxcnn.profile.jaxpr_flops: conv and matmul FLOPs counted from the jaxpr, in call bodies too."""

import jax
import jax.numpy as jnp

from jaxcnn.profile.jaxpr_flops import function_flops


def test_conv_grouped_conv_and_matmul_in_a_jitted_body():
    x = jnp.ones((2, 8, 8, 6))
    w = jnp.ones((3, 3, 3, 12))  # groups 2: 3 input channels per group
    m = jnp.ones((12, 5))

    @jax.jit
    def inner(x):
        y = jax.lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         feature_group_count=2)
        return jax.nn.relu(y).reshape(-1, 12) @ m

    conv = 2 * (2 * 4 * 4 * 12) * (3 * 3 * 3)
    matmul = 2 * (32 * 5) * 12
    assert function_flops(inner, x) == conv + matmul


def test_elementwise_only_is_zero():
    assert function_flops(lambda a: jnp.tanh(a) * 2, jnp.ones((4, 4))) == 0
