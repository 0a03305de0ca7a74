"""A jax primitive with a batch-sharded custom partitioning, TransformerEngine style.

Each op is one subclass holding every rule of the op. Two primitives are made per op:
- the *outer* primitive is what users bind: abstract eval, batching, and a lowering that goes
  through `custom_partitioning`, so a batch-sharded operand stays sharded (no all-gather);
- the *inner* primitive is what each shard runs: its lowering is the lax reference on every
  platform, replaced on CUDA by the FFI custom call when the jaxcnn library is loaded.
Operands may be optional (e.g. bias); `params["operand_names"]` says which are present.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable, ClassVar

from jax._src import dispatch, sharding_impls
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding, PartitionSpec

from jaxcnn import _ffi

STRICT_ENV = "JAXCNN_STRICT"  # "1": lowering for CUDA without the library is an error


class BatchShardedPrimitive:
    """Base class: subclasses set `name` and implement the static rules below."""

    name: ClassVar[str]
    outer: ClassVar[Primitive]
    inner: ClassVar[Primitive]
    # Shardy sharding rule per present-operand tuple, e.g. "n h w c, r s i k -> n p q k".
    sharding_rules: ClassVar[dict[tuple[str, ...], str]]

    # --- rules a subclass implements -------------------------------------------------------
    @staticmethod
    def abstract(*avals, **params):
        raise NotImplementedError

    @staticmethod
    def reference(*args, **params):
        """Pure-lax implementation with the op's exact semantics."""
        raise NotImplementedError

    @classmethod
    def cuda_lowering(cls, ctx, *args, **params):
        """Emits the FFI custom call; only called when the library's handlers are registered."""
        raise NotImplementedError

    @classmethod
    def batcher(cls, batched_args, batch_dims, **params):
        raise NotImplementedError

    # --- shared machinery ------------------------------------------------------------------
    @classmethod
    def _cuda_or_reference(cls, ctx, *args, **params):
        if _ffi.handlers_registered():
            return cls.cuda_lowering(ctx, *args, **params)
        reason = _ffi.library_state().reason
        if os.environ.get(STRICT_ENV) == "1":
            raise RuntimeError(f"{cls.name}: CUDA lowering without the jaxcnn library: {reason}")
        _warn_fallback_once(cls.name, reason)
        return mlir.lower_fun(functools.partial(cls.reference, **params), multiple_results=False)(
            ctx, *args
        )

    @classmethod
    def _partition(cls, params_key, mesh, arg_shapes, result_shape):
        params = dict(params_key)
        batch = _batch_axis(arg_shapes[0])
        arg_shardings = tuple(
            NamedSharding(mesh, PartitionSpec(batch if i == 0 else None, *[None] * (len(a.shape) - 1)))
            for i, a in enumerate(arg_shapes)
        )
        out_sharding = NamedSharding(mesh, PartitionSpec(batch, *[None] * (len(result_shape.shape) - 1)))

        def lower(*args):
            return cls.inner.bind(*args, **params)

        return mesh, lower, out_sharding, arg_shardings

    @classmethod
    def _infer_sharding(cls, params_key, mesh, arg_shapes, result_shape):
        batch = _batch_axis(arg_shapes[0])
        return NamedSharding(mesh, PartitionSpec(batch, *[None] * (len(result_shape.shape) - 1)))

    @classmethod
    @functools.cache
    def _partitioned(cls, operand_names: tuple[str, ...]) -> Callable:
        """The custom-partitioned implementation for one set of present operands."""

        def impl(*args):
            *operands, params_key = args
            return cls.inner.bind(*operands, **dict(params_key))

        partitioned = custom_partitioning(impl, static_argnums=(len(operand_names),))
        rule = cls.sharding_rules[operand_names]
        # Shardy wants special factors in order of first appearance in the rule.
        factors = dict.fromkeys(rule.replace(",", " ").replace("->", " ").split())
        partitioned.def_partition(
            partition=cls._partition,
            infer_sharding_from_operands=cls._infer_sharding,
            sharding_rule=rule,
            need_replication_factors=tuple(f for f in factors if f != "n"),
        )
        return partitioned

    @classmethod
    def _outer_lowering(cls, ctx, *args, **params):
        if _single_device(ctx):
            # One device needs no partitioning (and custom_partitioning would insist on a mesh).
            fun = functools.partial(cls.inner.bind, **params)
        else:
            key = tuple(sorted(params.items()))
            fun = lambda *a: cls._partitioned(params["operand_names"])(*a, key)  # noqa: E731
        return mlir.lower_fun(fun, multiple_results=False)(ctx, *args)

    @classmethod
    def register(cls) -> None:
        cls.outer = Primitive(cls.name)
        cls.inner = Primitive(cls.name + "_shard")
        for prim in (cls.outer, cls.inner):
            prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
            prim.def_abstract_eval(cls.abstract)
        batching.primitive_batchers[cls.outer] = cls.batcher
        # custom_partitioning needs the device assignment while lowering.
        dispatch.prim_requires_devices_during_lowering.add(cls.outer)
        mlir.register_lowering(cls.outer, cls._outer_lowering)
        mlir.register_lowering(
            cls.inner, mlir.lower_fun(cls.reference, multiple_results=False)
        )
        mlir.register_lowering(cls.inner, cls._cuda_or_reference, platform="cuda")


def _single_device(ctx) -> bool:
    context = ctx.module_context.axis_context
    if isinstance(context, sharding_impls.ShardingContext):
        devices = context.device_assignment
        return devices is None or len(devices) <= 1
    return False


def _batch_axis(arg_shape: Any):
    """Mesh axes that shard the leading (batch) dim of an operand, or None."""
    sharding = getattr(arg_shape, "sharding", None)
    spec = getattr(sharding, "spec", None)
    return spec[0] if spec else None


@functools.cache
def _warn_fallback_once(op_name: str, reason: str) -> None:
    warnings.warn(
        f"jaxcnn: {op_name} lowers to the XLA reference on CUDA because the CUDA library is "
        f"unavailable ({reason}); set {STRICT_ENV}=1 to make this an error",
        RuntimeWarning,
        stacklevel=3,
    )
