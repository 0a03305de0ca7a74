"""Profile-guided dense/sparse dispatch for convolutions over ReLU outputs.

Three steps, each usable alone:

1. `measure_sparsity(model, ...)`: the fraction of exact zeros in the input of every conv
   layer of a zoo model, on sample inputs (default: smooth random images normalized like
   ImageNet's preprocessing, a realistic input distribution for random-init weights).
2. `measure_crossover(x_shape, w_shape, dtype, ...)`: on this device, the time of the dense
   conv (the better of `jaxcnn.conv2d` "auto" and XLA's own conv) and of `sparse_conv2d` over a
   sparsity grid; the crossover is the sparsity from which sparse is faster. Records go to a
   JSON cache per GPU kind ($JAXCNN_SPARSE_CACHE, else ~/.cache/jaxcnn/sparse_crossover.json).
3. `choose(...)` / `conv2d_auto_sparse(..., sparse="auto", sparsity=...)`: the pick for a
   layer at a measured sparsity, from the stored record. The rule has a margin: sparse only
   when its predicted time times (1 + MARGIN) is at most the dense time. So a dense pick is
   never more than MARGIN slower than the predicted sparse time, and a sparse pick stays no
   slower than dense even if the real sparse time is MARGIN above its prediction. With no
   record for the layer the pick is dense (the known-safe choice) and `explain()` says why.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcnn.models import XLA_OPS, get_model
from jaxcnn.models.layers import Net
from jaxcnn.ops.conv2d.api import conv2d
from jaxcnn.ops.conv2d.config import make_config, normalize_precision
from jaxcnn.ops.sparse_conv2d.api import sparse_conv2d
from jaxcnn.profile.device_time import device_time
from jaxcnn.tuning import cache_file
from jaxcnn.tuning.autotune_cache import AutotuneCache
from jaxcnn.tuning.measure import device_kind

CACHE_ENV = "JAXCNN_SPARSE_CACHE"
MARGIN = 0.05
# Sparsity grid of a crossover measurement: dense enough near the usual crossovers (50-90%).
DEFAULT_GRID = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
SPARSE_MODES = ("auto", True, False)


# --------------------------------------------------------------------------- sparse inputs


def sparse_input(key, shape, sparsity: float, dtype="float32"):
    """A ReLU-like activation with exactly round(sparsity * size) zeros (at random places) and
    positive, half-normal nonzeros."""
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    k1, k2 = jax.random.split(key)
    size = math.prod(shape)
    zeros = int(round(sparsity * size))
    values = jnp.abs(jax.random.normal(k1, (size,), jnp.float32)) + 1e-3
    order = jax.random.permutation(k2, size)
    values = values.at[order[:zeros]].set(0.0)
    return values.reshape(shape).astype(dtype)


def realistic_images(key, batch: int, size: int, channels: int = 3, dtype="float32"):
    """Smooth random images (noise at 4 spatial scales, summed), normalized per channel to mean
    0 / std 1 as ImageNet preprocessing leaves real photos: large uniform regions and edges,
    unlike white noise."""
    total = jnp.zeros((batch, size, size, channels), jnp.float32)
    for i, cells in enumerate((4, 8, 16, size)):
        cells = min(cells, size)
        noise = jax.random.normal(jax.random.fold_in(key, i), (batch, cells, cells, channels))
        total = total + jax.image.resize(noise, (batch, size, size, channels), "linear") / (i + 1)
    mean = total.mean(axis=(1, 2), keepdims=True)
    std = total.std(axis=(1, 2), keepdims=True) + 1e-6
    return ((total - mean) / std).astype(dtype)


# --------------------------------------------------------------------------- 1. sparsity


@dataclass(frozen=True)
class LayerSparsity:
    """One conv layer's input as the model runs it."""

    index: int  # position among the model's conv layers
    name: str
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    stride: tuple[int, int]
    padding: tuple[tuple[int, int], tuple[int, int]]
    sparsity: float  # fraction of exact zeros in the input


