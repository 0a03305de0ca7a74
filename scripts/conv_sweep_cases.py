"""The cases of scripts/bench_conv_sweep.py (issue 33): what one conv of the sweep is (Case: its
geometry, epilogue, layout and kind, and the shapes, FLOPs and bytes that follow), the random
shapes drawn from a seed within a work bound (random_cases), and every distinct conv layer of the
zoo models (zoo_layers, zoo_cases). Also the kinds a conv's arithmetic runs in and how much work a
case and a device chunk may be.

Imported by bench_conv_sweep after bench_common, which makes jaxcnn importable from a checkout."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from jaxcnn.costmodel.conv_layer import ConvShape
from jaxcnn.models import layer_table, list_models
from jaxcnn.ops.conv2d.config import conv2d_flops, conv2d_output_shape, make_config
from jaxcnn.ops.layout_axes import LAYOUTS, convert_shape

DEFAULT_SEED = 33  # the number: a fixed sweep unless --seed says otherwise
DEFAULT_CASES = 320
QUICK_ZOO_LAYERS = 4

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


# ---------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case(ConvShape):
    """One conv: logical x [n, h, w, c] in `layout`, HWIO weights [r, s, c // groups, k], a bias,
    the activation and (residual) a residual operand of the output's shape. Its sizes are
    ConvShape's fields (n, h, w, c, k, r, s: built by keyword)."""

    name: str
    source: str  # "random" | "zoo"
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
