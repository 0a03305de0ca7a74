"""Autotuning one layer: every candidate (layout, algorithm) of a conv or a pool, XLA's own
version and the layout transforms around it, timed on the device and cached (where jaxcnn's
CUDA kernels run) or estimated by the layout cost model (jaxcnn.costmodel.layout_cost)
elsewhere; every result labelled with its source ("measured" or "model").

Measured times are device times of `iters` calls of each case in one profiler trace
(tuning.case_timing), cached per GPU kind in the autotune cache (tuning.autotune_cache).
Candidates run outside any enclosing jit trace (tuning.measure.outside_traces).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcnn import ops
from jaxcnn.ops.conv2d.config import ALGORITHMS
from jaxcnn.ops.layout_axes import LAYOUTS, check_layout, convert_shape, permutation
from jaxcnn.costmodel.layout_cost import activation_bytes, conv_candidate_ms, relayout_ms, xla_conv_ms
from jaxcnn.costmodel.roofline import memory_ms
from jaxcnn.profile.gpu_specs import GpuSpec
from jaxcnn.tuning import case_timing
from jaxcnn.tuning import measure as measuring
from jaxcnn.tuning.autotune_cache import AutotuneCache, as_cache, created_now
from jaxcnn.tuning.layer import Layer, conv_layer, pool_layer
from jaxcnn.tuning.layer_choice import CandidateResult, ConvChoice, PoolChoice
from jaxcnn.tuning.layout_rules import RuleChoice, rule_conv_layer, rule_pool
from jaxcnn.tuning.tuner_args import Shape, check_cache_and_gpu, check_iters, dtype_name, resolve_spec, shape4

# Inputs held at once while timing transforms (see autotune_transforms).
TRANSFORM_BATCH_BYTES = 4 << 30
POOL_ALGORITHMS = ("jaxcnn", "xla")  # our pooling kernel, lax.reduce_window


# --------------------------------------------------------------------------- candidates


def default_conv_candidates(layer: Layer) -> list[tuple[str, str]]:
    """(layout, algorithm) pairs worth timing for a conv: tensor cores in NHWC, the direct kernel
    in every layout, the depthwise kernel in every layout where it applies, and XLA's own conv
    in NHWC (so a plan is never slower than XLA on a layer where cuDNN wins)."""
    if layer.is_depthwise:
        return [(lay, "depthwise") for lay in LAYOUTS] + [("NHWC", "direct"), ("NHWC", "xla")]
    return [("NHWC", "tensor_core")] + [(lay, "direct") for lay in LAYOUTS] + [("NHWC", "xla")]


def _check_candidates(candidates: Any) -> list[tuple[str, str]]:
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise TypeError(f"candidates must be a list of (layout, algorithm) pairs, got {candidates!r}")
    out = []
    for item in candidates:
        if not isinstance(item, Sequence) or isinstance(item, str) or len(item) != 2:
            raise TypeError(f"candidates must hold (layout, algorithm) pairs, got {item!r}")
        layout, algorithm = item
        check_layout(layout, "candidate layout")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"candidate algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        if (layout, algorithm) not in out:
            out.append((layout, algorithm))
    if not out:
        raise ValueError("candidates must not be empty")
    return out


# --------------------------------------------------------------------------- cache keys


def transform_key(device: str, shape: Shape, dtype: str, src: str, dst: str) -> str:
    """The cache key of to_layout(src -> dst) of a logical NHWC `shape` on `device`."""
    return AutotuneCache.key(device=device, op="to_layout", shape=list(shape), dtype=dtype, src=src, dst=dst)


def conv_key(device: str, layer: Layer) -> str:
    """The cache key of conv `layer`'s candidates on `device`."""
    return AutotuneCache.key(device=device, op="conv2d", x=list(layer.x_shape), w=list(layer.w_shape),
                             dtype=layer.dtype, stride=list(layer.stride),
                             padding=[list(p) for p in layer.padding], dilation=list(layer.dilation),
                             groups=layer.groups, activation=layer.activation,
                             precision=layer.precision, bias=layer.bias)


def _pool_key(device: str, layer: Layer) -> str:
    return AutotuneCache.key(device=device, op=layer.op, x=list(layer.x_shape), dtype=layer.dtype,
                             window=list(layer.window), stride=list(layer.stride),
                             padding=[list(p) for p in layer.padding])


# --------------------------------------------------------------------------- transforms


