"""Running a zoo model with each layer in the layout and algorithm a layout plan chose: a
to_layout only where the layout of the producer differs.

    y = jax.jit(lambda p, x: apply_plan(plan, p, x))(params, x)
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax.numpy as jnp

from jaxcnn import ops
from jaxcnn.models import get_model
from jaxcnn.models.backends import JAXCNN_OPS
from jaxcnn.models.layers import Net
from jaxcnn.ops.conv2d.config import ALGORITHMS
from jaxcnn.tuning.layer import POOL_OPS, Layer
from jaxcnn.tuning.layer_autotune import pool_fn
from jaxcnn.tuning.layout_plan import ChainPlan


def apply_plan(plan: ChainPlan, params: Mapping[str, Any], x: Any, *, model: str | None = None,
               softmax: bool = False):
    """Run zoo model `plan.model` (or `model`) on NHWC images `x` with each layer in the plan's
    layout and algorithm (layers the plan does not name run as in backend "jaxcnn").

    Each op gets its input in its own layout: a to_layout runs only where the layout of the
    producer differs. The NHWC views the model body sees in between are dead code that XLA
    removes, except where the body itself needs NHWC (the flatten before the classifier).
    """
    name = model or plan.model
    if name is None:
        raise ValueError("plan has no model name: pass model=")
    spec = get_model(name)
    table = spec.layers(x.shape[0], x.dtype)
    assignments = plan.assignments()
    layout_ops = LayoutOps(table, assignments, JAXCNN_OPS)
    net = Net(layout_ops.table(), params)
    logits = spec.body(net, x)
    return net.softmax("softmax", logits) if softmax else logits


class LayoutOps:
    """An op table that runs the k-th call as the k-th layer of the table in its planned layout.

    Every 4-D result is handed back to the body as its NHWC view, and the physical array is
    remembered by the view's id, so the next op reads the physical one (transforming only when
    its layout differs)."""

    def __init__(self, table, assignments, base_ops):
        self.layers = list(table)
        self.assign = assignments
        self.base = base_ops
        self.index = 0
        self.physical: dict[int, tuple[Any, Any, str]] = {}  # id(view) -> (view, array, layout)

    def table(self) -> dict[str, Callable]:
        return {op: self._wrap(op) for op in self.base}

    def _in(self, x, layout: str):
        hit = self.physical.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1] if hit[2] == layout else ops.to_layout(hit[1], hit[2], layout)
        return ops.to_layout(x, "NHWC", layout)

    def _out(self, y, layout: str):
        view = y if layout == "NHWC" else ops.to_layout(y, layout, "NHWC")
        self.physical[id(view)] = (view, y, layout)
        return view

    def _wrap(self, op: str) -> Callable:
        def run(*args, **kwargs):
            if self.index >= len(self.layers):
                raise RuntimeError("the model ran more layers than its layer table lists")
            info = self.layers[self.index]
            self.index += 1
            if info.op != op:
                raise RuntimeError(f"layer {self.index - 1} is {info.op!r} in the table, the body ran {op!r}")
            if info.name not in self.assign:
                # Activations are the first argument of conv2d/dense, every argument otherwise
                # (a conv weight is 4-D too and must not be taken for an activation).
                n_act = 1 if op in ("conv2d", "dense") else len(args)
                inputs = [self._in(a, "NHWC") if i < n_act and getattr(a, "ndim", 0) == 4 else a
                          for i, a in enumerate(args)]
                return self.base[op](*inputs, **kwargs)
            layout, algorithm = self.assign[info.name]
            return self._out(self._run(op, layout, algorithm, args, kwargs), layout)

        return run

    def _run(self, op, layout, algorithm, args, kwargs):
        c_axis = layout.index("C")
        if op == "conv2d":
            x, w, b = args
            return ops.conv2d(self._in(x, layout), w, b, layout=layout,
                              algorithm=algorithm if algorithm in ALGORITHMS else "auto", **kwargs)
        if op in POOL_OPS:
            proxy = Layer(op, (1, 1, 1, 1), (1, 1, 1, 1), "float32", window=tuple(kwargs["window"]),
                          stride=tuple(kwargs["stride"]), padding=tuple(map(tuple, kwargs["padding"])))
            return pool_fn(proxy, layout, algorithm)(self._in(args[0], layout))
        if op == "concat":
            return jnp.concatenate([self._in(a, layout) for a in args], axis=c_axis)
        if op == "add":
            a, b = (self._in(v, layout) for v in args)
            y = a + b
            return jnp.maximum(y, 0) if kwargs.get("activation") == "relu" else y
        if op == "relu6":
            return self.base[op](self._in(args[0], layout))
        raise RuntimeError(f"op {op!r} has no layout-aware version")

