#!/usr/bin/env python3
"""conv2d(algorithm="auto") against XLA's own convolution over a random shape sweep and every
zoo conv layer (issue 33): is "auto" ever the slow choice, and is it correct?

Cases:
  - --cases random convs drawn from --seed: N in {1..64}, H and W 5..80 (odd, not square), C and
    K odd (3, 17, 300, ...) or multiples of 8/32/64, R and S in {1, 3, 5, 7}, strides 1, 2 and
    (1, 2), every padding form (SAME, VALID, an int, an (h, w) pair, explicit ((t, b), (l, r))),
    dilations 1-3, groups 1 / 2 / 4 / depthwise, the three layouts and the four dtype kinds
    (bf16, fp16, fp32 at precision "default", fp32 at "highest"), a bias always, an activation
    (none, relu, relu6, silu), some with a residual. Each draw's work is bounded (LIMITS) so the
    sweep stays minutes long: N halves until FLOPs, elements and the reference's FLOPs fit.
  - every distinct conv layer of the zoo models (jaxcnn.models) at N = 64 and 1, NHWC, in bf16,
    fp32 and fp32 "highest".
Per case, in one process: jaxcnn.conv2d(..., algorithm="auto") and algorithm="xla" (XLA's conv,
then the epilogue as a JAX user writes it: the baseline), each jitted.
  - decisions: each chunk of cases is decided in one batch (jaxcnn.tuning.decision.decide_all of
    jaxcnn.tuning.conv_choice.conv_site) into a fresh autotune cache under the output directory,
    which JAXCNN_AUTOTUNE_CACHE points at, so the "auto" traces read them back; the choice, its
    source and explain() text, the candidates' times and the seconds the batch took are kept;
  - correctness: fresh random inputs (x ~ N(0, 1), w ~ N(0, 1/fan-in), bias and residual never
    zero); the first and last image of the batch against a float64 numpy reference, max |error| /
    max |reference|, within tolerance() (from the dtype, the precision and the reduction length);
    a NaN or inf anywhere in auto's output fails; XLA's own error is kept beside it;
  - timing: device time (jaxcnn.profile.device_times: profiler kernel events, a chunk's cases
    and both variants in one trace), median and p10-p90 over --iters calls; ratio = XLA / auto;
    % of floor from jaxcnn.profile.gpu_specs (FLOPs at the dtype's peak, bytes at the bandwidth).
Without CUDA kernels (a CPU), "auto" runs the lax reference and times are host wall time: the
report says so and draws no speedup verdicts.

Writes <gpu>-<date>-<name>.{json,md} into --out after every chunk and prints the markdown. A
chunk expected to end past --budget-s (default BUDGET_S) is not started: the report counts the
cases not reached, and a second run with --resume <that report's JSON> runs them and writes one
report of all. Exit status: 0 when every case that ran was correct, 2 otherwise.

  python scripts/bench_conv_sweep.py --out benchmarks/results
  python scripts/bench_conv_sweep.py --out /tmp/sweep --quick
  JAX_PLATFORMS=cpu python scripts/bench_conv_sweep.py --out /tmp/sweep --quick
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import sys
import time
import traceback
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

# bench_optimize_flax puts the repository root on sys.path (jaxcnn from a checkout)
from bench_common import device_slug as gpu_slug  # noqa: E402
from bench_common import environment, final_status  # noqa: E402
from bench_common import fmt as _fmt  # noqa: E402
from bench_common import json_safe as _json_safe  # noqa: E402
from bench_optimize_flax import timing_dict  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxcnn  # noqa: E402
from jaxcnn.layouts import AutotuneCache  # noqa: E402
from jaxcnn.models import layer_table, list_models  # noqa: E402
from jaxcnn.ops.conv_args import conv2d_flops, conv2d_output_shape, make_config  # noqa: E402
from jaxcnn.ops.layout_axes import LAYOUTS, convert_shape  # noqa: E402
from jaxcnn.profile import device_times  # noqa: E402
from jaxcnn.profile.gpu_specs import floor_ms, lookup_gpu_spec  # noqa: E402
from jaxcnn.tuning.conv_choice import conv_site, decide_conv  # noqa: E402
from jaxcnn.tuning.decision import COMPILE_THREADS, decide_all  # noqa: E402

DEFAULT_SEED = 33  # the number: a fixed sweep unless --seed says otherwise
DEFAULT_CASES = 320
QUICK_CASES, QUICK_ITERS, QUICK_ZOO_LAYERS = 24, 5, 4

# kind -> (dtype, precision): the four ways a conv's arithmetic runs.
KINDS = {
    "bf16": ("bfloat16", "default"),
    "fp16": ("float16", "default"),
    "fp32": ("float32", "default"),
    "fp32_highest": ("float32", "highest"),
}
# The gpu_specs ceiling each kind's convs run at: fp32 "default" may use TF32 tensor cores (as
# XLA's DEFAULT does); "highest" is held to the CUDA-core fp32 peak, so 3xTF32 on tensor cores can
# pass 100 % of that floor.
PRECISION_CLASS = {"bf16": "bf16", "fp16": "fp16", "fp32": "tf32", "fp32_highest": "fp32"}
ZOO_KINDS = ("bf16", "fp32", "fp32_highest")
ZOO_BATCHES = (64, 1)
ACTIVATIONS = (None, "relu", "relu6", "silu")
VARIANTS = ("auto", "xla")  # conv2d's algorithm argument: jaxcnn's decision, and XLA's conv (the baseline)


@dataclass(frozen=True)
class Limits:
    """The most work one random case may be: FLOPs of the conv, elements of its input and of its
    output, and FLOPs of the float64 reference (REFERENCE_IMAGES images on the host)."""

    flops: float
    elements: int
    reference_flops: float


LIMITS = Limits(flops=8e9, elements=8 * 2**20, reference_flops=1e9)
QUICK_LIMITS = Limits(flops=2e8, elements=2**20, reference_flops=5e7)

# Cases go to the device in chunks: one decision batch, one compile pool and one profiler trace
# each; the bytes bound keeps a chunk's inputs and outputs well inside one GPU's memory.
CHUNK_CASES = 48
CHUNK_BYTES = 4e9
REFERENCE_IMAGES = 2  # the first and the last image of the batch
# The documented variable naming jaxcnn's default autotune cache (jaxcnn.layouts.default_cache_path).
AUTOTUNE_CACHE_ENV = "JAXCNN_AUTOTUNE_CACHE"

# Tolerance (see tolerance()): the output roundings of the XLA formulation auto may lower to
# (conv, +bias, +residual, and silu's sigmoid and product, each rounded to x's dtype), the
# rounding of the multiplicands inside the MMA, and the fp32 accumulator.
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}
OUTPUT_ROUNDINGS = 5
# TF32 keeps 10 of fp32's 23 mantissa bits; 3xTF32 splits each operand into two TF32 parts and
# drops the small x small product, both of order 2**-21; bf16/fp16 products are exact in fp32.
MMA_ROUNDOFF = {"bf16": 0.0, "fp16": 0.0, "fp32": 2.0**-11, "fp32_highest": 2.0**-21}
ACCUMULATOR_ROUNDOFF = 2.0**-24
# Rounding errors of random sign grow like sqrt(terms) times the result's scale; an output
# tensor's largest one sits within a few standard deviations of them.
TAIL = 4.0
HIGHEST_GOAL_ERROR = 1e-5  # issue 33 item 3: fp32 "highest" vs float64

# Issue 33's goals on the ratio XLA / auto.
SWEEP_GOALS = (("median", 1.05), ("p5", 0.95), ("min", 0.9))
ZOO_EACH_GOAL = 1.0
HIGHEST_ZOO_GEOMEAN_GOAL = 2.5
HIGHEST_ZOO_EACH_GOAL = 2.0  # item 3: every zoo layer with C >= HIGHEST_MIN_CHANNELS
HIGHEST_MIN_CHANNELS = 64
WORST = 10
# Default --budget-s: a few minutes, so a GPU check runs the sweep beside its build and tests;
# --resume finishes a longer sweep in a second run.
BUDGET_S = 270.0
ZOO_BELOW_LISTED = 40


# ---------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One conv: logical x [n, h, w, c] in `layout`, HWIO weights [r, s, c // groups, k], a bias,
    the activation and (residual) a residual operand of the output's shape."""

    name: str
    source: str  # "random" | "zoo"
    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    stride: tuple[int, int]
    padding: Any  # as conv2d takes it: "SAME", "VALID", an int, (h, w) or ((t, b), (l, r))
    dilation: tuple[int, int]
    groups: int
    layout: str
    kind: str
    activation: str | None
    residual: bool
    also: tuple[str, ...] = ()  # zoo layers of the same geometry

    @property
    def dtype(self) -> str:
        return KINDS[self.kind][0]

    @property
    def precision(self) -> str:
        return KINDS[self.kind][1]

    @property
    def input_key(self) -> str:
        """Names the inputs: cases differing only in precision draw the same ones."""
        return f"{self.name.rsplit('/', 1)[0] if self.source == 'zoo' else self.name}/{self.dtype}"

    @property
    def x_nhwc(self) -> tuple[int, int, int, int]:
        return (self.n, self.h, self.w, self.c)

    @property
    def x_shape(self) -> tuple[int, ...]:
        return convert_shape(self.x_nhwc, "NHWC", self.layout)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.r, self.s, self.c // self.groups, self.k)

    @property
    def terms(self) -> int:
        """Length of each output's reduction."""
        return self.r * self.s * (self.c // self.groups)

    def config(self):
        return make_config(self.x_shape, self.w_shape, stride=self.stride, padding=self.padding,
                           dilation=self.dilation, groups=self.groups, activation=self.activation,
                           layout=self.layout, precision=self.precision, algorithm="auto")

    def out_shape(self) -> tuple[int, ...]:
        """The output shape in the case's layout (ValueError where the window does not fit)."""
        return tuple(conv2d_output_shape(self.x_shape, self.dtype, self.w_shape, self.dtype, (self.k,),
                                         self.dtype, self.config()))

    def out_nhwc(self) -> tuple[int, ...]:
        return convert_shape(self.out_shape(), self.layout, "NHWC")

    def flops(self) -> int:
        return conv2d_flops(self.x_nhwc, self.w_shape, self.out_nhwc())

    def bytes(self) -> int:
        """x, w, bias, the output (and the residual) moved once each."""
        y = math.prod(self.out_shape())
        elements = math.prod(self.x_nhwc) + math.prod(self.w_shape) + self.k + y * (2 if self.residual else 1)
        return elements * np.dtype(jnp.dtype(self.dtype)).itemsize

    def reference_flops(self) -> float:
        return self.flops() * min(self.n, REFERENCE_IMAGES) / self.n

    def describe(self) -> str:
        extras = [f"s{_pair_text(self.stride)}" if self.stride != (1, 1) else "",
                  f"d{_pair_text(self.dilation)}" if self.dilation != (1, 1) else "",
                  f"g{self.groups}" if self.groups > 1 else "",
                  f"pad {_padding_text(self.padding)}", self.layout, self.activation or "",
                  "+res" if self.residual else ""]
        return (f"{self.n}x{self.h}x{self.w}x{self.c}->{self.k} {self.r}x{self.s} "
                + " ".join(e for e in extras if e))

    def to_json(self) -> dict:
        return dict(dataclasses.asdict(self), dtype=self.dtype, precision=self.precision,
                    x_shape=list(self.x_shape), w_shape=list(self.w_shape), out_shape=list(self.out_shape()),
                    terms=self.terms, flops=self.flops(), bytes=self.bytes(), description=self.describe())


def _pair_text(p) -> str:
    return str(p[0]) if p[0] == p[1] else f"({p[0]},{p[1]})"


def _padding_text(padding) -> str:
    return padding if isinstance(padding, str) else json.dumps(padding).replace(" ", "")


def _channels(rng: np.random.Generator) -> int:
    """A channel count: odd or arbitrary (3, 17, 300, ...), or a multiple of 8, 32 or 64."""
    form = rng.choice(4, p=[0.35, 0.25, 0.2, 0.2])
    if form == 0:
        return int(rng.choice([1, 3, 17, 300])) if rng.random() < 0.3 else int(rng.integers(1, 301))
    step = (8, 32, 64)[form - 1]
    return step * int(rng.integers(1, 512 // step + 1))


def _padding(rng: np.random.Generator, window: tuple[int, int]) -> Any:
    """One of conv2d's padding forms, sized to the dilated window."""
    form = rng.choice(5, p=[0.35, 0.2, 0.15, 0.15, 0.15])
    if form == 0:
        return "SAME"
    if form == 1:
        return "VALID"
    if form == 2:
        return int(rng.integers(0, max(window) // 2 + 2))
    if form == 3:
        return (int(rng.integers(0, window[0] // 2 + 2)), int(rng.integers(0, window[1] // 2 + 2)))
    return tuple(tuple(int(v) for v in rng.integers(0, window[i], size=2)) for i in range(2))


def _draw(rng: np.random.Generator, index: int, layout: str, kind: str, limits: Limits) -> Case | None:
    """One random case, its batch halved until it fits `limits`; None where it cannot fit or
    the window does not fit the padded input."""
    r = int(rng.choice([1, 3, 5, 7], p=[0.4, 0.4, 0.12, 0.08]))
    s = r if rng.random() < 0.9 else int(rng.choice([1, 3, 5, 7]))
    u = rng.random()
    stride = (1, 1) if u < 0.65 else (2, 2) if u < 0.9 else ((1, 2) if rng.random() < 0.5 else (2, 1))
    u = rng.random()
    dilation = (1, 1)
    if max(r, s) > 1:
        dilation = (1, 1) if u < 0.8 else (2, 2) if u < 0.92 else (3, 3) if u < 0.97 else (1, 2)
    c, k = _channels(rng), _channels(rng)
    u = rng.random()
    groups = 1
    if u < 0.12:  # depthwise, channel multiplier 1 or 2
        groups, k = c, c * (1 if rng.random() < 0.8 else 2)
    elif u < 0.25:
        groups = int(rng.choice([2, 4]))
        c, k = -(-c // groups) * groups, -(-k // groups) * groups
    window = tuple(d * (f - 1) + 1 for d, f in zip(dilation, (r, s)))
    case = Case(
        name=f"r{index:03d}", source="random", n=int(rng.choice([1, 2, 4, 8, 16, 32, 64])),
        h=int(rng.integers(5, 81)), w=int(rng.integers(5, 81)), c=c, k=k, r=r, s=s, stride=stride,
        padding=_padding(rng, window), dilation=dilation, groups=groups, layout=layout, kind=kind,
        activation=ACTIVATIONS[int(rng.integers(len(ACTIVATIONS)))], residual=bool(rng.random() < 0.25))
    try:
        case.out_shape()
    except ValueError:
        return None
    while not _fits(case, limits):
        if case.n == 1:
            return None
        case = dataclasses.replace(case, n=case.n // 2)
    return case


def _fits(case: Case, limits: Limits) -> bool:
    return (case.flops() <= limits.flops and case.reference_flops() <= limits.reference_flops
            and max(math.prod(case.x_nhwc), math.prod(case.out_shape())) <= limits.elements)


def random_cases(seed: int = DEFAULT_SEED, count: int = DEFAULT_CASES, limits: Limits = LIMITS) -> list[Case]:
    """`count` random cases, the same for the same seed. Layouts and kinds are dealt evenly (then
    shuffled), so every one of them appears in any sweep of at least 4 cases."""
    rng = np.random.default_rng(seed)
    layouts = rng.permutation([LAYOUTS[i % len(LAYOUTS)] for i in range(count)])
    kinds = rng.permutation([list(KINDS)[i % len(KINDS)] for i in range(count)])
    cases = []
    for i in range(count):
        case = None
        while case is None:
            case = _draw(rng, i, str(layouts[i]), str(kinds[i]), limits)
        cases.append(case)
    return cases


def zoo_layers(batch: int) -> list[Case]:
    """Every distinct conv layer of the zoo models at `batch` (NHWC, the first one's name; the
    others of the same geometry and epilogue in `also`), as bf16 cases."""
    layers: dict[tuple, Case] = {}
    for model in list_models():
        for info in layer_table(model, batch, jnp.float32):
            if info.op != "conv2d":
                continue
            n, h, w, c = info.input_shape
            r, s, _, k = info.weight_shape
            padding = tuple(tuple(int(v) for v in p) for p in info.padding)
            key = (tuple(info.input_shape), tuple(info.weight_shape), tuple(info.stride), padding,
                   tuple(info.dilation), info.groups, info.activation)
            name = f"zoo/{model}/{info.name}/n{batch}"
            if key in layers:
                layers[key] = dataclasses.replace(layers[key], also=layers[key].also + (name,))
                continue
            layers[key] = Case(name=name, source="zoo", n=n, h=h, w=w, c=c, k=k, r=r, s=s,
                               stride=tuple(info.stride), padding=padding, dilation=tuple(info.dilation or (1, 1)),
                               groups=int(info.groups or 1), layout="NHWC", kind="bf16",
                               activation=info.activation, residual=False)
    return list(layers.values())


def quick_zoo_layers(batch: int, count: int = QUICK_ZOO_LAYERS) -> list[Case]:
    """The cheapest layer of each of `count` models: a smoke test's share of the zoo."""
    picked, models = [], set()
    for case in sorted(zoo_layers(batch), key=lambda c: c.flops()):
        model = case.name.split("/")[1]
        if model not in models:
            picked.append(case)
            models.add(model)
        if len(picked) == count:
            break
    return picked


def zoo_cases(batches: Sequence[int], kinds: Sequence[str], quick: bool = False) -> list[Case]:
    """Each zoo layer at each batch in each kind, a layer's kinds next to each other (fp32 and
    fp32 "highest" share inputs and the reference)."""
    cases = []
    for batch in batches:
        for layer in (quick_zoo_layers(batch) if quick else zoo_layers(batch)):
            cases += [dataclasses.replace(layer, name=f"{layer.name}/{kind}", kind=kind) for kind in kinds]
    return cases


# ---------------------------------------------------------------- inputs and the reference


@functools.partial(jax.jit, static_argnames=("shapes", "scales", "dtype"))
def _normal_arrays(key, shapes, scales, dtype):
    """scale * N(0, 1) arrays of `shapes`, drawn in float32 and cast to dtype."""
    keys = jax.random.split(key, len(shapes))
    return tuple((scale * jax.random.normal(k, shape)).astype(dtype) for k, shape, scale in zip(keys, shapes, scales))


def draw_inputs(case: Case, seed: int) -> tuple:
    """x, w, bias (and the residual) in the case's dtype: x, residual ~ N(0, 1), w ~ N(0, 1/fan-in),
    bias ~ N(0, 0.01). Keyed by input_key: a case's inputs do not depend on the others, and cases
    that differ only in precision get the same ones (and share the compiled draw)."""
    root = jax.random.key(seed, impl="rbg")  # compiles in a fraction of threefry's time per shape
    key = jax.random.fold_in(root, zlib.crc32(case.input_key.encode()))
    shapes = (case.x_shape, case.w_shape, (case.k,)) + ((case.out_shape(),) if case.residual else ())
    scales = (1.0, 1.0 / math.sqrt(case.terms), 0.1) + ((1.0,) if case.residual else ())
    return _normal_arrays(key, shapes, scales, case.dtype)


def conv2d_fn(case: Case, algorithm: str):
    """conv2d of the case with `algorithm`, over (x, w, bias[, residual])."""

    def fn(x, w, b, residual=None):
        return jaxcnn.conv2d(x, w, b, residual=residual, stride=case.stride, padding=case.padding,
                             dilation=case.dilation, groups=case.groups, activation=case.activation,
                             layout=case.layout, precision=case.precision, algorithm=algorithm)

    return fn


def sample_images(case: Case) -> list[int]:
    """The images of the batch the float64 reference checks."""
    return sorted({0, case.n - 1})[:REFERENCE_IMAGES]


@functools.partial(jax.jit, static_argnames=("layout", "images"))
def compare(y_auto, y_xla, x, residual, *, layout: str, images: tuple[int, ...]):
    """The sampled images of auto's and XLA's outputs and of the inputs (NHWC, float32) and, over
    the whole outputs, whether auto's is finite, max |auto - XLA| and max |XLA|."""

    def sampled(a):
        return jnp.transpose(a, [layout.index(d) for d in "NHWC"])[np.array(images)].astype(jnp.float32)

    auto, xla = y_auto.astype(jnp.float32), y_xla.astype(jnp.float32)
    return dict(y_auto=sampled(y_auto), y_xla=sampled(y_xla), x=sampled(x),
                residual=None if residual is None else sampled(residual), finite=jnp.all(jnp.isfinite(auto)),
                diff=jnp.max(jnp.abs(auto - xla)), scale=jnp.max(jnp.abs(xla)))


ACTIVATIONS_F64 = {
    None: lambda y: y,
    "relu": lambda y: np.maximum(y, 0.0),
    "relu6": lambda y: np.clip(y, 0.0, 6.0),
    "silu": lambda y: y / (1.0 + np.exp(-y)),
}


def explicit_padding(case: Case) -> tuple[tuple[int, int], tuple[int, int]]:
    """The case's padding as ((top, bottom), (left, right)); SAME/VALID as lax defines them."""
    p = case.padding
    if isinstance(p, str):
        window = [d * (f - 1) + 1 for d, f in zip(case.dilation, (case.r, case.s))]
        return tuple(tuple(v) for v in lax.padtype_to_pads((case.h, case.w), window, case.stride, p))
    if isinstance(p, int):
        return ((p, p), (p, p))
    if isinstance(p[0], int):
        return ((p[0], p[0]), (p[1], p[1]))
    return tuple(tuple(v) for v in p)


def reference_f64(case: Case, x, w, b, residual=None) -> np.ndarray:
    """activation(conv(x, w) + b + residual) in float64 with numpy, one batched matmul per filter
    tap (x, residual: NHWC images; w: HWIO): independent of jax's and jaxcnn's convolutions."""
    x = np.asarray(x, np.float64)
    (pt, pb), (pl, pr) = explicit_padding(case)
    (sh, sw), (dh, dw), g = case.stride, case.dilation, case.groups
    n, h, wd, c = x.shape
    r, s, cg, k = case.w_shape
    # taps [r, s, groups, C/groups, K/groups]: group j maps its input channels to its K/groups outputs
    taps = np.asarray(w, np.float64).reshape(r, s, cg, g, k // g).transpose(0, 1, 3, 2, 4)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    p = (h + pt + pb - dh * (r - 1) - 1) // sh + 1
    q = (wd + pl + pr - dw * (s - 1) - 1) // sw + 1
    y = np.zeros((g, n * p * q, k // g))
    for i in range(r):
        for j in range(s):
            window = xp[:, i * dh: i * dh + (p - 1) * sh + 1: sh, j * dw: j * dw + (q - 1) * sw + 1: sw, :]
            y += np.matmul(window.reshape(n * p * q, g, cg).transpose(1, 0, 2), taps[i, j])
    y = y.transpose(1, 0, 2).reshape(n, p, q, k) + np.asarray(b, np.float64)
    if residual is not None:
        y = y + np.asarray(residual, np.float64)
    return ACTIVATIONS_F64[case.activation](y)


def tolerance(case: Case) -> float:
    """Largest max |error| / max |reference| a correct conv2d has for the case: OUTPUT_ROUNDINGS
    roundings of the output's dtype, plus TAIL times the random-sign errors of the two rounded
    multiplicands and of an fp32 sum of `terms` terms."""
    u_out = UNIT_ROUNDOFF[case.dtype]
    return OUTPUT_ROUNDINGS * u_out + TAIL * (2 * MMA_ROUNDOFF[case.kind]
                                              + ACCUMULATOR_ROUNDOFF * math.sqrt(case.terms))


def auto_error(row: dict) -> float:
    """A checked row's auto error; inf where it was not finite (the JSON keeps that as null)."""
    err = row["correctness"]["rel_err_auto"]
    return math.inf if err is None else err


def rel_error(out, ref) -> float:
    """max |out - ref| / max |ref|; anything non-finite in out gives inf, so it never passes."""
    out = np.asarray(out, np.float64)
    if not np.all(np.isfinite(out)):
        return math.inf
    return float(np.max(np.abs(out - ref))) / max(float(np.max(np.abs(ref))), 1e-30)


# ---------------------------------------------------------------- running a chunk


def chunks(cases: Sequence[Case]) -> list[list[Case]]:
    """Consecutive cases, at most CHUNK_CASES and about CHUNK_BYTES (x3: inputs and two outputs)."""
    out, current, size = [], [], 0.0
    for case in cases:
        b = 3 * case.bytes()
        if current and (len(current) >= CHUNK_CASES or size + b > CHUNK_BYTES):
            out.append(current)
            current, size = [], 0.0
        current.append(case)
        size += b
    return out + ([current] if current else [])


def avals(case: Case) -> tuple:
    dtype = jnp.dtype(case.dtype)
    struct = jax.ShapeDtypeStruct
    return (struct(case.x_shape, dtype), struct(case.w_shape, dtype), struct((case.k,), dtype),
            struct(case.out_shape(), dtype) if case.residual else None)


def decision_dict(d) -> dict:
    return dict(choice=d.choice, source=d.source, reason=d.reason, times_ms=dict(d.times_ms),
                errors=dict(d.errors), explain=d.explain())


def decide_chunk(cases: Sequence[Case], cache: Path) -> tuple[dict[str, dict], float, str | None]:
    """Each case's decision, all in one decide_all batch into `cache`; seconds it took; error."""
    start = time.perf_counter()
    try:
        sites = [conv_site(*avals(c), c.config()) for c in cases]
        decisions = decide_all(sites, cache=AutotuneCache(cache))
    except Exception as e:  # the decision owner failing is the finding: the traces will say more
        return {}, time.perf_counter() - start, f"{type(e).__name__}: {e}"[:1000]
    return {c.name: decision_dict(d) for c, d in zip(cases, decisions)}, time.perf_counter() - start, None


def prepare(case: Case, seed: int) -> dict:
    """Draw the inputs, compile and run auto and XLA once, compare them: on a compile thread."""
    out: dict[str, Any] = dict(case=case)
    try:
        args = draw_inputs(case, seed)
        out["args"] = args
        out["fns"] = {v: conv2d_fn(case, v) for v in VARIANTS}
        started = time.perf_counter()
        y_auto = jax.block_until_ready(jax.jit(out["fns"]["auto"])(*args))
        out["first_call_s"] = time.perf_counter() - started
        y_xla = jax.block_until_ready(jax.jit(out["fns"]["xla"])(*args))
        residual = args[3] if case.residual else None
        compared = jax.device_get(compare(y_auto, y_xla, args[0], residual, layout=case.layout,
                                          images=tuple(sample_images(case))))
        out["sampled"] = dict(compared, w=np.asarray(args[1], np.float32), b=np.asarray(args[2], np.float32))
    except Exception as e:  # one broken case must not hide the others
        out["error"] = f"{type(e).__name__}: {e}"[:1000]
        out["traceback"] = traceback.format_exc()[-3000:]
    return out


def check(case: Case, sampled: dict, reference: np.ndarray) -> dict:
    """auto's (and XLA's) error against the float64 reference; finite over the whole output."""
    tol = tolerance(case)
    auto_err = rel_error(sampled["y_auto"], reference)
    finite = bool(sampled["finite"])
    scale = float(sampled["scale"])
    ok = finite and auto_err <= tol
    return dict(rel_err_auto=auto_err, rel_err_xla=rel_error(sampled["y_xla"], reference), tolerance=tol,
                finite=finite, images=sample_images(case), ok=ok,
                auto_vs_xla=float(sampled["diff"]) / scale if scale > 0 else None)


def reference_for(case: Case, sampled: dict, memo: dict) -> np.ndarray | str:
    """The float64 reference of the sampled images (or why it failed), shared through `memo` by
    cases with the same inputs."""
    if case.input_key not in memo:
        try:
            memo[case.input_key] = reference_f64(case, sampled["x"], sampled["w"], sampled["b"], sampled["residual"])
        except Exception as e:  # recorded on the case; the others go on
            return f"{type(e).__name__}: {e}"[:1000]
    return memo[case.input_key]


def run_chunk(cases: Sequence[Case], *, seed: int, iters: int, warmup: int, cache: Path, spec,
              memo: dict) -> tuple[list[dict], dict]:
    """Decide, compile, check and time one chunk; its rows and the seconds of each phase."""
    seconds = {}
    decisions, seconds["decide"], decide_error = decide_chunk(cases, cache)
    # conv2d's "auto" traces read the decisions from the same file (their default cache).
    os.environ[AUTOTUNE_CACHE_ENV] = str(cache)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=COMPILE_THREADS) as pool:
        prepared = list(pool.map(lambda c: prepare(c, seed), cases))
    seconds["compile"] = time.perf_counter() - started
    ready = [p for p in prepared if "error" not in p]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as host:
        # The host's float64 references run while the device is timed.
        refs = host.submit(lambda: {p["case"].name: reference_for(p["case"], p["sampled"], memo) for p in ready})
        runs = [((p["case"].name, v), p["fns"][v], p["args"]) for p in ready for v in VARIANTS]
        times, time_error = {}, None
        try:
            times = device_times(runs, iters=iters, warmup=warmup, top_k=3) if runs else {}
        except Exception as e:  # recorded on every case of the chunk; the next chunk goes on
            time_error = f"timing: {type(e).__name__}: {e}"[:1000]
        seconds["time"] = time.perf_counter() - started
        references = refs.result()
    seconds["time_and_reference"] = time.perf_counter() - started
    rows = []
    for p in prepared:
        case = p["case"]
        row = dict(case.to_json(), decision=decisions.get(case.name), ok=False)
        if decide_error:
            row["decision_error"] = decide_error
        if "error" in p:
            row.update(error=p["error"], traceback=p["traceback"])
            rows.append(row)
            continue
        row["trace_decision"] = trace_decision(case, cache)
        row["first_call_s"] = p["first_call_s"]
        if isinstance(references[case.name], str):
            row["error"] = f"float64 reference: {references[case.name]}"
        elif time_error:
            row["error"] = time_error
        if "error" in row:
            rows.append(row)
            continue
        row["correctness"] = check(case, p["sampled"], references[case.name])
        row["timings"] = {v: timing_dict(times[(case.name, v)]) for v in VARIANTS}
        row["device_time"] = all(t["is_device_time"] for t in row["timings"].values())
        row["ratio"] = row["timings"]["xla"]["median_ms"] / row["timings"]["auto"]["median_ms"]
        row["floor"] = floor(case, spec)
        if row["floor"]:
            row["pct_of_floor"] = {v: 100 * row["floor"]["floor_ms"] / t["median_ms"]
                                   for v, t in row["timings"].items()}
        row["ok"] = row["correctness"]["ok"]
        rows.append(row)
    return rows, seconds


def trace_decision(case: Case, cache: Path) -> dict:
    """The decision conv2d's trace read (the same cache): its choice and source."""
    try:
        d = decide_conv(*avals(case), case.config(), cache=AutotuneCache(cache))
    except Exception as e:  # recorded: the auto trace met the same
        return dict(choice=None, source=None, error=f"{type(e).__name__}: {e}"[:1000])
    return dict(choice=d.choice, source=d.source)


def floor(case: Case, spec) -> dict | None:
    if spec is None:
        return None
    return dict(floor_ms(case.flops(), case.bytes(), spec, PRECISION_CLASS[case.kind]),
                precision=PRECISION_CLASS[case.kind])


# ---------------------------------------------------------------- summaries


def distribution(ratios: Sequence[float]) -> dict | None:
    """min, p5, median, p95, max and geometric mean of the ratios (None when there are none)."""
    if not ratios:
        return None
    v = np.asarray(ratios, np.float64)
    p5, median, p95 = np.percentile(v, [5, 50, 95])
    return dict(cases=int(v.size), min=float(v.min()), p5=float(p5), median=float(median), p95=float(p95),
                max=float(v.max()), geomean=float(np.exp(np.mean(np.log(v)))))


def _timed(rows: Sequence[dict], **match) -> list[dict]:
    return [r for r in rows if "ratio" in r and all(r.get(k) == v for k, v in match.items())]


def _choice(row: dict) -> str:
    return (row.get("decision") or {}).get("choice", "undecided")


def distributions(rows: Sequence[dict]) -> list[dict]:
    """The ratio distributions the report shows: each group's label and distribution."""
    groups = [("random sweep", _timed(rows, source="random")), ("random + zoo", _timed(rows))]
    for kind in KINDS:
        groups.append((f"random {kind}", _timed(rows, source="random", kind=kind)))
    random = _timed(rows, source="random")
    for choice in sorted({_choice(r) for r in random}):
        groups.append((f"random, auto chose {choice}", [r for r in random if _choice(r) == choice]))
    groups.append(("zoo", _timed(rows, source="zoo")))
    for kind in ZOO_KINDS:
        for n in ZOO_BATCHES:
            groups.append((f"zoo {kind} N={n}", _timed(rows, source="zoo", kind=kind, n=n)))
    out = []
    for label, group in groups:
        d = distribution([r["ratio"] for r in group])
        if d:
            out.append(dict(group=label, **d))
    return out


def device_timed(rows: Sequence[dict]) -> bool:
    """Every timed row has device time."""
    timed = _timed(rows)
    return bool(timed) and all(r["device_time"] for r in timed)


def times_kernels(rows: Sequence[dict], env: dict) -> bool:
    """The ratios are speedups: device time, and auto could run jaxcnn's kernels (not the lax
    reference a CPU falls back to)."""
    return device_timed(rows) and bool(env.get("jaxcnn_cuda_available"))


def goals(rows: Sequence[dict], env: dict) -> list[dict]:
    """Issue 33's goals: what each measures ("ratio" or "error"), the measured value and met
    (None where the rows say nothing: no such cases, or ratios that are no speedups)."""
    real = times_kernels(rows, env)

    def goal(text, of, value, target, detail="", above=True):
        met = None if value is None or not real else (value >= target if above else value <= target)
        return dict(goal=text, of=of, value=value, target=target, met=met, detail=detail)

    sweep = distribution([r["ratio"] for r in _timed(rows, source="random")]) or {}
    out = [goal(f"random sweep {stat} >= {target}x", "ratio", sweep.get(stat), target) for stat, target in SWEEP_GOALS]
    zoo = _timed(rows, source="zoo")
    worst = min(zoo, key=lambda r: r["ratio"]) if zoo else None
    out.append(goal(f"every zoo layer >= {ZOO_EACH_GOAL}x", "ratio", worst and worst["ratio"], ZOO_EACH_GOAL,
                    f"{sum(r['ratio'] < ZOO_EACH_GOAL for r in zoo)} of {len(zoo)} below"
                    + (f"; worst {worst['name']}" if worst else "")))
    wide = [r for r in _timed(rows, source="zoo", kind="fp32_highest") if r["c"] >= HIGHEST_MIN_CHANNELS]
    geo = distribution([r["ratio"] for r in wide]) or {}
    out.append(goal(f"fp32 highest geomean >= {HIGHEST_ZOO_GEOMEAN_GOAL}x over zoo layers with C >= "
                    f"{HIGHEST_MIN_CHANNELS}", "ratio", geo.get("geomean"), HIGHEST_ZOO_GEOMEAN_GOAL,
                    f"{len(wide)} layers"))
    out.append(goal(f"fp32 highest >= {HIGHEST_ZOO_EACH_GOAL}x on every zoo layer with C >= {HIGHEST_MIN_CHANNELS} "
                    "(item 3)", "ratio", geo.get("min"), HIGHEST_ZOO_EACH_GOAL,
                    f"{sum(r['ratio'] < HIGHEST_ZOO_EACH_GOAL for r in wide)} of {len(wide)} below"))
    highest = [r for r in rows if r.get("correctness") and r["kind"] == "fp32_highest"]
    err = max((auto_error(r) for r in highest), default=None)
    out.append(goal(f"fp32 highest max rel error <= {HIGHEST_GOAL_ERROR:.0e} vs float64 (item 3)", "error", err,
                    HIGHEST_GOAL_ERROR, f"{sum(auto_error(r) > HIGHEST_GOAL_ERROR for r in highest)} of "
                    f"{len(highest)} cases above", above=False))
    return out


# ---------------------------------------------------------------- reports


def _ms(t: dict | None) -> str:
    if not t:
        return "-"
    return f"{t['median_ms']:.4g} [{t['p10_ms']:.4g}-{t['p90_ms']:.4g}]"


def _verdict(met) -> str:
    return "n/a" if met is None else ("met" if met else "MISSED")


def _times_text(decision: dict | None) -> str:
    if not decision or not decision.get("times_ms"):
        return "-"
    return ", ".join(f"{n} {'failed' if t is None else format(t, '.4g')}" for n, t in
                     sorted(decision["times_ms"].items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)))


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(env: dict, rows: list[dict], meta: dict) -> str:
    real = times_kernels(rows, env)
    git = env.get("git") or {}
    seconds = meta["seconds"]
    sources = {}
    for r in rows:
        d = r.get("decision") or {}
        sources[d.get("source", "none")] = sources.get(d.get("source", "none"), 0) + 1
    lines = ["# conv2d(algorithm=\"auto\") vs XLA: random shape sweep and zoo layers (issue 33)", ""]
    if not env.get("jaxcnn_cuda_available"):
        reason = env.get("jaxcnn_cuda_unavailable_reason")
        lines += [f"> **WARNING: jaxcnn's CUDA kernels are NOT available ({reason}): "
                  "auto runs the lax reference, so the ratios say nothing about jaxcnn's kernels.**", ""]
    if rows and not device_timed(rows):
        lines += ["> **WARNING: no GPU trace: times are host wall time, not device time; no goal verdicts.**", ""]
    lines += [
        "## Setup",
        "",
        f"- device: {env['device_kind']} ({env.get('nvidia_smi') or 'no nvidia-smi'}); jax {env['jax']}, "
        f"jaxlib {env['jaxlib']}; commit {git.get('commit', 'unknown')}{' (dirty)' if git.get('dirty') else ''}; "
        f"{env['date_utc']}",
        f"- cases: {meta['random_cases']} random (seed {meta['seed']}) + {meta['zoo_cases']} zoo "
        f"(batches {meta['zoo_batches']}, kinds {meta['zoo_kinds']}); {len(rows)} ran"
        + (f", {meta['planned'] - len(rows)} not reached (--budget-s {meta['budget_s']:g}; --resume this JSON runs "
           "them)" if meta["planned"] > len(rows) else "")
        + (f"; {meta['resumed']['rows']} of them from {meta['resumed']['path']}" if meta.get("resumed") else ""),
        "- variants: jaxcnn.conv2d(algorithm=\"auto\") vs algorithm=\"xla\" (XLA's conv, then bias, residual and "
        "activation in x's dtype), each jitted; ratio = XLA / auto (> 1: auto faster).",
        f"- times: median [p10-p90] per call over {meta['iters']} synced calls, ms, "
        + ("device time (sum of GPU kernel durations)." if device_timed(rows) else "HOST WALL TIME."),
        "- correctness: images " + f"{REFERENCE_IMAGES} (first, last) of each batch vs a float64 numpy reference; "
        f"tolerance = {OUTPUT_ROUNDINGS} u_out + {TAIL:g} (2 u_mma + 2^-24 sqrt(R*S*C/groups)); any NaN/inf fails.",
        f"- decisions: decide_all per chunk (<= {CHUNK_CASES} cases) into a fresh cache ({meta['cache_dir']}); "
        f"sources {', '.join(f'{k} {v}' for k, v in sorted(sources.items()))}.",
        f"- seconds: decide {seconds['decide']:.1f} ({1e3 * seconds['decide'] / max(meta['ran'], 1):.0f} ms a case), "
        f"compile + first runs {seconds['compile']:.1f}, timing "
        f"{seconds['time']:.1f} (+ float64 references alongside: {seconds['time_and_reference']:.1f}), "
        f"total {seconds['total']:.1f}.",
        "- % floor = roofline floor (FLOPs at the kind's peak, fp32 highest at the CUDA-core fp32 peak; bytes "
        "of x, w, bias, residual and output at the bandwidth) / median.",
        "",
        "## Goals (issue 33)",
        "",
    ]
    for g in goals(rows, env):
        detail = f" ({g['detail']})" if g.get("detail") else ""
        if real:
            lines.append(f"- {g['goal']}: {_fmt(g['value'], '.3g')}{detail}: {_verdict(g['met'])}")
        elif g["of"] == "error":
            lines.append(f"- {g['goal']}: {_fmt(g['value'], '.3g')}{detail} (the lax fallback's): n/a")
        else:
            lines.append(f"- {g['goal']}: n/a (no device time of jaxcnn's kernels)")
    lines += ["", "## Ratio distribution (XLA / auto)", ""]
    if real:
        lines += speedup_tables(rows)
    else:
        lines.append("- not shown: without device time of jaxcnn's kernels the ratios are no speedups "
                     "(each case's times are in the JSON).")
    failed = [r for r in rows if r.get("correctness") and not r["correctness"]["ok"]]
    lines += ["", "## Correctness failures", ""]
    lines += [f"- {r['name']} {r['description']} {r['kind']} (auto chose {_choice(r)}): rel err "
              f"{_fmt(r['correctness']['rel_err_auto'], '.2e')} > {r['correctness']['tolerance']:.2e}"
              f" (XLA {_fmt(r['correctness']['rel_err_xla'], '.2e')}), finite {r['correctness']['finite']}"
              for r in failed] or ["- none"]
    checked = [r for r in rows if r.get("correctness")]
    if checked:
        margin = max(checked, key=lambda r: auto_error(r) / r["correctness"]["tolerance"])
        lines.append(f"- closest to its tolerance: {margin['name']} ({margin['kind']}): "
                     f"{auto_error(margin):.2e} of {margin['correctness']['tolerance']:.2e}")
        lines += ["", "| kind | cases | max rel err auto | max rel err XLA | tolerances | failures |",
                  "|---|---|---|---|---|---|"]
        for kind in KINDS:
            group = [r for r in checked if r["kind"] == kind]
            if group:
                c = [r["correctness"] for r in group]
                xla = [math.inf if e["rel_err_xla"] is None else e["rel_err_xla"] for e in c]
                lines.append(f"| {kind} | {len(group)} | {max(auto_error(r) for r in group):.2e} | {max(xla):.2e} | "
                             f"{min(e['tolerance'] for e in c):.1e}-{max(e['tolerance'] for e in c):.1e} | "
                             f"{sum(not e['ok'] for e in c)} |")
    drift = [r for r in rows if r.get("trace_decision") and r.get("decision")
             and r["trace_decision"]["choice"] != r["decision"]["choice"]]
    lines += ["", "## Decisions", ""]
    counts: dict[tuple, int] = {}
    for r in rows:
        key = (r["kind"], _choice(r))
        counts[key] = counts.get(key, 0) + 1
    lines += [f"- {kind}: " + ", ".join(f"{c} {n}" for (k, c), n in sorted(counts.items()) if k == kind)
              for kind in KINDS if any(k == kind for k, _ in counts)]
    lines.append("- trace-time decision differs from the pre-decided one: "
                 + (", ".join(f"{r['name']} ({r['decision']['choice']} -> {r['trace_decision']['choice']})"
                              for r in drift) or "none"))
    errors = [r for r in rows if "error" in r or "decision_error" in r]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- {r['name']} {r['description']} {r['kind']}: "
                  f"{_escape(r.get('error') or r['decision_error'])[:300]}"
                  for r in errors]
    return "\n".join(lines) + "\n"


def speedup_tables(rows: list[dict]) -> list[str]:
    """The distributions, the worst cases and the zoo layers below ZOO_EACH_GOAL, as markdown."""
    lines = ["| group | cases | min | p5 | median | p95 | max | geomean |", "|---|---|---|---|---|---|---|---|"]
    for d in distributions(rows):
        lines.append(f"| {d['group']} | {d['cases']} | " + " | ".join(
            f"{d[k]:.3f}" for k in ("min", "p5", "median", "p95", "max", "geomean")) + " |")
    lines += ["", f"## The {WORST} worst cases", "",
              "| case | shape | kind | choice (source) | decision times ms | auto ms | XLA ms | ratio "
              "| % floor auto / XLA |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(_timed(rows), key=lambda r: r["ratio"])[:WORST]:
        d = r.get("decision") or {}
        pct = r.get("pct_of_floor") or {}
        lines.append(f"| {r['name']} | {_escape(r['description'])} | {r['kind']} | {d.get('choice', '-')} "
                     f"({d.get('source', '-')}) | {_escape(_times_text(d))} | {_ms(r['timings']['auto'])} | "
                     f"{_ms(r['timings']['xla'])} | {r['ratio']:.3f} | {_fmt(pct.get('auto'), '.0f')} / "
                     f"{_fmt(pct.get('xla'), '.0f')} |")
    below = sorted((r for r in _timed(rows, source="zoo") if r["ratio"] < ZOO_EACH_GOAL), key=lambda r: r["ratio"])
    lines += ["", f"## Zoo layers below {ZOO_EACH_GOAL}x", ""]
    lines += [f"- {r['name']} ({r['description']}): {r['ratio']:.3f}, auto chose {_choice(r)}"
              for r in below[:ZOO_BELOW_LISTED]] or ["- none"]
    if len(below) > ZOO_BELOW_LISTED:
        lines.append(f"- and {len(below) - ZOO_BELOW_LISTED} more (JSON)")
    return lines


def write_reports(out: Path, stem: str, env: dict, rows: list[dict], meta: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    report = dict(environment=env, meta=meta, goals=goals(rows, env), distributions=distributions(rows), rows=rows)
    (out / f"{stem}.json").write_text(json.dumps(_json_safe(report), indent=1, allow_nan=False) + "\n")
    markdown = render_markdown(env, rows, meta)
    (out / f"{stem}.md").write_text(markdown)
    return markdown


# ---------------------------------------------------------------- command line


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for <gpu>-<date>-NAME.{json,md}")
    p.add_argument("--name", default="conv_sweep", help="report name (default conv_sweep)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"random shapes and inputs (default {DEFAULT_SEED})")
    p.add_argument("--cases", type=int, help=f"random cases (default {DEFAULT_CASES}; --quick {QUICK_CASES})")
    p.add_argument("--iters", type=int, help=f"timed calls per variant (default 20; --quick {QUICK_ITERS})")
    p.add_argument("--warmup", type=int, help="untimed calls first (default 3; --quick 1)")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_CASES} small random cases, {QUICK_ITERS} calls, {QUICK_ZOO_LAYERS} zoo layers")
    p.add_argument("--no-zoo", action="store_true", help="random cases only")
    p.add_argument("--zoo-batches", type=lambda s: [int(v) for v in s.split(",")], default=list(ZOO_BATCHES))
    p.add_argument("--zoo-kinds", type=lambda s: s.split(","), default=list(ZOO_KINDS),
                   help=f"among {', '.join(KINDS)} (default {','.join(ZOO_KINDS)})")
    p.add_argument("--cache-dir", type=Path, help="where the fresh autotune caches go (default OUT/<report>-autotune)")
    p.add_argument("--resume", type=Path, metavar="JSON",
                   help="an earlier report of the same sweep (seed, cases, zoo): keep its rows, run the cases it lacks")
    p.add_argument("--budget-s", type=float, default=BUDGET_S,
                   help=f"start no chunk expected to end after this many seconds (default {BUDGET_S:g}; 0: none); "
                        "the report lists the cases not reached, --resume runs them")
    args = p.parse_args(argv)
    bad = [k for k in args.zoo_kinds if k not in KINDS]
    if bad:
        p.error(f"unknown --zoo-kinds {bad}; known: {', '.join(KINDS)}")
    args.cases = args.cases if args.cases is not None else (QUICK_CASES if args.quick else DEFAULT_CASES)
    args.iters = args.iters or (QUICK_ITERS if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    return args


def resumed_rows(path: Path, seed: int) -> list[dict]:
    """The rows of an earlier report of the same seed (their cases are not run again)."""
    report = json.loads(path.read_text())
    if report["meta"]["seed"] != seed:
        raise ValueError(f"--resume {path} is a sweep of seed {report['meta']['seed']}, not {seed}")
    return report["rows"]


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    stem = f"{gpu_slug()}-{time.strftime('%Y-%m-%d', time.gmtime())}-{args.name}"
    cache_dir = args.cache_dir or args.out / f"{stem}-autotune"
    cache_dir.mkdir(parents=True, exist_ok=True)
    for stale in cache_dir.glob("chunk-*.json"):  # decisions start from nothing
        stale.unlink()
    rows: list[dict] = resumed_rows(args.resume, args.seed) if args.resume else []
    cases = random_cases(args.seed, args.cases, QUICK_LIMITS if args.quick else LIMITS)
    n_random = len(cases)
    if not args.no_zoo:
        cases += zoo_cases(args.zoo_batches, args.zoo_kinds, quick=args.quick)
    done = {r["name"] for r in rows}
    todo = [c for c in cases if c.name not in done]
    spec = lookup_gpu_spec()
    env = environment(spec)
    seconds = dict(decide=0.0, compile=0.0, time=0.0, time_and_reference=0.0, total=0.0)
    meta = dict(seed=args.seed, random_cases=n_random, zoo_cases=len(cases) - n_random, planned=len(cases),
                zoo_batches=args.zoo_batches, zoo_kinds=args.zoo_kinds, iters=args.iters, warmup=args.warmup,
                quick=args.quick, cache_dir=str(cache_dir), seconds=seconds, chunks=[], ran=0, budget_s=args.budget_s,
                resumed=dict(path=str(args.resume), rows=len(rows)) if args.resume else None,
                limits=dataclasses.asdict(QUICK_LIMITS if args.quick else LIMITS))
    markdown = write_reports(args.out, stem, env, rows, meta)  # fail early on a bad --out
    memo: dict[str, np.ndarray] = {}
    pending = chunks(todo)
    for i, chunk in enumerate(pending):
        ran = meta["ran"]
        expected = (time.perf_counter() - started) + (seconds["total"] / ran * len(chunk) if ran else 0.0)
        if ran and args.budget_s and expected > args.budget_s:
            meta["not_reached"] = [c.name for rest in pending[i:] for c in rest]
            print(f"budget: {len(meta['not_reached'])} cases not reached (--resume <this JSON> runs them)", flush=True)
            write_reports(args.out, stem, env, rows, meta)
            break
        cache = cache_dir / f"chunk-{i:03d}.json"
        chunk_rows, chunk_seconds = run_chunk(chunk, seed=args.seed, iters=args.iters, warmup=args.warmup,
                                              cache=cache, spec=spec, memo=memo)
        # Only the chunk's last inputs can recur (its fp32 zoo layer's "highest" twin, next chunk).
        memo = {k: v for k, v in memo.items() if k == chunk[-1].input_key}
        rows += chunk_rows
        for k, v in chunk_seconds.items():
            seconds[k] += v
        seconds["total"] = time.perf_counter() - started
        meta["chunks"].append(dict(cases=len(chunk), **chunk_seconds))
        meta["ran"] += len(chunk)
        bad = [r["name"] for r in chunk_rows if not r["ok"]]
        print(f"chunk {i + 1}/{len(pending)}: {len(chunk)} cases, "
              + ", ".join(f"{k} {v:.1f} s" for k, v in chunk_seconds.items())
              + (f"; NOT OK: {', '.join(bad)}" if bad else ""), flush=True)
        markdown = write_reports(args.out, stem, env, rows, meta)
    return final_status(markdown, rows, require_rows=True)


if __name__ == "__main__":
    sys.exit(main())
