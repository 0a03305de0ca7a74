"""Jaxpr patterns `jaxcnn.optimize` replaces by jaxcnn primitives.

Each matcher looks at one anchor equation of a jaxpr (conv_general_dilated, reduce_window_max,
reduce_window_sum, reduce_max) and the equations around it, and returns a `Match`: the equation
indices it replaces, the variable the replacement defines, the input variables and a `build`
function computing the replacement from their values. A match is only made when every value the
pattern computes on the way is used inside the pattern alone, and when jaxcnn accepts the op
(checked with jax.eval_shape on the input avals; a shape/dtype it rejects stays lax).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal, Var

from jaxcnn.ops.conv2d.api import conv2d
from jaxcnn.ops.conv2d.config import HANDLER_ALGORITHM
from jaxcnn.ops.pool2d.api import avg_pool2d, max_pool2d
from jaxcnn.ops.softmax.api import log_softmax, softmax
from jaxcnn.optimize.epilogue_patterns import (
    Epilogue,
    epilogue_operands,
    find_epilogue,
    nonnegative,
    vector_dependencies_ok,
)
from jaxcnn.optimize.jaxpr_reading import call_body, literal_value
from jaxcnn.optimize.pad_patterns import pad_into_max_pool, spatial_pad
from jaxcnn.optimize.weight_prologue import FoldSite

ACTIVATION_LAYOUTS = ("NHWC", "NCHW", "CHWN")
# lax.Precision -> conv2d's precision; HIGH (bf16x3 in XLA) gets the fp32-accurate path, never less.
_PRECISION_NAMES = {"DEFAULT": "default", "HIGH": "highest", "HIGHEST": "highest"}


@dataclass(frozen=True)
class Site:
    """One op `optimize` can replace, as a policy callable sees it.

    op: "conv2d", "max_pool2d", "avg_pool2d", "softmax" or "log_softmax".
    x_shape: the activation's shape in `layout`; w_shape: HWIO (convs only).
    kwargs: the keywords the jaxcnn function is called with (stride, padding, ...).
    """

    op: str
    layout: str | None
    x_shape: tuple[int, ...]
    dtype: str
    w_shape: tuple[int, ...] | None = None
    bias: bool = False
    kwargs: dict = field(default_factory=dict)
    residual: bool = False  # convs: a residual tensor is added before the activation
    folded: bool = False  # convs: per-channel affine steps (e.g. BatchNorm) fold into the weights

    def logical_x_shape(self) -> tuple[int, ...]:
        """The activation's shape in NHWC order (what jaxcnn.layouts' functions take)."""
        if self.layout is None:
            return self.x_shape
        return tuple(self.x_shape[self.layout.index(d)] for d in "NHWC")


@dataclass
class Match:
    op: str
    eqn_indices: tuple[int, ...]  # every equation the replacement stands for
    out_var: Var
    in_vars: tuple[Any, ...]  # Vars (or Literals) the build function takes, in order
    site: Site
    replaced: tuple[str, ...]  # primitive names, for explain()
    build: Callable[..., Any] | None = None  # set once the policy chose an algorithm
    make_build: Callable[[str], Callable[..., Any]] | None = None
    algorithm: str | None = None
    w_to_hwio: tuple[int, ...] | None = None  # conv matches: the weight's axes in HWIO order
    # conv matches: in_vars values -> (x, HWIO weights with the epilogue folded in, bias [K] or
    # None, residual or None), what a fused kernel takes in the conv's place
    operands: Callable[..., tuple] | None = None
    # conv matches: the epilogue is at most a [K] bias and ReLU (in_vars are x, w[, bias]), the
    # form the fused groups of jaxcnn.fusion build from
    plain: bool = True
    decision: Any = None  # the decision owner's Decision (conv sites under policy="auto")
    fold: Any = None  # conv matches whose epilogue folds into the weights: weight_prologue.FoldSite
    # fused groups: the conv matches they fuse, and their build from those convs' folded HWIO
    # weights and biases, (x, w_0, b_0, w_1, b_1, ...) (weight_prologue)
    fold_parts: tuple = ()
    prefolded_build: Callable[..., Any] | None = None
    path: str = ""  # where the match is: the call path of its jaxpr

    def weight_hwio(self, w):
        """A conv match's weight operand (in the user's axis order) as HWIO."""
        perm = self.w_to_hwio
        return w if perm is None or perm == (0, 1, 2, 3) else jnp.transpose(w, perm)


class Uses:
    """Where each variable of one jaxpr is read: equation indices, plus the jaxpr's outputs."""

    def __init__(self, jaxpr):
        self.jaxpr = jaxpr
        self.readers: dict[Var, list[int]] = {}
        self.producer: dict[Var, int] = {}
        for index, eqn in enumerate(jaxpr.eqns):
            for v in eqn.invars:
                if isinstance(v, Var):
                    self.readers.setdefault(v, []).append(index)
            for v in eqn.outvars:
                self.producer[v] = index
        self.outputs = {v for v in jaxpr.outvars if isinstance(v, Var)}
        # Equations an earlier match took: no later match reaches into them.
        self.blocked: set[int] = set()

    def sole_reader(self, var) -> int | None:
        """The one equation reading `var`, when nothing else (no output either) does and no
        earlier match took it."""
        readers = self.readers.get(var, [])
        if var in self.outputs or len(readers) != 1 or readers[0] in self.blocked:
            return None
        return readers[0]

    def defining(self, var):
        index = self.producer.get(var) if isinstance(var, Var) else None
        return None if index is None else (index, self.jaxpr.eqns[index])

    def internal(self, indices, final: Var) -> bool:
        """True when every value the equations `indices` define, but `final`, is read only by them."""
        inside = set(indices)
        for i in inside:
            for v in self.jaxpr.eqns[i].outvars:
                if v is final:
                    continue
                if v in self.outputs or any(r not in inside for r in self.readers.get(v, [])):
                    return False
        return True


