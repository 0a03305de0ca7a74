"""Zero pads of an activation that a conv's or a max pool's own padding takes in.

Keras' ZeroPadding2D (before a stride-2 "valid" conv: ResNet's stem, MobileNet and EfficientNet
downsampling blocks) and an explicit `jnp.pad` trace to a pad equation feeding the conv. In XLA's
own program the pad folds into the convolution; a conv replaced by a jaxcnn kernel would leave it
as a separate pass that reads and writes the whole activation. A conv match therefore takes the
pad in: it reads the unpadded activation with the pad added to its padding. So does a max pool
(ZeroPadding2D before the stem's MaxPooling2D in Keras' ResNet50 and DenseNet) where the padded
value is never below 0 (a ReLU's output): there zeros and the pool's own -inf padding give the
same maxima, as long as every window keeps one real element (jaxcnn's pools require it).
"""

from __future__ import annotations

from jax.extend.core import Literal, Var

from jaxcnn.optimize.jaxpr_reading import call_body


def _producer(jaxpr, var):
    """The equation of `jaxpr` defining `var`, or None."""
    for eqn in jaxpr.eqns:
        if any(out is var for out in eqn.outvars):
            return eqn
    return None


def _zero(jaxpr, v, outer: dict | None = None) -> bool:
    """v is the scalar 0: a literal; inside a call body (`outer` maps its inputs to the caller's
    (jaxpr, value)) also through converts of an input that is the literal 0 in the caller. A
    value the caller computes is refused: the baseline subgraph could not read it."""
    while not isinstance(v, Literal):
        if outer is None:
            return False
        if v in outer:
            return _zero(*outer[v])
        eqn = _producer(jaxpr, v)
        if eqn is None or eqn.primitive.name != "convert_element_type":
            return False
        v = eqn.invars[0]
    return float(v.val) == 0.0


def pad_equation(jaxpr, eqn):
    """(padding_config, padded operand, whether the pad value is 0) of `eqn` in `jaxpr`: a lax
    pad, or a call whose body is one pad of its first input (jnp.pad, as ZeroPadding2D traces
    it); else None."""
    if eqn.primitive.name == "pad":
        return eqn.params["padding_config"], eqn.invars[0], _zero(jaxpr, eqn.invars[1])
    body = call_body(eqn)
    body = getattr(body, "jaxpr", body)
    if body is None or len(eqn.outvars) != 1:
        return None
    pads = [e for e in body.eqns if e.primitive.name == "pad"]
    rest = [e for e in body.eqns if e.primitive.name not in ("pad", "convert_element_type")]
    if len(pads) != 1 or rest or pads[0].invars[0] is not body.invars[0] or body.outvars[0] is not pads[0].outvars[0]:
        return None
    outer = {inner: (jaxpr, v) for inner, v in zip(body.invars, eqn.invars)}
    return pads[0].params["padding_config"], eqn.invars[0], _zero(body, pads[0].invars[1], outer)


def spatial_pad(uses, var, layout: str):
    """(pad equation index, its operand, ((top, bottom), (left, right))) where `var` is a zero
    pad of H and W only (no interior or negative padding) that one equation alone reads; else
    None. `uses`: the patterns.Uses of the jaxpr holding `var`."""
    found = uses.defining(var)
    if found is None or uses.sole_reader(var) is None:
        return None
    index, eqn = found
    pad = pad_equation(uses.jaxpr, eqn)
    if pad is None or not pad[2]:
        return None
    config, operand = pad[0], pad[1]
    pads = {}
    for axis, (lo, hi, interior) in zip(layout, config):
        if interior != 0 or lo < 0 or hi < 0 or (axis in "NC" and (lo, hi) != (0, 0)):
            return None
        pads[axis] = (int(lo), int(hi))
    return index, operand, (pads["H"], pads["W"])


def pad_into_max_pool(uses, x, pads, nonnegative):
    """(pad equation index, its operand, `pads` (the pool's, per axis of x) plus the pad's)
    where `x` is a zero pad, read by the pool alone, of a value `nonnegative(uses, value)` says
    is never below 0; else None."""
    found = uses.defining(x)
    if found is None or uses.sole_reader(x) is None:
        return None
    index, eqn = found
    pad = pad_equation(uses.jaxpr, eqn)
    if pad is None or not pad[2] or not isinstance(pad[1], Var):
        return None
    config, operand = pad[0], pad[1]
    if any(interior != 0 or lo < 0 or hi < 0 for lo, hi, interior in config):
        return None
    if not nonnegative(uses, operand):
        return None
    return index, operand, tuple((a + int(lo), b + int(hi)) for (a, b), (lo, hi, _) in zip(pads, config))