def measure_sparsity(model: str, *, batch: int = 1, dtype="float32", seed: int = 0, params=None,
                     images=None) -> list[LayerSparsity]:
    """Input sparsity of each conv layer of zoo `model` on `images` (default: realistic_images
    of `batch`) with `params` (default: the zoo's He init from `seed`); one jitted run."""
    spec = get_model(model)
    if params is None:
        params = spec.init(seed, dtype)
    if images is None:
        images = realistic_images(jax.random.PRNGKey(seed + 1), batch, spec.image_size, spec.channels, dtype)
    convs = [info for info in spec.layers(images.shape[0], images.dtype) if info.op == "conv2d"]

    def run(params, x):
        zeros = []

        def conv(x, w, b=None, **kw):
            zeros.append(jnp.mean((x == 0).astype(jnp.float32)))
            return XLA_OPS["conv2d"](x, w, b, **kw)

        spec.body(Net({**XLA_OPS, "conv2d": conv}, params), x)
        return zeros

    fractions = jax.jit(run)(params, images)
    if len(fractions) != len(convs):
        raise RuntimeError(f"{model}: {len(fractions)} conv calls but {len(convs)} conv layers")
    return [
        LayerSparsity(i, info.name, tuple(info.input_shape), tuple(info.weight_shape),
                      tuple(info.stride), tuple(map(tuple, info.padding)), float(f))
        for i, (info, f) in enumerate(zip(convs, fractions))
    ]


# --------------------------------------------------------------------------- 2. crossover


def layer_key(x_shape, w_shape, dtype, *, stride=(1, 1), padding=((0, 0), (0, 0)),
              precision: str = "default") -> str:
    """The cache key of one layer (NHWC x, HWIO w): shapes, stride, padding, dtype and, for
    float32, the dense path's precision (TF32 "default" or fp32 "highest")."""
    dtype = np.dtype(dtype).name
    return AutotuneCache.key(
        x=list(map(int, x_shape)), w=list(map(int, w_shape)), stride=list(map(int, _pair(stride))),
        padding=[list(map(int, p)) for p in padding], dtype=dtype,
        precision=precision if dtype == "float32" else "default",
    )


def _pair(v):
    return (v, v) if isinstance(v, (int, np.integer)) else tuple(v)


def find_crossover(sparsities: Sequence[float], sparse_ms: Sequence[float], dense_ms: float) -> float | None:
    """The lowest sparsity from which sparse stays faster than dense (linear interpolation
    between grid points); 0.0 when sparse always wins, None when it never does."""
    points = sorted(zip(sparsities, sparse_ms))
    if all(t >= dense_ms for _, t in points):
        return None
    # The last grid point where sparse is not faster; the crossing lies after it.
    last_slow = max((i for i, (_, t) in enumerate(points) if t >= dense_ms), default=None)
    if last_slow is None:
        return 0.0
    if last_slow == len(points) - 1:
        return None
    (s0, t0), (s1, t1) = points[last_slow], points[last_slow + 1]
    return float(s0 + (s1 - s0) * (t0 - dense_ms) / (t0 - t1)) if t0 != t1 else float(s1)


@dataclass(frozen=True)
class Crossover:
    """Measured dense and sparse times of one layer on one GPU kind."""

    device: str
    key: str
    sparsities: tuple[float, ...]
    sparse_ms: tuple[float, ...]
    dense_ms: float  # the better dense path
    dense_path: str  # "jaxcnn" (conv2d auto) or "xla"
    dense_candidates_ms: dict = dataclasses.field(default_factory=dict)
    crossover: float | None = None

    def sparse_ms_at(self, sparsity: float) -> float:
        """Interpolated sparse time (linear in sparsity: the work is linear in the nonzeros)."""
        return float(np.interp(sparsity, self.sparsities, self.sparse_ms))

    def to_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Crossover":
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in fields}
        values["sparsities"] = tuple(values["sparsities"])
        values["sparse_ms"] = tuple(values["sparse_ms"])
        return cls(**values)


def default_cache_path() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "jaxcnn" / "sparse_crossover.json"


# The fields of a Crossover record that choose/record_crossover read, and of its layer key.
_RECORD_CHECK = cache_file.fields(
    dict(device=cache_file.text, key=cache_file.text,
         sparsities=cache_file.list_of(cache_file.number, nonempty=True),
         sparse_ms=cache_file.list_of(cache_file.number, nonempty=True),
         dense_ms=cache_file.number, dense_path=cache_file.text),
    dict(dense_candidates_ms=cache_file.dict_of(cache_file.number),
         crossover=cache_file.optional(cache_file.number)))
_INTS = cache_file.list_of(cache_file.number, nonempty=True)
_LAYER_KEY_CHECK = cache_file.fields(dict(x=_INTS, w=_INTS, stride=_INTS, padding=cache_file.list_of(_INTS),
                                          dtype=cache_file.text, precision=cache_file.text))