def _is_scalar_literal(v, value: float) -> bool:
    if not isinstance(v, Literal):
        return False
    arr = np.asarray(v.val)
    return arr.size == 1 and float(arr.reshape(())) == value


def _inner_jaxpr(eqn):
    """The body of a call-like equation (a Jaxpr), or None."""
    body = call_body(eqn)
    return None if body is None else getattr(body, "jaxpr", body)


def _non_unit(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def is_unit_reshape(eqn) -> bool:
    """True when `eqn` only inserts or removes size-1 axes (a reshape keeping the order and
    extents of every other axis: no data moves). Equinox under vmap wraps each conv and pool in
    such reshapes / squeezes / broadcasts."""
    name = eqn.primitive.name
    if name not in ("reshape", "squeeze", "expand_dims", "broadcast_in_dim") or not isinstance(eqn.invars[0], Var):
        return False
    if name == "reshape" and eqn.params.get("dimensions") is not None:
        return False
    src, dst = tuple(eqn.invars[0].aval.shape), tuple(eqn.outvars[0].aval.shape)
    if name == "broadcast_in_dim" and (len(eqn.invars) != 1 or int(np.prod(src)) != int(np.prod(dst))):
        return False  # a real broadcast (or dynamic shape operands)
    return _non_unit(src) == _non_unit(dst)


def spec_layout(spec) -> str | None:
    """Activation layout of a conv spec (batch, feature, spatial0, spatial1) -> e.g. "NHWC"."""
    letters = [""] * 4
    for letter, axis in zip("NCHW", spec):
        letters[axis] = letter
    layout = "".join(letters)
    return layout if layout in ACTIVATION_LAYOUTS else None


def _precision(value) -> tuple[bool, str | None]:
    """(ok, conv2d precision) for a conv_general_dilated precision param."""
    if value is None:
        return True, None
    pair = value if isinstance(value, tuple) else (value, value)
    names = set()
    for p in pair:
        if p is None:
            names.add("DEFAULT")
        elif isinstance(p, lax.Precision):
            names.add(p.name)
        else:
            return False, None
    if not names <= set(_PRECISION_NAMES):
        return False, None
    return True, ("highest" if any(_PRECISION_NAMES[n] == "highest" for n in names) else "default")


def _accepts(fn, out_aval, *avals) -> bool:
    """jaxcnn accepts these avals and gives the original output's shape and dtype."""
    try:
        out = jax.eval_shape(fn, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals))
    except (ValueError, TypeError):
        return False
    return tuple(out.shape) == tuple(out_aval.shape) and out.dtype == out_aval.dtype