def transform_ms(shape: Sequence[int], dtype: Any, src: str, dst: str,
                 gpu: str | GpuSpec | None = None) -> float:
    """Model time of to_layout(src -> dst) of a logical NHWC `shape`: read + write of its
    bytes at the GPU's copy bandwidth (0 when src == dst)."""
    shape, dtype = shape4(shape, "shape"), dtype_name(dtype)
    if check_layout(src, "src") == check_layout(dst, "dst"):
        return 0.0
    spec, _ = resolve_spec(gpu, measured=False)
    return relayout_ms(shape, np.dtype(dtype).itemsize, spec)


def _random(key_index: int, shape: Shape, dtype: str):
    key = jax.random.fold_in(jax.random.PRNGKey(0), key_index)
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def _transform_fn(src: str, dst: str) -> Callable:
    return lambda x: ops.to_layout(x, src, dst)


def autotune_transforms(shapes: Iterable[Sequence[int]], dtype: Any, *,
                        pairs: Iterable[tuple[str, str]] | None = None, cache: Any = None,
                        iters: int = 20, warmup: int = 3, measure: bool | None = None,
                        gpu: str | GpuSpec | None = None) -> dict[tuple[Shape, str, str], tuple[float, str]]:
    """Time of to_layout for each logical NHWC shape and (src, dst) pair (default: every
    ordered pair of distinct layouts) -> {(shape, src, dst): (ms, source)}. Measured (one trace
    for all, cached) where the CUDA kernels run, else modelled."""
    check_iters(iters, warmup)
    dtype = dtype_name(dtype)
    shapes = list(dict.fromkeys(shape4(s, "shape") for s in shapes))
    pairs = list(pairs) if pairs is not None else [(a, b) for a in LAYOUTS for b in LAYOUTS if a != b]
    for src, dst in pairs:
        check_layout(src, "src")
        check_layout(dst, "dst")
    store = check_cache_and_gpu(cache, gpu)
    wanted = [(s, a, b) for s in shapes for a, b in pairs if a != b]
    out: dict[tuple[Shape, str, str], tuple[float, str]] = {(s, a, a): (0.0, "model") for s in shapes for a in LAYOUTS}
    if not measuring.should_measure(measure):
        spec, _ = resolve_spec(gpu, measured=False)
        out.update({(s, a, b): (transform_ms(s, dtype, a, b, spec), "model") for s, a, b in wanted})
        return out
    out.update(_measured_transforms(wanted, dtype, store, iters, warmup))
    return out


@measuring.outside_traces
def _measured_transforms(wanted, dtype, store, iters, warmup) -> dict[tuple[Shape, str, str], tuple[float, str]]:
    """autotune_transforms' measured (or cached) times of `wanted` (shape, src, dst)s."""
    out: dict[tuple[Shape, str, str], tuple[float, str]] = {}
    device = measuring.device_kind()
    entries = store.load() if store else {}
    missing = []
    for s, a, b in wanted:
        hit = entries.get(transform_key(device, s, dtype, a, b))
        if hit is not None and hit.get("time_ms") is not None:
            out[(s, a, b)] = (float(hit["time_ms"]), "measured")
        else:
            missing.append((s, a, b))
    # A batch of traces of up to TRANSFORM_BATCH_BYTES of inputs each: one trace for small
    # chains, bounded memory for big activations (a VGG N=64 chain holds tens of GB of them).
    measured: dict[Any, dict[str, Any]] = {}
    batch: list[tuple[Any, Callable, tuple]] = []
    inputs: dict[tuple[Shape, str], Any] = {}
    held = 0
    for i, (s, a, b) in enumerate(missing):
        if (s, a) not in inputs:
            size = math.prod(s) * np.dtype(dtype).itemsize
            if batch and held + size > TRANSFORM_BATCH_BYTES:
                measured.update(case_timing.time_cases(batch, iters, warmup))
                batch, inputs, held = [], {}, 0
            inputs[(s, a)] = _random(i, convert_shape(s, "NHWC", a), dtype)
            held += size
        batch.append(((s, a, b), _transform_fn(a, b), (inputs[(s, a)],)))
    if batch:
        measured.update(case_timing.time_cases(batch, iters, warmup))
    del batch, inputs
    records = {}
    for (s, a, b), entry in measured.items():
        out[(s, a, b)] = (entry["time_ms"], "measured" if entry["measured"] else "wall")
        records[transform_key(device, s, dtype, a, b)] = dict(entry, created=created_now(), iters=iters)
    if store:
        store.put_many(records)
    return out


