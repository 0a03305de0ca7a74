"""A jax primitive with a batch-sharded custom partitioning, TransformerEngine style.

Each op is one subclass holding every rule of the op. Two primitives are made per op:
- the *outer* primitive is what users bind: abstract eval, batching, and a lowering that goes
  through `custom_partitioning`, so a batch-sharded operand stays sharded (no all-gather);
- the *inner* primitive is what each shard runs: its lowering is the lax reference on every
  platform, replaced on CUDA by the FFI custom call when the jaxcnn library is loaded.
Operands may be optional (e.g. bias); `params["operand_names"]` says which are present.
The batch dimension need not lead (a CHWN tensor has it last): `batch_axes(params)` says where
it is in each operand and in the result.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
from jax._src import dispatch, sharding_impls
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding, PartitionSpec

from jaxcnn._native import library

STRICT_ENV = "JAXCNN_STRICT"  # "1": lowering for CUDA without the library is an error


class BatchShardedPrimitive:
    """Base class: subclasses set `name` and implement the static rules below."""

    name: ClassVar[str]
    outer: ClassVar[Primitive]
    inner: ClassVar[Primitive]
    # Shardy sharding rule per present-operand tuple, e.g. "n h w c, r s i k -> n p q k";
    # the batch factor is always named "n". Ops whose rule depends on params override
    # sharding_rule() instead.
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

    @classmethod
    def batch_axes(cls, params) -> tuple[tuple[int | None, ...], int]:
        """Batch axis of each present operand (None: not batched, e.g. weights) and of the
        result. Default: the first operand's and the result's leading axis."""
        n = len(params["operand_names"])
        return (0,) + (None,) * (n - 1), 0

    @classmethod
    def sharding_rule(cls, params) -> str:
        return cls.sharding_rules[params["operand_names"]]

    # --- shared machinery ------------------------------------------------------------------
    @classmethod
    def _cuda_or_reference(cls, ctx, *args, **params):
        if library.handlers_registered():
            return cls.cuda_lowering(ctx, *args, **params)
        allow_reference_fallback(cls.name, library.library_state().reason)
        return cls.reference_lowering(ctx, *args, **params)

    @classmethod
    def reference_lowering(cls, ctx, *args, **params):
        """The lax reference as this op's lowering."""
        return mlir.lower_fun(functools.partial(cls.reference, **params), multiple_results=False)(
            ctx, *args
        )

    @classmethod
    def kernel_or_reference(cls, ctx, args, params, target: str, runs_kernel: bool, **attributes):
        """The FFI custom call `target` (with `attributes`) where the op's kernel runs these
        shapes and the loaded library has its handler, else the reference. A missing handler
        alone (a library built before the op) follows the no-library policy: a warning, or an
        error under JAXCNN_STRICT."""
        if runs_kernel and library.target_registered(target):
            return jax.ffi.ffi_lowering(target)(ctx, *args, **attributes)
        if runs_kernel:
            allow_reference_fallback(cls.name, library.missing_target_reason(target))
        return cls.reference_lowering(ctx, *args, **params)

    @classmethod
    def _mesh_batch_axis(cls, params, arg_shapes):
        """Mesh axes sharding the batch dim of the first batched operand, or None."""
        operand_axes, _ = cls.batch_axes(params)
        for shape, axis in zip(arg_shapes, operand_axes):
            if axis is not None:
                return _spec_entry(shape, axis)
        return None

    @classmethod
    def _partition(cls, params_key, mesh, arg_shapes, result_shape):
        params = dict(params_key)
        batch = cls._mesh_batch_axis(params, arg_shapes)
        operand_axes, out_axis = cls.batch_axes(params)
        arg_shardings = tuple(
            NamedSharding(mesh, _batch_spec(len(a.shape), axis, batch))
            for a, axis in zip(arg_shapes, operand_axes)
        )
        out_sharding = NamedSharding(mesh, _batch_spec(len(result_shape.shape), out_axis, batch))

        def lower(*args):
            return cls.inner.bind(*args, **params)

        return mesh, lower, out_sharding, arg_shardings

    @classmethod
    def _infer_sharding(cls, params_key, mesh, arg_shapes, result_shape):
        params = dict(params_key)
        batch = cls._mesh_batch_axis(params, arg_shapes)
        _, out_axis = cls.batch_axes(params)
        return NamedSharding(mesh, _batch_spec(len(result_shape.shape), out_axis, batch))

    @classmethod
    @functools.cache
    def _partitioned(cls, num_operands: int, rule: str) -> Callable:
        """The custom-partitioned implementation for one operand count and sharding rule."""

        def impl(*args):
            *operands, params_key = args
            return cls.inner.bind(*operands, **dict(params_key))

        partitioned = custom_partitioning(impl, static_argnums=(num_operands,))
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
    def _abstract_with_sharding(cls, *avals, **params):
        """The result aval carries the batch operand's batch sharding: under an Explicit mesh
        a sharding-less result would read as replicated, and the ops after it (a reshape, a
        dot) would all-gather the batch."""
        out = cls.abstract(*avals, **params)
        operand_axes, out_axis = cls.batch_axes(params)
        entry = cls._mesh_batch_axis(params, avals)
        if entry is None or out_axis is None:
            return out
        mesh = next(a.sharding.mesh for a, axis in zip(avals, operand_axes) if axis is not None)
        return out.update(sharding=NamedSharding(mesh, _batch_spec(out.ndim, out_axis, entry)))

    @classmethod
    def _outer_lowering(cls, ctx, *args, **params):
        if _single_device(ctx):
            # One device needs no partitioning (and custom_partitioning would insist on a mesh).
            fun = functools.partial(cls.inner.bind, **params)
        else:
            key = tuple(sorted(params.items()))
            partitioned = cls._partitioned(len(params["operand_names"]), cls.sharding_rule(params))
            fun = lambda *a: partitioned(*a, key)  # noqa: E731
        return mlir.lower_fun(fun, multiple_results=False)(ctx, *args)

    @classmethod
    @functools.cache
    def _with_reference_vjp(cls, operand_names: tuple[str, ...]) -> Callable:
        """`call(cfg, *operands)` binding the outer primitive, with the reference's gradients."""

        @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
        def call(cfg, *operands):
            return cls.outer.bind(*operands, cfg=cfg, operand_names=operand_names)

        def call_fwd(cfg, *operands):
            return call(cfg, *operands), operands

        def call_bwd(cfg, operands, g):
            # Backward is unfused: XLA's transposes of the reference (it recomputes what the
            # kernel kept on chip).
            reference = functools.partial(cls.reference, cfg=cfg, operand_names=operand_names)
            _, vjp = jax.vjp(reference, *operands)
            return vjp(g)

        call.defvjp(call_fwd, call_bwd)
        return call

    @classmethod
    def bind_with_reference_vjp(cls, cfg, operands, operand_names: tuple[str, ...]):
        """The outer primitive on `operands`, differentiated as its lax reference."""
        return cls._with_reference_vjp(operand_names)(cfg, *operands)

    @classmethod
    def register(cls) -> None:
        cls.outer = Primitive(cls.name)
        cls.inner = Primitive(cls.name + "_shard")
        for prim in (cls.outer, cls.inner):
            prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
        cls.outer.def_abstract_eval(cls._abstract_with_sharding)
        cls.inner.def_abstract_eval(cls.abstract)
        batching.primitive_batchers[cls.outer] = cls.batcher
        # custom_partitioning needs the device assignment while lowering.
        dispatch.prim_requires_devices_during_lowering.add(cls.outer)
        mlir.register_lowering(cls.outer, cls._outer_lowering)
        mlir.register_lowering(
            cls.inner, mlir.lower_fun(cls.reference, multiple_results=False)
        )
        mlir.register_lowering(cls.inner, cls._cuda_or_reference, platform="cuda")