def match_conv(uses: Uses, index: int) -> Match | None:
    """conv_general_dilated + its epilogue (epilogue_patterns: per-channel affine steps such as a
    bias or inference BatchNorm, a residual add, an activation) -> one jaxcnn.conv2d, the affine
    steps folded into its weights and bias on every call; a zero pad of the conv's input alone
    (pad_patterns) joins its padding where conv2d takes the sum."""
    eqn = uses.jaxpr.eqns[index]
    layout = spec_layout(eqn.params["dimension_numbers"].lhs_spec)
    pad = spatial_pad(uses, eqn.invars[0], layout) if layout is not None else None
    if pad is not None and isinstance(pad[1], Var):
        found = _match_conv(uses, index, pad)
        if found is not None:
            return found
    return _match_conv(uses, index, None)


def _match_conv(uses: Uses, index: int, pad) -> Match | None:
    """match_conv, taking in `pad` (spatial_pad's (index, operand, extra padding)) or none."""
    eqn = uses.jaxpr.eqns[index]
    p = eqn.params
    x, w = eqn.invars
    if not (isinstance(x, Var) and isinstance(w, Var)) or x.aval.ndim != 4:
        return None
    if tuple(p["lhs_dilation"]) != (1, 1) or p["batch_group_count"] != 1:
        return None
    if x.aval.dtype != w.aval.dtype:
        return None
    if p["preferred_element_type"] is not None and jnp.dtype(p["preferred_element_type"]) != x.aval.dtype:
        return None
    ok, precision = _precision(p["precision"])
    if not ok:
        return None
    dn = p["dimension_numbers"]
    layout = spec_layout(dn.lhs_spec)
    if layout is None or spec_layout(dn.out_spec) != layout:
        return None
    o_axis, i_axis, r_axis, s_axis = dn.rhs_spec
    to_hwio = (r_axis, s_axis, i_axis, o_axis)
    w_hwio_shape = tuple(w.aval.shape[a] for a in to_hwio)
    conv_out = eqn.outvars[0]
    conv_shape = tuple(conv_out.aval.shape)
    channel_axis, k = layout.index("C"), w_hwio_shape[3]
    padding = tuple(tuple(int(v) for v in q) for q in p["padding"])
    pad_indices, replaced = [], ["conv_general_dilated"]
    if pad is not None:
        pad_index, x, extra = pad
        padding = tuple((a + c, b + d) for (a, b), (c, d) in zip(padding, extra))
        pad_indices, replaced = [pad_index], ["pad", *replaced]

    ep = find_epilogue(uses, conv_out, conv_shape, channel_axis, k, is_unit_reshape)
    if not vector_dependencies_ok(uses, ep, index):
        ep = Epilogue(out=conv_out)
    indices = [*pad_indices, index, *ep.indices]
    out = ep.out
    if not uses.internal(indices, out):
        return None

    kwargs = dict(stride=tuple(p["window_strides"]), padding=padding,
                  dilation=tuple(p["rhs_dilation"]), groups=p["feature_group_count"],
                  activation=ep.activation, layout=layout, precision=precision)
    if ep.activation == "leaky_relu":
        kwargs["alpha"] = ep.alpha
    vectors = ep.vectors
    in_vars = (x, w, *vectors) + ((ep.residual,) if ep.residual is not None else ())
    x_dtype, out_dtype = x.aval.dtype, out.aval.dtype
    identity = to_hwio == (0, 1, 2, 3)

    def operands(x_, w_, *rest):
        """(x, folded HWIO weights, bias, residual) for conv2d from the match's input values."""
        w_hwio = w_ if identity else jnp.transpose(w_, to_hwio)
        values = dict(zip([*vectors, *([ep.residual] if ep.residual is not None else [])], rest))
        return (x_, *epilogue_operands(ep, values, k, w_hwio, x_dtype))

    def make_build(algorithm):
        def build(*vals):
            x_, w_, b_, r_ = operands(*vals)
            # optimize's own decision already weighed XLA: "auto" here is the handler's pick.
            algo = HANDLER_ALGORITHM if algorithm == "auto" else algorithm
            return conv2d(x_, w_, b_, residual=r_, algorithm=algo, **kwargs).astype(out_dtype)
        return build

    if not _accepts(make_build("auto"), out.aval, *(v.aval for v in in_vars)):
        return None
    site = Site("conv2d", layout, tuple(x.aval.shape), jnp.dtype(x_dtype).name, w_hwio_shape,
                bool(ep.steps), kwargs, residual=ep.residual is not None, folded=ep.folds)
    fold = FoldSite(ep, w, to_hwio, w_hwio_shape, x_dtype, out_dtype, kwargs) if ep.folds else None
    return Match("conv2d", tuple(indices), out, in_vars, site, (*replaced, *ep.replaced),
                 make_build=make_build, w_to_hwio=to_hwio, operands=operands,
                 plain=_plain(ep, x_dtype), fold=fold)