def _crossover_entry_problem(entry_key: str, record: Any) -> str | None:
    """What is wrong with one entry of the crossover cache (None: usable). Entries of other keys
    (the file may be shared with the autotune cache) only need to be JSON objects."""
    if not entry_key.startswith("sparse|"):
        return None if isinstance(record, dict) else f"expected an object, got {type(record).__name__}"
    if problem := _RECORD_CHECK(record):
        return problem
    if len(record["sparsities"]) != len(record["sparse_ms"]):
        return f"{len(record['sparsities'])} sparsities but {len(record['sparse_ms'])} sparse_ms"
    if record["sparsities"] != sorted(record["sparsities"]):
        return "sparsities are not in increasing order"
    if entry_key != CrossoverTable._entry_key(record["device"], record["key"]):
        return "its device and key differ from the entry's"
    _, problem = cache_file.parse_json(record["key"], _LAYER_KEY_CHECK)
    return f"key: {problem}" if problem else None


class CrossoverTable:
    """Crossover records per GPU kind and layer, in the autotune cache's JSON format (atomic,
    locked writes; see jaxcnn.tuning.autotune_cache.AutotuneCache). `path=False` keeps them in memory.
    A malformed file or record is reported once and read as no record (dense)."""

    def __init__(self, path: Any = None):
        self._memory: dict[str, dict] = {}
        self._file = None if path is False else AutotuneCache(
            path if path is not None else default_cache_path(), what="sparse crossover cache",
            entry_problem=_crossover_entry_problem)

    @staticmethod
    def _entry_key(device: str, key: str) -> str:
        return f"sparse|{device}|{key}"

    def get(self, device: str, key: str) -> Crossover | None:
        entry_key = self._entry_key(device, key)
        record = self._memory.get(entry_key)
        if record is None and self._file is not None:
            record = self._file.get(entry_key)
        return None if record is None else Crossover.from_record(record)

    def put(self, crossover: Crossover) -> None:
        entry_key = self._entry_key(crossover.device, crossover.key)
        self._memory[entry_key] = crossover.to_record()
        if self._file is not None:
            self._file.put(entry_key, crossover.to_record())

    def entries(self) -> list[Crossover]:
        records = dict(self._file.load()) if self._file is not None else {}
        records.update(self._memory)
        return [Crossover.from_record(r) for k, r in sorted(records.items()) if k.startswith("sparse|")]


def measure_crossover(x_shape, w_shape, dtype="float32", *, stride=1, padding="SAME",
                      precision=None, sparsities: Sequence[float] = DEFAULT_GRID, iters: int = 20,
                      warmup: int = 3, table: CrossoverTable | None = None, seed: int = 0,
                      timer: Callable | None = None) -> Crossover:
    """Times dense (jaxcnn.conv2d "auto" and XLA, the better counts) and sparse_conv2d on
    inputs of each sparsity in `sparsities`, on this process's first device; stores the record
    in `table` when given. `timer(fn, *args) -> ms` defaults to device time (profiler trace)."""
    if timer is None:
        def timer(fn, *args):
            return device_time(fn, *args, iters=iters, warmup=warmup).median_ms

    cfg = make_config(x_shape, w_shape, stride=stride, padding=padding, precision=precision)
    prec = normalize_precision(precision)
    key = jax.random.PRNGKey(seed)
    w = (jax.random.normal(key, w_shape) * math.sqrt(2.0 / math.prod(w_shape[:3]))).astype(dtype)
    b = (0.01 * jax.random.normal(jax.random.fold_in(key, 1), w_shape[-1:])).astype(dtype)
    kw = dict(stride=cfg.stride, padding=cfg.padding, activation="relu")
    x_dense = sparse_input(jax.random.fold_in(key, 2), x_shape, 0.5, dtype)
    dense = {
        "jaxcnn": timer(lambda x, w, b: conv2d(x, w, b, precision=prec, algorithm="jaxcnn", **kw),
                        x_dense, w, b),
        "xla": timer(lambda x, w, b: conv2d(x, w, b, precision=prec, algorithm="xla", **kw),
                     x_dense, w, b),
    }
    path = min(dense, key=dense.get)
    grid = tuple(sorted(float(s) for s in sparsities))
    sparse_ms = tuple(
        float(timer(lambda x, w, b: sparse_conv2d(x, w, b, **kw),
                    sparse_input(jax.random.fold_in(key, 3 + i), x_shape, s, dtype), w, b))
        for i, s in enumerate(grid)
    )
    result = Crossover(device_kind(), layer_key(x_shape, w_shape, dtype, stride=cfg.stride,
                                                padding=cfg.padding, precision=prec),
                       grid, sparse_ms, float(dense[path]), path, {k: float(v) for k, v in dense.items()},
                       find_crossover(grid, sparse_ms, dense[path]))
    if table is not None:
        table.put(result)
    return result


