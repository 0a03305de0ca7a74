"""Fusable groups of a zoo model, from its layer table (user functions: jaxcnn.optimize.fused_groups).

Kinds:
  "fire"       SqueezeNet fire module: squeeze 1x1 -> (expand 1x1, expand 3x3) -> concat
               (straight + split + merge, one `jaxcnn.fire` kernel);
  "inception"  GoogLeNet inception block: three 1x1 convs reading x, two branch convs, 3x3/1
               max pool -> 1x1, concat (`jaxcnn.inception`: split fusion of the 1x1s);
  "conv_pool"  a straight conv (+ bias + ReLU) -> max pool outside any block
               (`jaxcnn.conv2d_pool`; only when jaxcnn.ops.conv2d_pool is importable);
  "expand_depthwise"  MobileNetV2 inverted residual's expand 1x1 + ReLU6 -> depthwise 3x3
               (stride 1 or 2) + ReLU6 (straight, one `jaxcnn.conv1x1_depthwise`); the block's
               project conv and residual add stay as they are.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from jaxcnn.models import get_model
from jaxcnn.models.mobilenet import EXPAND_DEPTHWISE_LAYERS

KINDS = ("fire", "inception", "conv_pool", "expand_depthwise")
FIRE_ROLES = ("squeeze1x1", "expand1x1", "expand3x3", "concat")
INCEPTION_ROLES = ("1x1", "3x3_reduce", "3x3", "5x5_reduce", "5x5", "pool", "pool_proj", "concat")
EXPAND_DEPTHWISE_ROLES = EXPAND_DEPTHWISE_LAYERS  # the zoo names them "<block>.<role>"
CONV_POOL_MODULE = "jaxcnn.ops.conv2d_pool"


def conv_pool_available() -> tuple[bool, str]:
    """(True, "") when jaxcnn.ops.conv2d_pool (the straight conv->pool kernel) can be imported,
    else (False, why)."""
    try:
        module = importlib.import_module(CONV_POOL_MODULE)
    except ImportError as err:
        return False, f"{CONV_POOL_MODULE} is not importable ({err})"
    if not callable(getattr(module, "conv2d_pool", None)):
        return False, f"{CONV_POOL_MODULE} has no conv2d_pool function"
    return True, ""


def conv2d_pool_fn() -> Callable:
    """jaxcnn.ops.conv2d_pool.conv2d_pool, imported lazily (another module's primitive)."""
    return importlib.import_module(CONV_POOL_MODULE).conv2d_pool


@dataclass(frozen=True)
class FusionGroup:
    """Layers one fused kernel (or fused composition) may replace.

    members: the zoo LayerInfos in program order (for a jaxpr group: None, see `sites`).
    x_shape/y_shape: the group's NHWC input and output; dtype its activations' dtype."""

    name: str
    kind: str
    members: tuple[Any, ...]
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    dtype: str
    modes: tuple[str, ...]  # "straight", "split", "merge": what the fused version fuses
    attrs: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def member_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    def _short(self, name: str) -> str:
        k = len(self.name)
        return name[k + 1:] if name.startswith(self.name) and name[k:k + 1] in ("/", ".") else name

    def short_members(self) -> str:
        """Member names without the group prefix ("/" or "."): 'squeeze1x1,expand1x1,expand3x3,concat'."""
        return ",".join(self._short(n) for n in self.member_names)

    @property
    def weight_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(m.weight_shape) for m in self.members if m.weight_shape is not None)

    def role(self, role: str):
        """The member whose name ends in /role (None if absent)."""
        for m in self.members:
            if role in (m.name.rsplit("/", 1)[-1], self._short(m.name)):
                return m
        return None

    def cache_fields(self) -> dict[str, Any]:
        """What identifies the group's work for the autotune cache (not its name)."""
        layers = [[m.op, list(m.input_shapes[0]), list(m.weight_shape or ()), list(m.stride or ()),
                   [list(p) for p in (m.padding or ())], list(m.window or ()), m.activation]
                  for m in self.members]
        return dict(kind=self.kind, x=list(self.x_shape), dtype=self.dtype, layers=layers)


def _by_block(table) -> dict[str, list]:
    blocks: dict[str, list] = {}
    for info in table:
        if info.block is not None:
            blocks.setdefault(info.block, []).append(info)
    return blocks


def _roles(members) -> dict[str, Any]:
    return {m.name.rsplit("/", 1)[-1]: m for m in members}