def _plain(ep: Epilogue, x_dtype) -> bool:
    """The epilogue is at most a bias vector of x's dtype added, then ReLU (Match.plain)."""
    bias_only = all(isinstance(s.operand, Var) and s.operand.aval.dtype == x_dtype for s in ep.steps)
    return (bias_only and not ep.folds and ep.residual is None and ep.activation in (None, "relu")
            and "convert_element_type" not in ep.replaced)


def _pool_layout(window, strides, padding) -> str | None:
    """NHWC when axes 0 and 3 are untouched, NCHW when axes 0 and 1 are (NHWC first: CHWN pools
    the same axes as NHWC)."""
    def untouched(axis):
        return window[axis] == 1 and strides[axis] == 1 and tuple(padding[axis]) == (0, 0)
    if untouched(0) and untouched(3):
        return "NHWC"
    if untouched(0) and untouched(1):
        return "NCHW"
    return None


def _align_unit_axes(src_shape, dst_shape) -> tuple[int, ...] | None:
    """For dst_shape = src_shape with size-1 axes inserted: the dst axis of each src axis."""
    mapping = []
    for axis, d in enumerate(dst_shape):
        if len(mapping) < len(src_shape) and d == src_shape[len(mapping)]:
            mapping.append(axis)
        elif d != 1:
            return None
    return tuple(mapping) if len(mapping) == len(src_shape) else None


def _widening(eqn) -> bool:
    src, dst = eqn.invars[0], eqn.outvars[0]
    return (isinstance(src, Var) and jnp.issubdtype(src.aval.dtype, jnp.floating)
            and jnp.issubdtype(dst.aval.dtype, jnp.floating)
            and jnp.dtype(dst.aval.dtype).itemsize >= jnp.dtype(src.aval.dtype).itemsize)


@dataclass
class _PoolEnd:
    """A rank-4 value on the layout-only path into (or out of) a reduce_window."""

    var: Any
    indices: tuple[int, ...]  # equations between it and the reduce_window
    perm: tuple[int, ...] | None  # transpose on that path
    div: bool = False  # the path divides by the window size (after the sum)


def _pool_inputs(uses: Uses, x) -> list[_PoolEnd]:
    """The rank-4 values x is a layout-only view of, nearest first: walking back through unit
    reshapes (Equinox under vmap adds a size-1 axis), then one transpose (Equinox pools
    channel-last and transposes back) and widening converts (a bf16 model summing in f32), each
    read by that path alone."""
    found, back, var, perm, converted = [], [], x, None, False
    while True:
        if var.aval.ndim == 4:
            found.append(_PoolEnd(var, tuple(back), perm))
        producer = uses.defining(var)
        if producer is None or uses.sole_reader(var) is None:
            return found
        i, eqn = producer
        name = eqn.primitive.name
        if perm is None and not found and is_unit_reshape(eqn):
            pass
        elif name == "transpose" and perm is None and found and eqn.invars[0].aval.ndim == 4:
            perm = tuple(eqn.params["permutation"])
        elif name == "convert_element_type" and not converted and _widening(eqn):
            converted = True
        else:
            return found
        back.append(i)
        var = eqn.invars[0]


def _pool_outputs(uses: Uses, out, divisor: int | None) -> list[_PoolEnd]:
    """The rank-4 values on the layout-only path out of a reduce_window, nearest first: unit
    reshapes, one transpose, one convert and (sums) one division by `divisor`."""
    found, fwd, var, perm, converted, div = [], [], out, None, False, False
    while True:
        if var.aval.ndim == 4:
            found.append(_PoolEnd(var, tuple(fwd), perm, div))
        reader = uses.sole_reader(var)
        if reader is None:
            return found
        eqn = uses.jaxpr.eqns[reader]
        name = eqn.primitive.name
        if perm is None and is_unit_reshape(eqn):
            pass
        elif name == "transpose" and perm is None and var.aval.ndim == 4:
            perm = tuple(eqn.params["permutation"])
        elif name == "convert_element_type" and not converted:
            converted = True
        elif (name == "div" and divisor is not None and not div and eqn.invars[0] is var
              and literal_value(eqn.invars[1]) == divisor):
            div = True
        else:
            return found
        fwd.append(reader)
        var = eqn.outvars[0]