# --------------------------------------------------------------------------- convs


def autotune_conv(x_shape, w_shape, dtype="bfloat16", *, stride=1, padding="SAME", dilation=1,
                  groups=1, activation=None, precision=None, bias=True, candidates=None,
                  cache: Any = None, iters: int = 20, warmup: int = 3, measure: bool | None = None,
                  refresh: bool = False, gpu: str | GpuSpec | None = None, name: str = "") -> ConvChoice:
    """Time every candidate (layout, algorithm) of one conv, XLA's own conv and the layout
    transforms around it; return them with the winner.

    x_shape is the logical NHWC input, w_shape HWIO; the conv keywords are conv2d's.
    candidates: (layout, algorithm) pairs, default `default_conv_candidates`. A candidate that
    cannot run (ValueError "cannot run" at lowering) is recorded with its error and skipped.
    Where the CUDA kernels run (or measure=True) times are device times of `iters` calls in one
    profiler trace (source="measured"), read from / written to `cache` (None: the default file,
    False: none; refresh=True re-measures). Elsewhere they are model estimates (source="model").
    """
    check_iters(iters, warmup)
    layer = conv_layer(x_shape, w_shape, dtype, stride=stride, padding=padding, dilation=dilation,
                       groups=groups, activation=activation, precision=precision, bias=bias, name=name)
    cands = _check_candidates(candidates) if candidates is not None else default_conv_candidates(layer)
    rule = rule_conv_layer(layer)
    store = check_cache_and_gpu(cache, gpu)
    if not measuring.should_measure(measure):
        return _model_conv_choice(layer, cands, rule, gpu)
    return _measured_conv_choice(layer, cands, rule, store, iters, warmup, refresh)


def cached_conv_choice(x_shape, w_shape, dtype="bfloat16", *, stride=1, padding="SAME", dilation=1,
                       groups=1, activation=None, precision=None, bias=True, candidates=None,
                       cache: Any = None) -> ConvChoice | None:
    """autotune_conv's measured choice when the cache already holds it for this GPU, else None.
    Never measures, and None off the GPU (where nothing was measured for the kernels)."""
    if not measuring.should_measure(None):
        return None
    layer = conv_layer(x_shape, w_shape, dtype, stride=stride, padding=padding, dilation=dilation,
                       groups=groups, activation=activation, precision=precision, bias=bias)
    cands = _check_candidates(candidates) if candidates is not None else default_conv_candidates(layer)
    store = as_cache(cache)
    if store is None:
        return None
    device = measuring.device_kind()
    hit = store.get(conv_key(device, layer))
    if hit is None or not all(c in {(r["layout"], r["algorithm"]) for r in hit.get("candidates", ())}
                              for c in cands):
        return None
    return _conv_choice_from_record(layer, hit, cands, rule_conv_layer(layer), device)


def _model_transforms(layer: Layer, spec: GpuSpec) -> dict[str, dict[str, float]]:
    """Model times of the transforms into each non-NHWC layout and back, around `layer`."""
    return {lay: dict(in_ms=transform_ms(layer.x_shape, layer.dtype, "NHWC", lay, spec),
                      out_ms=transform_ms(layer.y_shape, layer.dtype, lay, "NHWC", spec))
            for lay in LAYOUTS if lay != "NHWC"}


def _model_conv_choice(layer: Layer, cands, rule: RuleChoice, gpu) -> ConvChoice:
    spec, spec_note = resolve_spec(gpu, measured=False)
    results = []
    for layout, algorithm in cands:
        time, how = conv_candidate_ms(layer, layout, algorithm, spec)
        error = how if time is None else ""
        results.append(CandidateResult(layout, algorithm, time, "model", error, "" if error else how))
    xla, xla_note = xla_conv_ms(layer, spec)
    return ConvChoice(layer, tuple(results), xla, _model_transforms(layer, spec), rule, "model", spec.name,
                      False, spec_note, xla_note)