def _is_relu_conv(info, kernel: int | None = None) -> bool:
    if info is None or info.op != "conv2d" or info.activation != "relu" or info.groups != 1:
        return False
    if tuple(info.stride) != (1, 1) or tuple(info.dilation) != (1, 1):
        return False
    r, s = info.weight_shape[:2]
    if kernel is not None and (r, s) != (kernel, kernel):
        return False
    return r == s and r % 2 == 1 and tuple(map(tuple, info.padding)) == ((r // 2, r // 2),) * 2


def _fire_group(name, members) -> FusionGroup | None:
    roles = _roles(members)
    if set(roles) != set(FIRE_ROLES):
        return None
    sq, e1, e3, cat = (roles[r] for r in FIRE_ROLES)
    if not (_is_relu_conv(sq, 1) and _is_relu_conv(e1, 1) and _is_relu_conv(e3, 3)):
        return None
    if sq.input_shape != members[0].input_shape:
        return None
    return FusionGroup(name, "fire", tuple(members), tuple(sq.input_shape), tuple(cat.output_shape),
                       sq.dtype, ("straight", "split", "merge"),
                       dict(squeeze=sq.weight_shape[3], expand1x1=e1.weight_shape[3],
                            expand3x3=e3.weight_shape[3]))


def _inception_group(name, members) -> FusionGroup | None:
    roles = _roles(members)
    if set(roles) != set(INCEPTION_ROLES):
        return None
    convs = [roles[r] for r in ("1x1", "3x3_reduce", "5x5_reduce", "pool_proj")]
    if not all(_is_relu_conv(c, 1) for c in convs):
        return None
    if not (_is_relu_conv(roles["3x3"]) and _is_relu_conv(roles["5x5"])):
        return None
    pool = roles["pool"]
    if (pool.op != "maxpool" or tuple(pool.window) != (3, 3) or tuple(pool.stride) != (1, 1)
            or tuple(map(tuple, pool.padding)) != ((1, 1), (1, 1))):
        return None
    x_shape = tuple(roles["1x1"].input_shape)
    filters = tuple(roles[r].weight_shape[3] for r in ("1x1", "3x3_reduce", "3x3", "5x5_reduce", "5x5", "pool_proj"))
    return FusionGroup(name, "inception", tuple(members), x_shape, tuple(roles["concat"].output_shape),
                       roles["1x1"].dtype, ("split", "merge"), dict(filters=filters))


def _expand_depthwise_group(name, members) -> FusionGroup | None:
    roles = {m.name[len(name) + 1:]: m for m in members if m.name.startswith(name + ".")}
    ex, ex6, dw, dw6 = (roles.get(r) for r in EXPAND_DEPTHWISE_ROLES)
    if None in (ex, ex6, dw, dw6) or not _is_relu_conv(ex, 1) or ex.input_shape != members[0].input_shape:
        return None
    m = ex.weight_shape[3]
    if (dw.op != "conv2d" or dw.activation != "relu" or dw.groups != m or tuple(dw.weight_shape) != (3, 3, 1, m)
            or tuple(dw.stride) not in ((1, 1), (2, 2)) or tuple(dw.dilation) != (1, 1)
            or tuple(map(tuple, dw.padding)) != ((1, 1), (1, 1))):
        return None
    # Each clamp reads the conv before it, the depthwise the first clamp.
    if (ex6.op, dw6.op) != ("relu6", "relu6") or not (ex6.input_shape == ex.output_shape == dw.input_shape
                                                      and dw6.input_shape == dw.output_shape):
        return None
    return FusionGroup(name, "expand_depthwise", (ex, ex6, dw, dw6), tuple(ex.input_shape),
                       tuple(dw6.output_shape), ex.dtype, ("straight",),
                       dict(stride=dw.stride[0], channels=ex.input_shape[3], hidden=m))


def _conv_pool_groups(table) -> list[FusionGroup]:
    """conv (+bias +ReLU) immediately followed by a max pool of its output, both outside
    blocks: in the zoo, layers outside blocks form a chain, so the pool is the conv's only
    consumer."""
    out = []
    for conv, pool in zip(table, table[1:]):
        if conv.block is not None or pool.block is not None:
            continue
        if conv.op != "conv2d" or pool.op != "maxpool" or conv.groups != 1:
            continue
        if conv.activation != "relu" or tuple(pool.input_shape) != tuple(conv.output_shape):
            continue
        out.append(FusionGroup(f"{conv.name}+{pool.name}", "conv_pool", (conv, pool),
                               tuple(conv.input_shape), tuple(pool.output_shape), conv.dtype,
                               ("straight",)))
    return out


def find_groups(model: str, batch: int = 1, dtype: Any = "bfloat16", *,
                kinds: Sequence[str] = KINDS) -> tuple[list[FusionGroup], dict[str, str]]:
    """The fusable groups of zoo model `model` in program order, and {kind: why skipped} for
    requested kinds that cannot be fused here (conv_pool without its module)."""
    kinds = check_kinds(kinds)
    if not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    table = get_model(model).layers(int(batch), dtype)
    skipped = {}
    groups: list[FusionGroup] = []
    for name, members in _by_block(table).items():
        for kind, build in (("fire", _fire_group), ("inception", _inception_group),
                            ("expand_depthwise", _expand_depthwise_group)):
            if kind in kinds:
                group = build(name, members)
                if group is not None:
                    groups.append(group)
    if "conv_pool" in kinds:
        ok, why = conv_pool_available()
        if ok:
            groups.extend(_conv_pool_groups(table))
        else:
            skipped["conv_pool"] = why
    order = {info.name: i for i, info in enumerate(table)}
    groups.sort(key=lambda g: order[g.members[0].name])
    return groups, skipped


def check_kinds(kinds: Any) -> tuple[str, ...]:
    if isinstance(kinds, str) or not isinstance(kinds, Sequence):
        raise TypeError(f"kinds must be a sequence of {KINDS}, got {kinds!r}")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"kinds must be among {KINDS}, got {bad}")
    return tuple(kinds)


def bytes_of(shape: Sequence[int], dtype: str) -> int:
    return int(math.prod(shape)) * np.dtype(dtype).itemsize