def match_pool(uses: Uses, index: int) -> Match | None:
    """reduce_window_max -> max_pool2d; reduce_window_sum then a division by the window size ->
    avg_pool2d (count_include_pad=True: lax's sum / size), pooling 2 spatial axes of a rank-4
    NHWC/NCHW value. The reduce_window may see that value through layout-only steps (size-1 axes
    added, a transpose undone after the pool, the f32 converts around a bf16 sum): those steps
    are absorbed and the pool runs on the rank-4 value in its own layout. A max pool also takes
    in a zero pad of a never-negative input (pad_patterns.pad_into_max_pool)."""
    eqn = uses.jaxpr.eqns[index]
    p = eqn.params
    x = eqn.invars[0]
    if not isinstance(x, Var) or x.aval.ndim < 4:
        return None
    if any(d != 1 for d in (*p["base_dilation"], *p["window_dilation"])):
        return None
    pads = tuple(map(tuple, p["padding"]))
    if eqn.primitive.name == "reduce_window_max":
        padded = pad_into_max_pool(uses, x, pads, nonnegative)
        if padded is not None:
            match = _match_pool_on(uses, index, padded[1], padded[2], (padded[0],))
            if match is not None:
                return match
    return _match_pool_on(uses, index, x, pads, ())


def _match_pool_on(uses: Uses, index: int, x, pads, pad_indices) -> Match | None:
    """match_pool for the reduce_window at `index` reading `x` with padding `pads` (per axis of
    x), the equations `pad_indices` (a pad taken in) replaced with it."""
    eqn = uses.jaxpr.eqns[index]
    p = eqn.params
    rank = x.aval.ndim
    win, strides = tuple(p["window_dimensions"]), tuple(p["window_strides"])
    trivial = [win[a] == 1 and strides[a] == 1 and pads[a] == (0, 0) for a in range(rank)]
    if rank > 4 and not all(trivial[a] for a in range(rank) if x.aval.shape[a] == 1):
        return None  # a pooled size-1 axis: which rank-4 axis it is would be ambiguous
    is_max = eqn.primitive.name == "reduce_window_max"
    op, fn = ("max_pool2d", max_pool2d) if is_max else ("avg_pool2d", avg_pool2d)
    inputs = _pool_inputs(uses, x)
    if not inputs:
        return None
    view = inputs[0].var  # x's rank-4 view: x with size-1 axes inserted
    axes = _align_unit_axes(tuple(view.aval.shape), tuple(x.aval.shape))
    if axes is None or not all(trivial[a] for a in range(rank) if a not in axes):
        return None
    outputs = _pool_outputs(uses, eqn.outvars[0], None if is_max else int(np.prod(win)))
    for base in reversed(inputs):  # the furthest source first: absorb the most steps
        # view axis j is base axis perm[j]: the pool's parameters on base's axes
        perm = base.perm or (0, 1, 2, 3)
        on_base = [None] * 4
        for j, a in enumerate(axes):
            on_base[perm[j]] = (win[a], strides[a], pads[a])
        bw, bs, bp = zip(*on_base)
        layout = _pool_layout(bw, bs, bp)
        if layout is None:
            continue
        spatial = (1, 2) if layout == "NHWC" else (2, 3)
        kwargs = dict(window=tuple(bw[a] for a in spatial), stride=tuple(bs[a] for a in spatial),
                      padding=tuple(bp[a] for a in spatial), layout=layout)
        build_fn = functools.partial(fn, **kwargs)
        for end in reversed(outputs):
            undone = end.perm is not None and tuple(perm[q] for q in end.perm) == (0, 1, 2, 3)
            if (base.perm is not None or end.perm is not None) and not undone:
                continue
            if not (is_max or end.div):
                continue
            indices = [*pad_indices, *base.indices, index, *end.indices]
            if not uses.internal(indices, end.var) or not _accepts(build_fn, end.var.aval, base.var.aval):
                continue
            names = ["pad" if i in pad_indices else uses.jaxpr.eqns[i].primitive.name for i in sorted(indices)]
            site = Site(op, layout, tuple(base.var.aval.shape), jnp.dtype(base.var.aval.dtype).name, kwargs=kwargs)
            return Match(op, tuple(sorted(indices)), end.var, (base.var,), site, tuple(names),
                         make_build=lambda algorithm, f=build_fn: f)
    return None