class LeadingBatchPrimitive(BatchShardedPrimitive):
    """An op whose first operand is the activation with its batch axis leading (NHWC) and
    whose other operands are weights and biases."""

    @classmethod
    def batcher(cls, batched_args, batch_dims, **params):
        x, *weights = batched_args
        xd, *wds = batch_dims
        if all(d is None for d in wds):
            # vmap over x alone folds into N: one launch for all of it.
            x = jnp.moveaxis(x, xd, 0)
            v, n = x.shape[:2]
            y = cls.outer.bind(x.reshape(v * n, *x.shape[2:]), *weights, **params)
            return y.reshape(v, n, *y.shape[1:]), 0
        # Batched weights: one launch per vmapped slice (lax.map); unbatched operands are
        # shared by all slices.
        mapped = [i for i, d in enumerate(batch_dims) if d is not None]
        slices = [jnp.moveaxis(batched_args[i], batch_dims[i], 0) for i in mapped]

        def one(sliced):
            operands = list(batched_args)
            for i, a in zip(mapped, sliced):
                operands[i] = a
            return cls.outer.bind(*operands, **params)

        return jax.lax.map(one, slices), 0


def multiple_result_primitive(name: str, abstract, reference, cuda_lowering, batcher) -> Primitive:
    """A plain multiple-result primitive (the batched weight ops): eager via XLA, the lax
    reference lowering everywhere but CUDA, `cuda_lowering` there, and `batcher` for vmap."""
    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    prim.def_abstract_eval(abstract)
    mlir.register_lowering(prim, mlir.lower_fun(reference, multiple_results=True))
    mlir.register_lowering(prim, cuda_lowering, platform="cuda")
    batching.primitive_batchers[prim] = batcher
    return prim


def _single_device(ctx) -> bool:
    context = ctx.module_context.axis_context
    if isinstance(context, sharding_impls.ShardingContext):
        devices = context.device_assignment
        return devices is None or len(devices) <= 1
    return False


def _spec_entry(arg_shape: Any, axis: int):
    """Mesh axes that shard dim `axis` of an operand, or None."""
    sharding = getattr(arg_shape, "sharding", None)
    spec = getattr(sharding, "spec", None)
    return spec[axis] if spec is not None and len(spec) > axis else None


def _batch_spec(rank: int, axis: int | None, mesh_axes) -> PartitionSpec:
    """Sharded on `mesh_axes` along `axis` (if any), replicated elsewhere."""
    entries = [None] * rank
    if axis is not None:
        entries[axis] = mesh_axes
    return PartitionSpec(*entries)


def allow_reference_fallback(op_name: str, reason: str) -> None:
    """Before a CUDA lowering falls back to the lax reference: an error under JAXCNN_STRICT=1,
    else a warning (once per op and reason)."""
    if os.environ.get(STRICT_ENV) == "1":
        raise RuntimeError(f"{op_name}: CUDA lowering without the jaxcnn library: {reason}")
    _warn_fallback_once(op_name, reason)


@functools.cache
def _warn_fallback_once(op_name: str, reason: str) -> None:
    warnings.warn(
        f"jaxcnn: {op_name} lowers to the XLA reference on CUDA because the CUDA library is "
        f"unavailable ({reason}); set {STRICT_ENV}=1 to make this an error",
        RuntimeWarning,
        stacklevel=3,
    )
