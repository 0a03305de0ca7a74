"""jaxpr lifetimes (jaxcnn.memory.lifetimes): calls inlined, scan/while/cond laid out once per
body, exact steps and sizes on small programs."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from jaxcnn.memory import jaxpr_buffers, live_bytes_lower_bound
from jaxcnn.memory.packing import pack_2d


def _spans(buffers):
    return {b.name: (b.size_bytes, b.start, b.end) for b in buffers}


def _leaf_eqns(jaxpr):
    """Equations the walker gives a step: everything but calls and control flow, recursively."""
    count = 0
    for eqn in jaxpr.eqns:
        params = eqn.params
        if eqn.primitive.name == "scan":
            count += _leaf_eqns(params["jaxpr"].jaxpr)
        elif eqn.primitive.name == "while":
            count += _leaf_eqns(params["cond_jaxpr"].jaxpr) + _leaf_eqns(params["body_jaxpr"].jaxpr)
        elif eqn.primitive.name == "cond":
            count += sum(_leaf_eqns(b.jaxpr) for b in params["branches"])
        elif any(k in params for k in ("jaxpr", "call_jaxpr")):
            sub = params.get("jaxpr", params.get("call_jaxpr"))
            count += _leaf_eqns(getattr(sub, "jaxpr", sub))
        else:
            count += 1
    return count


def test_straight_line_and_outputs_excluded():
    def f(x):
        y = jnp.sin(x)  # step 0
        z = y * 2.0  # step 1
        return z + y, z  # step 2 (output), z is an output too

    spans = _spans(jaxpr_buffers(f, jnp.ones((4, 4))))
    assert spans == {"sin_0": (64, 0, 2)}


def test_scan_body_once_carry_and_stacked_outputs_from_outer_avals():
    def f(x):  # x: f32[4, 8]
        def body(c, xi):
            return c + jnp.sin(xi), c * 2.0

        c, ys = lax.scan(body, x[0], x)
        return ys.sum() + c.sum()

    spans = _spans(jaxpr_buffers(f, jnp.ones((4, 8))))
    assert spans == {
        "slice_0": (32, 0, 1),
        "squeeze_1": (32, 1, 2),  # the initial carry, copied into the loop state at its start
        "scan_2#0": (32, 2, 6),  # loop state (final carry): one f32[8], alive to its last read
        "scan_2#1": (128, 2, 5),  # stacked ys: f32[4, 8] from the outer aval, not 4 buffers
        "sin_2": (32, 2, 3),  # body intermediates: once, over the body's steps 2..4
        "add_3": (32, 3, 4),  # the new carry, copied into the state at the loop's end
        "mul_4": (32, 4, 4),
        "reduce_sum_5": (4, 5, 7),
        "reduce_sum_6": (4, 6, 7),
    }


def test_while_cond_then_body_state_spans_loop():
    def f(x):  # f32[8]
        def body(s):
            i, v = s
            return i + 1, jnp.cos(v) * 2.0

        return lax.while_loop(lambda s: s[0] < 3, body, (0, x))[1].sum()

    spans = _spans(jaxpr_buffers(f, jnp.ones((8,))))
    assert spans == {
        "while_0#0": (4, 0, 3),
        "while_0#1": (32, 0, 4),
        "lt_0": (1, 0, 3),  # the predicate is re-evaluated after each body: alive to the end
        "add_1": (4, 1, 3),
        "cos_2": (32, 2, 3),
        "mul_3": (32, 3, 3),
    }


def test_cond_branches_in_turn_reserve_the_max():
    def f(p, x):  # p: i32[], x: f32[16]
        y = x * 2.0  # step 0
        z = lax.cond(p > 0, lambda a: jnp.sin(a) * 3.0, lambda a: a - 1.0, y)
        return z.sum()

    buffers = jaxpr_buffers(f, jnp.int32(1), jnp.ones((16,)))
    spans = _spans(buffers)
    # gt 1, convert 2, cond at 3: branch 0 (false: sub) at step 3, branch 1 (true: sin, mul) at
    # steps 4-5; the output is defined when the cond starts, the operands live to its end.
    assert spans == {
        "mul_0": (64, 0, 5),
        "gt_1": (1, 1, 2),
        "convert_element_type_2": (4, 2, 5),
        "cond_3": (64, 3, 6),
        "sub_3": (64, 3, 3),
        "sin_4": (64, 4, 5),
        "mul_5": (64, 5, 5),
    }
    # Live bytes: the widest branch (sin + mul beside y, the index and the output), not the sum
    # of both branches' intermediates.
    assert live_bytes_lower_bound(buffers) == 64 + 4 + 64 + 64 + 64
    plan = pack_2d(buffers, alignment=4)
    plan.validate(buffers)
    assert plan.offsets["sub_3"] in (plan.offsets["sin_4"], plan.offsets["mul_5"])


def test_calls_inlined_pjit_checkpoint_custom_jvp_vjp():
    @jax.custom_vjp
    def triple(a):
        return a * 3.0

    triple.defvjp(lambda a: (a * 3.0, None), lambda _, g: (g * 3.0,))

    @jax.jit
    def inner(a):
        return jnp.exp(a) + 1.0

    def f(x):  # f32[8]
        a = inner(x)  # pjit: exp 0, add 1
        b = jax.checkpoint(lambda v: jnp.sin(v) * 2.0)(a)  # remat: sin 2, mul 3
        c = triple(b)  # custom_vjp_call: mul 4
        d = jax.nn.relu(c)  # custom_jvp_call -> pjit -> max 5
        return d.sum()  # reduce_sum 6 (output)

    spans = _spans(jaxpr_buffers(f, jnp.ones((8,))))
    assert spans == {
        "exp_0": (32, 0, 1),
        "add_1": (32, 1, 2),
        "sin_2": (32, 2, 3),
        "mul_3": (32, 3, 4),
        "mul_4": (32, 4, 5),
        "max_5": (32, 5, 6),
    }


def test_nested_control_flow_names_unique_and_steps_consistent():
    def f(x):  # f32[3, 4]
        def outer(c, xi):
            def inner(c2, _):
                return c2 * 2.0, c2 + 1.0

            c2, prods = lax.scan(inner, c, None, length=2)  # first equation of the outer body
            w = lax.cond(c2.sum() > 0, lambda v: jnp.tanh(v), lambda v: v * v, c2)
            k = lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, s[1] + w), (0, w))[1]
            return jax.jit(lambda a, b: a + b)(k + xi, prods.sum(0)), k

        return lax.scan(outer, x[0], x)

    x = jnp.ones((3, 4))
    buffers = jaxpr_buffers(f, x)
    names = [b.name for b in buffers]
    assert len(names) == len(set(names))
    assert any(n.startswith("scan_") and "." in n for n in names)  # nested scan at the same step
    steps = _leaf_eqns(jax.make_jaxpr(f)(x).jaxpr)
    for b in buffers:
        assert 0 <= b.start <= b.end <= steps, b
    # The outer scan's stacked output ys (f32[3, 4]) is an output of f: excluded; its state is too.
    assert all(b.size_bytes <= 3 * 4 * 4 for b in buffers)


@pytest.mark.parametrize("length", [1, 5])
def test_scan_length_does_not_change_lifetimes_except_stacked_sizes(length):
    def f(x):
        def body(c, xi):
            h = jnp.tanh(c * xi)
            return h, h * 2.0

        c, ys = lax.scan(body, jnp.zeros(16), x)
        return ys.sum() + c.sum()

    spans = _spans(jaxpr_buffers(f, jnp.ones((length, 16))))
    ys = [v for k, v in spans.items() if k.endswith("#1")]
    assert ys == [(length * 16 * 4, ys[0][1], ys[0][2])]
    others = {k: v for k, v in spans.items() if not k.endswith("#1")}
    assert {k: v[0] for k, v in others.items() if k != "broadcast_in_dim_0"} == {
        k: 64 for k in others if k != "broadcast_in_dim_0"
    } | {k: 4 for k in others if k.startswith("reduce_sum")}