def match_softmax(uses: Uses, index: int) -> Match | None:
    """jax.nn.softmax / log_softmax over one axis (reduce_max, stop_gradient, sub, exp,
    reduce_sum, div or log+sub), with the f32 converts around a bf16/f16 one, -> jaxcnn."""
    eqns = uses.jaxpr.eqns
    eqn = eqns[index]
    x = eqn.invars[0]
    axes = tuple(eqn.params["axes"])
    if not isinstance(x, Var) or len(axes) != 1:
        return None
    axis = axes[0]
    keep = tuple(a for a in range(x.aval.ndim) if a != axis)
    indices = [index]

    def step(var, name, pred=lambda e: True):
        """The equation reading `var` whose primitive is `name` (among var's readers)."""
        for r in uses.readers.get(var, []):
            e = eqns[r]
            if e.primitive.name == name and pred(e):
                indices.append(r)
                return e
        return None

    m = eqn.outvars[0]
    clamp = step(m, "max", lambda e: any(_is_scalar_literal(v, -np.inf) for v in e.invars))
    if clamp is not None:
        m = clamp.outvars[0]
    bcast = step(m, "broadcast_in_dim", lambda e: tuple(e.params["broadcast_dimensions"]) == keep)
    stop = bcast and step(bcast.outvars[0], "stop_gradient")
    sub = stop and step(x, "sub", lambda e: e.invars[1] is stop.outvars[0])
    if not sub:
        return None
    shifted = sub.outvars[0]
    exp = step(shifted, "exp")
    if not exp:
        return None
    # bf16/f16 inputs sum the exponentials in f32 between two converts.
    widen = step(exp.outvars[0], "convert_element_type")
    total = step((widen or exp).outvars[0], "reduce_sum", lambda e: tuple(e.params["axes"]) == axes)
    tb = total and step(total.outvars[0], "broadcast_in_dim",
                        lambda e: tuple(e.params["broadcast_dimensions"]) == keep)
    if not tb:
        return None
    narrow = widen and step(tb.outvars[0], "convert_element_type")
    if widen and not narrow:
        return None
    denom = (narrow or tb).outvars[0]
    div = step(exp.outvars[0], "div", lambda e: e.invars[1] is denom)
    if div is not None:
        op, fn, out, replaced = "softmax", softmax, div.outvars[0], "reduce_max..exp..div"
    else:
        log = step(denom, "log")
        final = log and step(shifted, "sub", lambda e: e.invars[1] is log.outvars[0])
        if not final:
            return None
        op, fn, out, replaced = "log_softmax", log_softmax, final.outvars[0], "reduce_max..exp..log..sub"
    replaced = [replaced]
    found, reader = uses.defining(x), uses.sole_reader(out)
    if found is not None and reader is not None and found[1].primitive.name == "convert_element_type":
        src, back = found[1].invars[0], eqns[reader]
        if (isinstance(src, Var) and back.primitive.name == "convert_element_type"
                and back.outvars[0].aval.dtype == src.aval.dtype
                and uses.internal([found[0], *indices, reader], back.outvars[0])):
            indices = [found[0], *indices, reader]
            x, out = src, back.outvars[0]
            replaced = ["convert_element_type", *replaced, "convert_element_type"]
    if not uses.internal(indices, out):
        return None
    build_fn = functools.partial(fn, axis=int(axis))
    if not _accepts(build_fn, out.aval, x.aval):
        return None
    site = Site(op, None, tuple(x.aval.shape), jnp.dtype(x.aval.dtype).name, kwargs=dict(axis=int(axis)))
    return Match(op, tuple(sorted(indices)), out, (x,), site, tuple(replaced),
                 make_build=lambda algorithm: build_fn)


MATCHERS = {
    "conv_general_dilated": match_conv,
    "reduce_window_max": match_pool,
    "reduce_window_sum": match_pool,
    "reduce_max": match_softmax,
}