@measuring.outside_traces
def _measured_conv_choice(layer: Layer, cands, rule, store, iters, warmup, refresh) -> ConvChoice:
    device = measuring.device_kind()
    key = conv_key(device, layer)
    if store and not refresh:
        hit = store.get(key)
        if hit is not None:
            have = {(c["layout"], c["algorithm"]) for c in hit.get("candidates", ())}
            if all(c in have for c in cands):
                return _conv_choice_from_record(layer, hit, cands, rule, device)

    x_nhwc = _random(1, layer.x_shape, layer.dtype)
    w = _random(2, layer.w_shape, layer.dtype) * (1.0 / math.sqrt(math.prod(layer.w_shape[:3])))
    w = w.astype(layer.dtype)
    b = _random(3, (layer.w_shape[3],), layer.dtype) if layer.bias else None
    xs = {lay: jnp.transpose(x_nhwc, permutation("NHWC", lay)) for lay in LAYOUTS}
    kwargs = layer.conv_kwargs()

    def candidate_fn(layout, algorithm):
        return lambda x, w, b: ops.conv2d(x, w, b, layout=layout, algorithm=algorithm, **kwargs)

    cases, errors = [], {}
    for layout, algorithm in cands:
        fn, args = candidate_fn(layout, algorithm), (xs[layout], w, b)
        error = measuring.try_run(fn, args)
        if error:
            errors[(layout, algorithm)] = error
        else:
            cases.append((("cand", layout, algorithm), fn, args))

    # XLA's reference time: the same formulation as the ("NHWC", "xla") candidate.
    cases.append((("xla",), candidate_fn("NHWC", "xla"), (x_nhwc, w, b)))
    y_nhwc = jnp.zeros(layer.y_shape, layer.dtype) + 1
    for lay in LAYOUTS:
        if lay == "NHWC":
            continue
        y_lay = jnp.transpose(y_nhwc, permutation("NHWC", lay))
        cases.append((("in", lay), _transform_fn("NHWC", lay), (x_nhwc,)))
        cases.append((("out", lay), _transform_fn(lay, "NHWC"), (y_lay,)))
    measured = case_timing.time_cases(cases, iters, warmup)

    candidates = []
    for layout, algorithm in cands:
        if (layout, algorithm) in errors:
            candidates.append(dict(layout=layout, algorithm=algorithm, time_ms=None, source="measured",
                                   error=errors[(layout, algorithm)]))
            continue
        e = measured[("cand", layout, algorithm)]
        candidates.append(dict(layout=layout, algorithm=algorithm, time_ms=e["time_ms"],
                               source="measured" if e["measured"] else "wall", note=e["note"],
                               kernels=e["kernels"]))
    transforms = {lay: dict(in_ms=measured[("in", lay)]["time_ms"], out_ms=measured[("out", lay)]["time_ms"])
                  for lay in LAYOUTS if lay != "NHWC"}
    record = dict(op="conv2d", device=device, created=created_now(), iters=iters, candidates=candidates,
                  xla=measured[("xla",)], transforms=transforms)
    if store:
        extra = {}
        for lay in transforms:  # also as standalone transform entries, for choose_chain
            extra[transform_key(device, layer.x_shape, layer.dtype, "NHWC", lay)] = dict(
                time_ms=transforms[lay]["in_ms"], measured=True, created=record["created"], iters=iters)
            extra[transform_key(device, layer.y_shape, layer.dtype, lay, "NHWC")] = dict(
                time_ms=transforms[lay]["out_ms"], measured=True, created=record["created"], iters=iters)
        store.put_many({key: record, **extra})
    return _conv_choice_from_record(layer, record, cands, rule, device, cached=False)


def _conv_choice_from_record(layer, record, cands, rule, device, cached=True) -> ConvChoice:
    by_pair = {(c["layout"], c["algorithm"]): CandidateResult.from_dict(c) for c in record["candidates"]}
    results = tuple(by_pair[c] for c in cands)
    xla = record.get("xla") or {}
    any_wall = any(r.source == "wall" for r in results) or xla.get("measured") is False
    note = "some times are host wall time (no device trace)" if any_wall else ""
    if cached:
        note = (note + "; " if note else "") + f"cached {record.get('created', '')}"
    return ConvChoice(layer, results, xla.get("time_ms"), record.get("transforms", {}), rule,
                      "measured", device, cached, note, xla.get("note", ""))


# --------------------------------------------------------------------------- pools