# --------------------------------------------------------------------------- 3. choice


@dataclass(frozen=True)
class Decision:
    """The dense/sparse pick for one layer at one sparsity."""

    sparse: bool
    sparsity: float
    reason: str
    device: str
    predicted_dense_ms: float | None = None
    predicted_sparse_ms: float | None = None
    crossover: float | None = None
    dense_path: str | None = None

    def explain(self) -> str:
        pick = "sparse_conv2d" if self.sparse else f"dense ({self.dense_path or 'conv2d'})"
        lines = [f"{pick} at {self.sparsity:.1%} zeros on {self.device}: {self.reason}"]
        if self.predicted_dense_ms is not None:
            lines.append(f"  predicted dense {self.predicted_dense_ms:.4f} ms, sparse "
                         f"{self.predicted_sparse_ms:.4f} ms; crossover "
                         + ("never (sparse is never faster)" if self.crossover is None
                            else f"{self.crossover:.1%} zeros"))
        return "\n".join(lines)


def choose_from(record: Crossover | None, sparsity: float, *, device: str = "?",
                margin: float = MARGIN) -> Decision:
    """The pick from one stored record (None: not measured -> dense)."""
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if record is None:
        return Decision(False, sparsity, "no crossover measured for this layer on this GPU "
                        "(run jaxcnn.tuning.sparse_dispatch.measure_crossover); dense is the safe default",
                        device)
    sparse_ms = record.sparse_ms_at(sparsity)
    use_sparse = sparse_ms * (1.0 + margin) <= record.dense_ms
    if use_sparse:
        reason = (f"predicted sparse time x {1 + margin:g} <= dense time (sparse "
                  f"{record.dense_ms / sparse_ms:.2f}x faster)")
    elif sparse_ms < record.dense_ms:
        reason = (f"sparse is predicted only {record.dense_ms / sparse_ms:.3f}x faster, inside the "
                  f"{margin:.0%} margin: dense is within {margin:.0%} and has no prediction risk")
    else:
        reason = f"dense is faster ({sparse_ms / record.dense_ms:.2f}x the dense time for sparse)"
    return Decision(use_sparse, sparsity, reason, record.device, record.dense_ms, sparse_ms,
                    record.crossover, record.dense_path)


def choose(x_shape, w_shape, dtype, sparsity: float, *, stride=1, padding="SAME", precision=None,
           table: CrossoverTable | None = None, device: str | None = None,
           margin: float = MARGIN) -> Decision:
    """The pick for a layer (NHWC x_shape, HWIO w_shape) at a measured input `sparsity`."""
    cfg = make_config(x_shape, w_shape, stride=stride, padding=padding, precision=precision)
    table = CrossoverTable() if table is None else table
    device = device_kind() if device is None else device
    key = layer_key(x_shape, w_shape, dtype, stride=cfg.stride, padding=cfg.padding,
                    precision=normalize_precision(precision))
    return choose_from(table.get(device, key), sparsity, device=device, margin=margin)


def conv2d_auto_sparse(x, w, bias=None, *, sparse: Any = "auto", sparsity: float | None = None,
                       table: CrossoverTable | None = None, device: str | None = None,
                       stride=1, padding="SAME", dilation=1, activation=None, precision=None):
    """conv2d (NHWC, groups 1) running dense or zero-skipping.

    sparse: True (always `sparse_conv2d`), False (always `conv2d`) or "auto": the stored
      crossover for this layer on this GPU decides at the measured input `sparsity` (required:
      the choice is made at trace time, so it must be a Python float, e.g. from
      `measure_sparsity`).
    """
    if not (sparse is True or sparse is False or (isinstance(sparse, str) and sparse == "auto")):
        raise ValueError(f"sparse must be one of {SPARSE_MODES}, got {sparse!r}")
    kw = dict(stride=stride, padding=padding, dilation=dilation, activation=activation,
              precision=precision)
    if sparse == "auto":
        if sparsity is None:
            raise ValueError("sparse='auto' needs the layer's measured input sparsity "
                             "(sparsity=..., see jaxcnn.tuning.sparse_dispatch.measure_sparsity)")
        if dilation not in (1, (1, 1)):
            sparse = False  # crossovers are measured for undilated layers only
        else:
            x = jnp.asarray(x)
            sparse = choose(x.shape, np.shape(w), x.dtype, float(sparsity), stride=stride, padding=padding, precision=precision,
                            table=table, device=device).sparse
    if sparse:
        return sparse_conv2d(x, w, bias, **kw)
    return conv2d(x, w, bias, **kw)


