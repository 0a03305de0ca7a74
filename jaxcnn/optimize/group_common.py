"""What the fused-group finders of jaxcnn.optimize share: the group record (JaxprGroup), the
activation layouts a group may have, and how a group reaches its values through layout-only
views (size-1 axes Equinox adds under vmap) and into call bodies."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from jaxcnn.tuning.fusion_groups import FusionGroup
from jaxcnn.models.layers import LayerInfo
from jaxcnn.ops.conv2d.config import conv2d_flops
from jaxcnn.optimize.patterns import Uses, is_unit_reshape
from jaxcnn.optimize.rewrite import RewritePlan

# inception's convs in jaxcnn.inception's argument order (the zoo's layer roles)
INCEPTION_CONVS = ("1x1", "3x3_reduce", "3x3", "5x5_reduce", "5x5", "pool_proj")
FUSED_LAYOUTS = ("NHWC", "NCHW")  # activation layouts a group may have (the kernels take NHWC)


@dataclass(frozen=True)
class JaxprGroup:
    """A fusable group of a traced function: where it is and its shapes."""

    kind: str
    path: str
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    dtype: str
    # HWIO: squeeze, expand 1x1, expand 3x3 / inception's six convs in INCEPTION_CONVS order /
    # the conv
    weight_shapes: tuple[tuple[int, ...], ...]
    eqn_indices: tuple[int, ...]
    # layout (of every group); conv_pool: the conv's and the pool's keywords, and the conv's
    # output shape
    attrs: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def name(self) -> str:
        return f"{self.path or 'top'}@{self.eqn_indices[-1]}"

    def describe(self) -> str:
        where = f" in {self.path}" if self.path else ""
        ws = ", ".join("x".join(map(str, w)) for w in self.weight_shapes)
        return (f"{self.kind}: x {'x'.join(map(str, self.x_shape))} {self.dtype}, weights {ws} -> "
                f"{'x'.join(map(str, self.y_shape))}{where}")

    def to_group(self) -> FusionGroup:
        """The same group as a zoo-style FusionGroup (synthetic LayerInfos), so the cost
        model and the autotuner treat it like a model's."""
        if self.kind == "conv_pool":
            return self._conv_pool_group()
        if self.kind == "inception":
            return self._inception_group()
        sq_w, e1_w, e3_w = self.weight_shapes
        n, h, w, _ = self.x_shape
        s_shape = (n, h, w, sq_w[3])
        item = np.dtype(self.dtype).itemsize
        conv = self._conv_info

        y1, y3 = (n, h, w, e1_w[3]), (n, h, w, e3_w[3])
        members = (conv("squeeze1x1", self.x_shape, sq_w, s_shape, 0), conv("expand1x1", s_shape, e1_w, y1, 0),
                   conv("expand3x3", s_shape, e3_w, y3, 1),
                   LayerInfo(f"{self.name}/concat", "concat", self.dtype, (y1, y3), self.y_shape,
                             block=self.name, bytes=(math.prod(y1) + math.prod(y3) + math.prod(self.y_shape)) * item))
        return FusionGroup(self.name, "fire", members, self.x_shape, self.y_shape, self.dtype,
                           ("straight", "split", "merge"),
                           dict(squeeze=sq_w[3], expand1x1=e1_w[3], expand3x3=e3_w[3]))

    def _conv_info(self, role, x_shape, w_shape, y_shape, pad) -> LayerInfo:
        """A stride-1 conv + bias + ReLU member of this group (padding `pad` on each side)."""
        moved = (math.prod(x_shape) + math.prod(w_shape) + w_shape[3] + math.prod(y_shape)) * np.dtype(self.dtype).itemsize
        return LayerInfo(f"{self.name}/{role}", "conv2d", self.dtype, (x_shape,), y_shape, w_shape,
                         (w_shape[3],), stride=(1, 1), padding=((pad, pad), (pad, pad)),
                         dilation=(1, 1), groups=1, activation="relu", block=self.name,
                         flops=conv2d_flops(x_shape, w_shape, y_shape), bytes=moved)

    def _inception_group(self) -> FusionGroup:
        """The zoo's GoogLeNet block layers (roles as models.googlenet.inception names them)."""
        n, h, w, _ = self.x_shape
        item = np.dtype(self.dtype).itemsize
        ws = dict(zip(INCEPTION_CONVS, self.weight_shapes))
        ins = {"1x1": self.x_shape, "3x3_reduce": self.x_shape, "5x5_reduce": self.x_shape, "pool_proj": self.x_shape,
               "3x3": (n, h, w, ws["3x3_reduce"][3]), "5x5": (n, h, w, ws["5x5_reduce"][3])}
        members = [self._conv_info(role, ins[role], ws[role], (n, h, w, ws[role][3]), ws[role][0] // 2)
                   for role in INCEPTION_CONVS]
        members.insert(5, LayerInfo(f"{self.name}/pool", "maxpool", self.dtype, (self.x_shape,), self.x_shape,
                                    window=(3, 3), stride=(1, 1), padding=((1, 1), (1, 1)), block=self.name,
                                    flops=math.prod(self.x_shape) * 9, bytes=2 * math.prod(self.x_shape) * item))
        branches = [m.output_shape for m in members if m.name.rsplit("/", 1)[-1] in ("1x1", "3x3", "5x5", "pool_proj")]
        members.append(LayerInfo(f"{self.name}/concat", "concat", self.dtype, tuple(branches), self.y_shape,
                                 block=self.name,
                                 bytes=(sum(map(math.prod, branches)) + math.prod(self.y_shape)) * item))
        filters = tuple(ws[r][3] for r in INCEPTION_CONVS)
        return FusionGroup(self.name, "inception", tuple(members), self.x_shape, self.y_shape, self.dtype,
                           ("split", "merge"), dict(filters=filters))

    def _conv_pool_group(self) -> FusionGroup:
        (w_shape,) = self.weight_shapes
        conv_kw, pool_kw, mid = self.attrs["conv"], self.attrs["pool"], self.attrs["conv_out"]
        item = np.dtype(self.dtype).itemsize
        moved = (math.prod(self.x_shape) + math.prod(w_shape) + w_shape[3] + math.prod(mid)) * item
        conv = LayerInfo(f"{self.name}/conv", "conv2d", self.dtype, (self.x_shape,), mid, w_shape, (w_shape[3],),
                         stride=tuple(conv_kw["stride"]), padding=tuple(map(tuple, conv_kw["padding"])),
                         dilation=tuple(conv_kw["dilation"]), groups=1, activation="relu",
                         flops=conv2d_flops(self.x_shape, w_shape, mid), bytes=moved)
        window = tuple(pool_kw["window"])
        pool = LayerInfo(f"{self.name}/pool", "maxpool", self.dtype, (mid,), self.y_shape,
                         window=window, stride=tuple(pool_kw["stride"]),
                         padding=tuple(map(tuple, pool_kw["padding"])),
                         flops=math.prod(self.y_shape) * math.prod(window),
                         bytes=(math.prod(mid) + math.prod(self.y_shape)) * item)
        return FusionGroup(self.name, "conv_pool", (conv, pool), self.x_shape, self.y_shape, self.dtype,
                           ("straight",))


def nhwc_shape(shape, layout: str) -> tuple[int, ...]:
    return tuple(shape[layout.index(d)] for d in "NHWC")


def as_nhwc_op(layout: str, op: Callable) -> Callable:
    """op(x, *rest) on an NHWC x, taking and returning `layout` (NHWC: op itself). XLA folds the
    transposes of two such ops in a row into nothing."""
    if layout == "NHWC":
        return op
    to_nhwc = tuple(layout.index(d) for d in "NHWC")
    back = tuple("NHWC".index(d) for d in layout)

    def wrapped(x, *rest):
        return jax.numpy.transpose(op(jax.numpy.transpose(x, to_nhwc), *rest), back)
    return wrapped


def view_chain(uses: Uses, var, base) -> list[int] | None:
    """The equations of a chain of unit reshapes leading from `base` to `var`, each value on it
    read by the chain alone ([] when var is base), or None when var is no such view of base."""
    chain = []
    while var is not base:
        found = uses.defining(var)
        if found is None or not is_unit_reshape(found[1]) or uses.sole_reader(var) is None:
            return None
        chain.append(found[0])
        var = found[1].invars[0]
    return chain


def call_bodies(plan: RewritePlan, path: str):
    """(plan of a call body holding a rewrite, its call path) for each such body."""
    for i, child in plan.calls.items():
        eqn = plan.jaxpr.eqns[i]
        name = eqn.params.get("name", "")
        label = f"{eqn.primitive.name}[{name}]" if name else eqn.primitive.name
        yield child, f"{path}/{label}" if path else label


def view_base(uses: Uses, var, exclusive: bool = True) -> tuple[Any, list[int]]:
    """The furthest value of var's shape that `var` is a unit-reshape view of (var itself when
    none), and the view's equations; exclusive: only through values the view alone reads.

    A group reads that value instead of its input: the view is Equinox's per-example axis, and
    behind it the previous group's output, whose transpose back to NCHW then meets this group's
    transpose to NHWC and XLA drops both."""
    best, best_chain, chain = var, [], []
    while not exclusive or uses.sole_reader(var) is not None:
        found = uses.defining(var)
        if found is None or not is_unit_reshape(found[1]):
            break
        chain.append(found[0])
        var = found[1].invars[0]
        if tuple(var.aval.shape) == tuple(best.aval.shape):
            best, best_chain = var, list(chain)
    return best, best_chain


def view_source(uses: Uses, var, sources) -> tuple[Any, list[int]] | None:
    """(the value of `sources` that `var` is a unit-reshape view of, the view's equations), or
    None when there is none or something else reads the view on the way."""
    base = var
    while base not in sources:
        found = uses.defining(base)
        if found is None or not is_unit_reshape(found[1]):
            return None
        base = found[1].invars[0]
    chain = view_chain(uses, var, base)
    return None if chain is None else (base, chain)