def pool_fn(layer: Layer, layout: str, algorithm: str = "xla") -> Callable:
    """Pool `layer` in `layout`: jaxcnn's kernel ("jaxcnn") or lax.reduce_window ("xla")."""
    if algorithm == "jaxcnn":
        pool = ops.max_pool2d if layer.op == "maxpool" else ops.avg_pool2d
        return lambda x: pool(x, layer.window, layer.stride, layer.padding, layout=layout)
    if algorithm != "xla":
        raise ValueError(f"pool algorithm must be one of {POOL_ALGORITHMS}, got {algorithm!r}")
    dims = {"N": (1, 1, (0, 0)), "C": (1, 1, (0, 0)),
            "H": (layer.window[0], layer.stride[0], layer.padding[0]),
            "W": (layer.window[1], layer.stride[1], layer.padding[1])}
    window = tuple(dims[d][0] for d in layout)
    strides = tuple(dims[d][1] for d in layout)
    pads = tuple(tuple(dims[d][2]) for d in layout)
    if layer.op == "maxpool":
        return lambda x: lax.reduce_window(x, -jnp.inf, lax.max, window, strides, pads)
    count = layer.window[0] * layer.window[1]

    def avg(x):  # padding counts as zeros, summed in float32: as the zoo's avg_pool
        total = lax.reduce_window(x.astype(jnp.float32), 0.0, lax.add, window, strides, pads)
        return (total / count).astype(x.dtype)

    return avg


def autotune_pool(x_shape, dtype="bfloat16", *, op="maxpool", window=2, stride=None, padding=0,
                  cache: Any = None, iters: int = 20, warmup: int = 3, measure: bool | None = None,
                  refresh: bool = False, gpu: str | GpuSpec | None = None, name: str = "",
                  neighbour_layout: str | None = None) -> PoolChoice:
    """Time a max/avg pool (lax.reduce_window) in every layout, like autotune_conv; XLA's
    reference is the NHWC one."""
    check_iters(iters, warmup)
    layer = pool_layer(x_shape, dtype, op=op, window=window, stride=stride, padding=padding, name=name)
    return pool_choice(layer, cache, iters, warmup, measure, refresh, gpu, neighbour_layout)


@measuring.outside_traces
def pool_choice(layer: Layer, cache: Any, iters: int, warmup: int, measure: bool | None, refresh: bool,
                gpu: str | GpuSpec | None, neighbour_layout: str | None = None) -> PoolChoice:
    """autotune_pool of a pool Layer (arguments checked by the caller)."""
    rule = rule_pool(layer.x_shape, layer.dtype, neighbour_layout=neighbour_layout, name=layer.name)
    store = check_cache_and_gpu(cache, gpu)
    if not measuring.should_measure(measure):
        spec, spec_note = resolve_spec(gpu, measured=False)
        results = [CandidateResult(lay, "xla", memory_ms(activation_bytes(layer, lay), spec), "model",
                                   note="sector bytes / DRAM bw") for lay in LAYOUTS]
        return PoolChoice(layer, tuple(results), results[0].time_ms, _model_transforms(layer, spec), rule,
                          "model", spec.name, False, spec_note, "sector bytes / DRAM bw")
    device = measuring.device_kind()
    key = _pool_key(device, layer)
    record = None if (store is None or refresh) else store.get(key)
    pairs = [(lay, alg) for lay in LAYOUTS for alg in POOL_ALGORITHMS]
    if record is not None:  # records from before the pooling kernels timed only "xla"
        have = {(c["layout"], c["algorithm"]) for c in record.get("candidates", ())}
        record = record if all(p in have for p in pairs) else None
    cached = record is not None
    if record is None:
        x_nhwc = _random(4, layer.x_shape, layer.dtype)
        xs = {lay: jnp.transpose(x_nhwc, permutation("NHWC", lay)) for lay in LAYOUTS}
        cases = [(p, pool_fn(layer, *p), (xs[p[0]],)) for p in pairs]
        measured = case_timing.time_cases(cases, iters, warmup)
        record = dict(op=layer.op, device=device, created=created_now(), iters=iters,
                      candidates=[dict(layout=lay, algorithm=alg, time_ms=measured[(lay, alg)]["time_ms"],
                                       source="measured" if measured[(lay, alg)]["measured"] else "wall",
                                       note=measured[(lay, alg)]["note"], kernels=measured[(lay, alg)]["kernels"])
                                  for lay, alg in pairs])
        if store:
            store.put(key, record)
    results = tuple(CandidateResult.from_dict(c) for c in record["candidates"])
    xla_nhwc = next(r.time_ms for r in results if (r.layout, r.algorithm) == ("NHWC", "xla"))
    note = f"cached {record.get('created', '')}" if cached else ""
    return PoolChoice(layer, results, xla_nhwc, {}, rule, "measured", device, cached, note,
                      "lax.reduce_window in NHWC")