def plan_model(model: str, *, batch: int = 1, dtype="float32", table: CrossoverTable | None = None,
               device: str | None = None, margin: float = MARGIN, seed: int = 0,
               sparsities: list[LayerSparsity] | None = None) -> list[tuple[LayerSparsity, Decision]]:
    """Per conv layer of `model`: its measured input sparsity and the pick."""
    layers = sparsities if sparsities is not None else measure_sparsity(model, batch=batch, dtype=dtype, seed=seed)
    table = CrossoverTable() if table is None else table
    device = device_kind() if device is None else device
    out = []
    for layer in layers:
        key = layer_key(layer.input_shape, layer.weight_shape, dtype, stride=layer.stride,
                        padding=layer.padding)
        out.append((layer, choose_from(table.get(device, key), layer.sparsity, device=device,
                                       margin=margin)))
    return out


def explain_plan(plan: list[tuple[LayerSparsity, Decision]]) -> str:
    """One line per conv layer: name, input shape, sparsity, pick and why."""
    rows = []
    for layer, decision in plan:
        pick = "sparse" if decision.sparse else "dense"
        shape = "x".join(map(str, layer.input_shape))
        rows.append(f"{layer.name:<28} {shape:<18} {layer.sparsity:6.1%} zeros -> {pick:<6} "
                    f"({decision.reason})")
    return "\n".join(rows)


# --------------------------------------------------------------------------- SQLite store


def _store_device(kind: str) -> str:
    """The store's device column ("cpu" | "gpu"); the GPU kind goes into the environment."""
    return "cpu" if kind.lower() == "cpu" else "gpu"


def record_sparsity(store, model: str, layers: list[LayerSparsity], *, batch: int, dtype,
                    device: str | None = None, note: str | None = None) -> int:
    """Writes measured input sparsity into a `jaxcnn.store.Store` (its `sparsity` table, one
    row per conv layer); returns the run id."""
    kind = device or device_kind()
    run = store.add_run("sparsity", model=model, batch=batch, dtype=np.dtype(dtype).name,
                        device=_store_device(kind), environment=dict(gpu_name=kind), note=note)
    ids = store.add_layers(run, [
        dict(idx=layer.index, name=layer.name, op="conv2d", input_shapes=[list(layer.input_shape)],
             weight_shape=list(layer.weight_shape),
             params=dict(stride=list(layer.stride), padding=[list(p) for p in layer.padding]))
        for layer in layers])
    store.add_sparsity(run, [dict(layer_id=i, zero_fraction=layer.sparsity, sample_count=batch)
                             for i, layer in zip(ids, layers)])
    return run


def record_crossover(store, crossover: Crossover, *, name: str = "layer") -> int:
    """Writes one crossover measurement into a `jaxcnn.store.Store`: a run of kind
    "sparse_crossover" with the layer, one device_time_ms measurement per dense path and per
    sparsity of the sparse kernel (variant "sparsity=0.9"), and the crossover in the run's extra."""
    fields = json.loads(crossover.key)
    run = store.add_run("sparse_crossover", batch=fields["x"][0], dtype=fields["dtype"],
                        device=_store_device(crossover.device),
                        environment=dict(gpu_name=crossover.device),
                        extra=dict(key=crossover.key, crossover=crossover.crossover,
                                   dense_path=crossover.dense_path))
    layer_id, = store.add_layers(run, [dict(idx=0, name=name, op="conv2d", input_shapes=[fields["x"]],
                                            weight_shape=fields["w"],
                                            params=dict(stride=fields["stride"], padding=fields["padding"],
                                                        precision=fields["precision"]))])
    rows = [dict(layer_id=layer_id, backend=path, metric="device_time_ms", median=ms, unit="ms")
            for path, ms in crossover.dense_candidates_ms.items()]
    rows += [dict(layer_id=layer_id, backend="jaxcnn_sparse", metric="device_time_ms", median=ms,
                  unit="ms", variant=f"sparsity={s:g}")
             for s, ms in zip(crossover.sparsities, crossover.sparse_ms)]
    store.add_measurements(run, rows)
    return run
