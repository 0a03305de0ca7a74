"""What follows a conv in a traced model, read as the conv's epilogue (jaxcnn/ops/epilogue.py):

    conv -> [per-channel affine steps] -> [+ residual] -> [activation]

* Per-channel affine steps: add / sub / mul / div of the conv's value by a per-channel vector
  (a bias, or inference BatchNorm's mean, rsqrt(var + eps) * gamma and beta, in whatever order
  and grouping Keras, Flax linen / nnx and Equinox trace them to) or by a scalar; converts and
  size-1 reshapes between them. They compose into one per-channel `scale` and `shift`, computed
  from the runtime vectors on every call, so the conv runs with weights * scale and bias shift:
  BatchNorm folded into the conv. A vector computed from the conv's own output (training-mode
  BatchNorm's batch statistics) makes that output read twice, so no step is taken.
* A residual: an add of a tensor of the conv output's shape (a ResNet shortcut).
* An activation: the largest unary elementwise subgraph reading the value, recognised by what it
  computes rather than how it is written: it is evaluated on probe points and compared with
  every activation of jaxcnn/ops/epilogue.py (leaky_relu's slope read off the probe).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal, Var

from jaxcnn.ops.epilogue import ACTIVATIONS, apply_activation
from jaxcnn.optimize.jaxpr_reading import call_body, literal_value
from jaxcnn.tuning.measure import outside_traces

# Elementwise primitives an activation subgraph may hold (besides call primitives whose bodies
# hold only these).
_ELEMENTWISE = frozenset((
    "add", "sub", "mul", "div", "max", "min", "neg", "exp", "exp2", "log", "log1p", "expm1", "logistic",
    "tanh", "erf", "erfc", "select_n", "ge", "gt", "lt", "le", "eq", "ne", "convert_element_type",
    "integer_pow", "pow", "sqrt", "rsqrt", "abs", "sign", "clamp", "square", "copy", "copy_p",
    "stop_gradient", "and", "or", "not",
))
_MAX_ACTIVATION_EQNS = 32
# Probe points: both sides of every kink (0, -3, 3, 6) and the tails.
_PROBE = np.array([-12.0, -6.5, -4.0, -3.0, -2.9, -1.7, -1.0, -0.5, -0.125, -1e-3, 0.0, 1e-3, 0.125, 0.5,
                   1.0, 1.7, 2.9, 3.0, 4.0, 5.99, 6.0, 6.01, 6.5, 12.0], np.float32)
_LEAKY_PROBE_X = -1.0


@dataclass(frozen=True)
class AffineStep:
    """value <- value (op) operand, operand a per-channel [K] vector or a scalar.

    op: "add", "sub" (value - operand), "rsub" (operand - value), "mul", "div" (value / operand).
    operand: the jaxpr variable (per-channel) or a Python float (a literal scalar)."""

    op: str
    operand: Any


@dataclass
class Epilogue:
    """The epilogue found after one conv: the equations it stands for and how to rebuild it."""

    steps: list[AffineStep] = field(default_factory=list)
    residual: Any = None  # the residual tensor's variable
    activation: str | None = None
    alpha: float = 0.0
    indices: list[int] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    out: Any = None  # the variable the epilogue defines

    @property
    def vectors(self) -> list:
        """The per-channel operand variables, in step order (each once)."""
        seen = []
        for s in self.steps:
            if isinstance(s.operand, Var) and not any(s.operand is v for v in seen):
                seen.append(s.operand)
        return seen

    @property
    def folds(self) -> bool:
        """True when the steps are more than one bias add (BatchNorm or a scaled bias)."""
        return not (len(self.steps) <= 1 and all(s.op == "add" for s in self.steps))


def fold_affine(steps: list[AffineStep], vector_values: dict, k: int):
    """(scale, shift) in fp32, each [K] (scale None when no step multiplies), such that the steps
    applied to v equal v * scale + shift. `vector_values` maps each operand variable to its
    value."""
    scale = None
    shift = jnp.zeros((k,), jnp.float32)
    for s in steps:
        v = vector_values[s.operand] if isinstance(s.operand, Var) else s.operand
        v = jnp.reshape(jnp.asarray(v, jnp.float32), (-1,)) if not isinstance(v, float) else jnp.float32(v)
        if s.op == "add":
            shift = shift + v
        elif s.op == "sub":
            shift = shift - v
        elif s.op == "rsub":
            scale = -(jnp.ones((k,), jnp.float32) if scale is None else scale)
            shift = v - shift
        elif s.op == "mul":
            scale = (jnp.ones((k,), jnp.float32) if scale is None else scale) * v
            shift = shift * v
        elif s.op == "div":
            scale = (jnp.ones((k,), jnp.float32) if scale is None else scale) / v
            shift = shift / v
        else:  # pragma: no cover - AffineStep ops are produced above
            raise ValueError(f"unknown affine step {s.op!r}")
    if scale is not None:
        scale = jnp.broadcast_to(scale, (k,))
    return scale, jnp.broadcast_to(shift, (k,))


def _per_channel(var, shape: tuple[int, ...], channel_axis: int, k: int) -> bool:
    """`var` broadcasts along every axis of `shape` but the channel axis, where it has K (or 1)
    entries: a [K] vector seen through size-1 axes (jax broadcasts size-1 axes implicitly)."""
    if not isinstance(var, Var):
        return False
    vs = tuple(var.aval.shape)
    if len(vs) == 1:
        return vs[0] == k and shape[channel_axis] == k and channel_axis == len(shape) - 1
    if len(vs) != len(shape):
        return False
    return all(d == 1 for i, d in enumerate(vs) if i != channel_axis) and vs[channel_axis] in (1, k)


def _broadcast_source(uses, var, channel_axis: int, k: int):
    """The per-channel variable a full-shape `var` is a broadcast_in_dim of (its K axis onto the
    channel axis, every other axis of size 1), else None."""
    found = uses.defining(var) if isinstance(var, Var) else None
    if found is None or found[1].primitive.name != "broadcast_in_dim" or len(found[1].invars) != 1:
        return None
    src = found[1].invars[0]
    dims = tuple(found[1].params["broadcast_dimensions"])
    if not isinstance(src, Var) or int(np.prod(src.aval.shape)) not in (1, k):
        return None
    if all(n == 1 or (d == channel_axis and n == k) for n, d in zip(src.aval.shape, dims)):
        return src
    return None


def _unit_reshapes(uses, var, want_shape, is_unit_reshape):
    """Follows `var` through unit reshapes read only by the chain; returns the last variable of
    `want_shape` (var itself when none) and those equations."""
    best, best_chain, chain = var, [], []
    while True:
        reader = uses.sole_reader(var)
        if reader is None or not is_unit_reshape(uses.jaxpr.eqns[reader]):
            return best, best_chain
        chain.append(reader)
        var = uses.jaxpr.eqns[reader].outvars[0]
        if tuple(var.aval.shape) == tuple(want_shape):
            best, best_chain = var, list(chain)


def find_epilogue(uses, out, conv_shape, channel_axis: int, k: int, is_unit_reshape) -> Epilogue:
    """The epilogue reading the conv output `out`, as far as each value is read by the next step
    alone. Converts and unit reshapes between steps are taken with the step after them."""
    ep = Epilogue(out=out)
    eqns = uses.jaxpr.eqns
    pending: list[int] = []  # converts / unit reshapes after the last committed step

    def look_ahead(var):
        """var after the converts and unit reshapes that alone read it, and those equations."""
        taken = []
        while True:
            var, more = _unit_reshapes(uses, var, conv_shape, is_unit_reshape)
            taken += more
            reader = uses.sole_reader(var)
            if (reader is None or eqns[reader].primitive.name != "convert_element_type"
                    or not jnp.issubdtype(eqns[reader].outvars[0].aval.dtype, jnp.floating)):
                return var, taken
            taken.append(reader)
            var = eqns[reader].outvars[0]

    def commit(indices, label, new_out):
        ep.indices.extend([*pending, *indices])
        ep.replaced.extend([*(eqns[i].primitive.name for i in pending), label])
        pending.clear()
        ep.out = new_out

    var, more = look_ahead(out)
    pending += more
    # The state after each affine step (and before the first): an activation written with
    # scalar steps of its own (1 / (1 + exp(-y))) is found by undoing trailing scalar steps.
    checkpoints = [(0, 0, 0, ep.out, var, list(pending))]
    while True:
        reader = uses.sole_reader(var)
        if reader is None:
            break
        eqn = eqns[reader]
        name = eqn.primitive.name
        if name == "neg":
            ep.steps.append(AffineStep("mul", -1.0))
            commit([reader], "neg", eqn.outvars[0])
            var, more = look_ahead(eqn.outvars[0])
            pending += more
            checkpoints.append((len(ep.steps), len(ep.indices), len(ep.replaced), ep.out, var, list(pending)))
            continue
        if (name not in ("add", "sub", "mul", "div") or len(eqn.invars) != 2 or eqn.invars[0] is eqn.invars[1]
                or tuple(eqn.outvars[0].aval.shape) != tuple(conv_shape)):
            break
        a, b = eqn.invars
        other, value_first = (b, True) if a is var else (a, False)
        step = _affine_step(uses, name, other, value_first, conv_shape, channel_axis, k)
        if step is None:
            break
        ep.steps.append(step)
        commit([reader], f"{name}(per-channel)", eqn.outvars[0])
        var, more = look_ahead(eqn.outvars[0])
        pending += more
        checkpoints.append((len(ep.steps), len(ep.indices), len(ep.replaced), ep.out, var, list(pending)))
    # A residual: an add of a full tensor of the conv's shape.
    reader = uses.sole_reader(var)
    if reader is not None and eqns[reader].primitive.name == "add":
        add = eqns[reader]
        a, b = add.invars
        other = b if a is var else a
        if (a is not b and isinstance(other, Var) and tuple(other.aval.shape) == tuple(conv_shape)
                and tuple(add.outvars[0].aval.shape) == tuple(conv_shape)
                and jnp.issubdtype(other.aval.dtype, jnp.floating)):
            ep.residual = other
            commit([reader], "add(residual)", add.outvars[0])
            var, more = look_ahead(add.outvars[0])
            pending += more
    act = match_activation(uses, var)
    if act is None and ep.residual is None:
        for n_steps, n_indices, n_replaced, cp_out, cp_var, cp_pending in reversed(checkpoints[:-1]):
            if not all(isinstance(st.operand, float) for st in ep.steps[n_steps:]):
                break  # a per-channel step cannot be part of an activation
            act = match_activation(uses, cp_var)
            if act is not None:
                del ep.steps[n_steps:], ep.indices[n_indices:], ep.replaced[n_replaced:]
                ep.out, var, pending[:] = cp_out, cp_var, cp_pending
                break
    if act is not None:
        ep.activation, ep.alpha, indices, act_out, label = act
        commit(indices, label, act_out)
        var, more = look_ahead(act_out)
        pending += more
    # Converts back to the model's dtype at the very end belong to the epilogue too.
    if pending and ep.indices:
        commit([], "", var)
        ep.replaced.pop()
    return ep


def _affine_step(uses, name, other, value_first: bool, conv_shape, channel_axis, k):
    """The AffineStep for `value (name) other` (value_first) or `other (name) value`; None when
    `other` is neither a scalar literal nor per-channel. The vector is read as it is (its
    broadcasts stay in the program; jit drops them once nothing reads them)."""
    scalar = literal_value(other)
    if scalar is not None:
        operand = scalar
    elif _per_channel(other, conv_shape, channel_axis, k):
        operand = other
    else:
        operand = _broadcast_source(uses, other, channel_axis, k)
        if operand is None:
            return None
    if name in ("add", "mul"):
        return AffineStep(name, operand)
    if name == "sub":
        return AffineStep("sub" if value_first else "rsub", operand)
    if name == "div" and value_first:
        return AffineStep("div", operand)
    return None


# -------------------------------------------------------------------------------- activation


def _elementwise_eqn(eqn) -> bool:
    if eqn.primitive.name in _ELEMENTWISE:
        return True
    if eqn.primitive.name == "broadcast_in_dim":
        return all(isinstance(v, Literal) or v.aval.ndim == 0 for v in eqn.invars)
    body = call_body(eqn)
    if body is None:
        return False
    jaxpr = getattr(body, "jaxpr", body)
    return all(_elementwise_eqn(e) for e in jaxpr.eqns)


def _eval_eqns(eqns, env: dict):
    """Evaluates elementwise equations on 1-D probe values (scalars broadcast to the probe)."""
    def read(v):
        if isinstance(v, Literal):
            return jnp.asarray(v.val)
        return env[v]

    for eqn in eqns:
        vals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name == "broadcast_in_dim":
            outs = [vals[0]]
        elif call_body(eqn) is not None:
            body = call_body(eqn)
            jaxpr = getattr(body, "jaxpr", body)
            inner = dict(zip(jaxpr.constvars, getattr(body, "consts", ())))
            inner.update(zip(jaxpr.invars, vals[len(vals) - len(jaxpr.invars):]))
            _eval_eqns(jaxpr.eqns, inner)
            outs = [inner[v] if not isinstance(v, Literal) else jnp.asarray(v.val) for v in jaxpr.outvars]
        else:
            n = max((np.size(x) for x in vals), default=1)
            vals = [jnp.broadcast_to(jnp.asarray(x, x.dtype), (n,)) for x in vals]
            params = dict(eqn.params)
            out = eqn.primitive.bind(*vals, **params)
            outs = out if eqn.primitive.multiple_results else [out]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return env


def match_activation(uses, var):
    """(activation, alpha, equation indices, output variable, label) for the largest unary
    elementwise subgraph reading `var` that computes one of epilogue.ACTIVATIONS, else None."""
    eqns = uses.jaxpr.eqns
    region: list[int] = []
    derived = {var}
    frontier = sorted(uses.readers.get(var, []))
    if var in uses.outputs or not frontier:
        return None
    start = frontier[0]
    best = None
    for i in range(start, min(len(eqns), start + 4 * _MAX_ACTIVATION_EQNS)):
        eqn = eqns[i]
        reads_region = any(isinstance(v, Var) and v in derived for v in eqn.invars)
        if not reads_region:
            continue
        others_const = all(isinstance(v, Literal) or v in derived for v in eqn.invars)
        if not others_const or not _elementwise_eqn(eqn) or len(eqn.outvars) != 1:
            break
        if tuple(eqn.outvars[0].aval.shape) not in (tuple(var.aval.shape), ()):
            break
        region.append(i)
        derived.add(eqn.outvars[0])
        if len(region) > _MAX_ACTIVATION_EQNS:
            break
        out = eqn.outvars[0]
        if tuple(out.aval.shape) != tuple(var.aval.shape) or not uses.internal(region, out):
            continue
        # Every value var derives must be inside the region (var itself read only by it).
        if any(r not in region for r in uses.readers.get(var, [])):
            continue
        found = _identify([eqns[j] for j in region], var, out)
        if found is not None:
            best = (found[0], found[1], list(region), out, f"{found[0]}({'+'.join(_names(eqns, region))})")
    return best


# Activations whose outputs are never below 0.
NONNEGATIVE_ACTIVATIONS = ("relu", "relu6", "sigmoid")


def nonnegative(uses, var) -> bool:
    """`var` is the output of an activation in NONNEGATIVE_ACTIVATIONS (one equation or call,
    recognised by what it computes; dtype converts after it followed): no element is below 0."""
    while True:
        found = uses.defining(var)
        if found is None:
            return False
        eqn = found[1]
        if eqn.primitive.name != "convert_element_type":
            break
        var = eqn.invars[0]
    inputs = [v for v in eqn.invars if isinstance(v, Var)]
    if len(inputs) != 1 or len(eqn.outvars) != 1 or not _elementwise_eqn(eqn):
        return False
    if tuple(inputs[0].aval.shape) != tuple(eqn.outvars[0].aval.shape):
        return False
    found = _identify([eqn], inputs[0], eqn.outvars[0])
    return found is not None and found[0] in NONNEGATIVE_ACTIVATIONS


def _names(eqns, region):
    out = []
    for j in region:
        e = eqns[j]
        name = e.params.get("name") if call_body(e) is not None else None
        out.append(f"{e.primitive.name}[{name}]" if name else e.primitive.name)
    return out


def _identify(region_eqns, var, out):
    """_identify_now, evaluated for real even while an enclosing jit / vmap / grad traces the
    program (in a fresh thread: JAX's trace state is per thread)."""
    return outside_traces(_identify_now)(region_eqns, var, out)


def _identify_now(region_eqns, var, out):
    """Which activation the region computes from `var` to `out`, checked on the probe points in
    fp32 (the region's own dtype casts are followed; the tolerance is that dtype's precision)."""
    dtype = jnp.dtype(var.aval.dtype)
    probe = jnp.asarray(_PROBE).astype(dtype)
    try:
        env = _eval_eqns(region_eqns, {var: probe})
    except Exception:  # an equation that does not evaluate on a 1-D probe: not an activation
        return None
    got = np.asarray(jnp.broadcast_to(env[out], probe.shape).astype(jnp.float32))
    if not np.all(np.isfinite(got)):
        return None
    x = np.asarray(probe.astype(jnp.float32))
    eps = float(jnp.finfo(dtype).eps) if jnp.issubdtype(dtype, jnp.floating) else 1e-6
    tol = 4 * eps * np.maximum(1.0, np.abs(x))
    alpha_probe = float(got[np.argmin(np.abs(x - _LEAKY_PROBE_X))] / _LEAKY_PROBE_X)
    for name in ACTIVATIONS:
        if name is None:
            continue
        alpha = alpha_probe if name == "leaky_relu" else 0.0
        if name == "leaky_relu" and not 0.0 < alpha < 1.0:
            continue
        want = np.asarray(apply_activation(jnp.asarray(x), name, alpha))
        if np.all(np.abs(got - want) <= tol):
            return name, alpha
    return None


def epilogue_operands(ep: Epilogue, values: dict, k: int, w_hwio, x_dtype):
    """(weights, bias, residual) for jaxcnn.conv2d from the epilogue's runtime values: the affine
    steps folded into the HWIO weights' output channels and a bias."""
    scale, shift = fold_affine(ep.steps, values, k)
    if scale is not None:
        w_hwio = (w_hwio.astype(jnp.float32) * scale).astype(x_dtype)
    bias = shift.astype(x_dtype) if ep.steps else None
    residual = values[ep.residual].astype(x_dtype) if ep.residual is not None else None
    return w_hwio, bias, residual


def vector_dependencies_ok(uses, ep: Epilogue, conv_index: int) -> bool:
    """True when no per-channel operand or residual is computed from the conv's own output
    (training-mode BatchNorm's batch statistics; a residual of the conv itself)."""
    conv_out = uses.jaxpr.eqns[conv_index].outvars[0]
    targets = [*ep.vectors] + ([ep.residual] if ep.residual is not None else [])
    for t in targets:
        stack, seen = [t], set()
        while stack:
            v = stack.pop()
            if v is conv_out:
                return False
            if not isinstance(v, Var) or id(v) in seen:
                continue
            seen.add(id(v))
            found = uses.defining(v)
            if found is not None:
                stack.extend(u for u in found[1].invars if isinstance(u, Var))
    return True
