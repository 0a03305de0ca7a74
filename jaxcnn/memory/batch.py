"""Batch planning: the largest batch whose compiled program fits a memory budget.

The memory a program needs is its *footprint* (footprint.py): argument + output - alias + temp
bytes of XLA's compiled memory_analysis().

`max_batch` compiles the program at a few small batches (probe_batches), fits the footprint as
affine in the batch (activations grow with it, params and optimizer state do not), predicts the
largest batch under the budget, and verifies it by compiling at that batch and the next one.
When the fit is off (XLA switches algorithms or layouts with the batch, or the footprint is
not affine) it searches between the last batch known to fit and the first known not to, by
interpolation with a bisection fallback, until it has a batch n with
footprint(n) <= budget < footprint(n + 1). Only shapes are compiled, nothing runs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from jaxcnn.memory import training
from jaxcnn.memory.donation import jit as donating_jit
from jaxcnn.memory.footprint import footprint_bytes, memory_stats

# program(batch) -> (fn, example args): fn is jitted here unless it has .lower (jax.jit or
# jaxcnn.jit objects keep their own donation); args may be ShapeDtypeStructs.
Program = Callable[[int], tuple[Callable, tuple]]

DEFAULT_PROBES = (1, 2, 4)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int | float) -> int:
    """'8GiB', '512 MiB', '1.5GB', '1000000' or a number -> whole bytes (KiB/MiB/GiB binary)."""
    if isinstance(text, (int, float, np.integer, np.floating)) and not isinstance(text, bool):
        if not text >= 1:  # also rejects NaN
            raise ValueError(f"budget must be at least one byte, got {text}")
        return int(text)
    if not isinstance(text, str):
        raise TypeError(f"budget must be a number of bytes or a string like '8GiB', got {type(text).__name__}")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size: use a number with B, KiB, MiB, GiB, KB, MB or GB")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"budget must be positive, got {text!r}")
    return value


def _lower(fn: Callable, args: tuple):
    lower = getattr(fn, "lower", None)
    return (lower if lower is not None else jax.jit(fn).lower)(*args)


def compile_stats(program: Program, batch: int) -> dict[str, int]:
    """memory_stats of program(batch), compiled, plus 'footprint_bytes'."""
    fn, args = program(batch)
    stats = memory_stats(_lower(fn, args).compile())
    return {**stats, "footprint_bytes": footprint_bytes(stats)}


@dataclass(frozen=True)
class AffineFit:
    """footprint(batch) ~ intercept + slope * batch, least squares over the probes."""

    intercept: float
    slope: float
    batches: tuple[int, ...]
    footprints: tuple[int, ...]

    @classmethod
    def of(cls, batches, footprints) -> AffineFit:
        b, f = np.asarray(batches, float), np.asarray(footprints, float)
        if len(set(batches)) < 2:
            raise ValueError(f"an affine fit needs two distinct batches, got {list(batches)}")
        slope, intercept = np.polyfit(b, f, 1)
        return cls(float(intercept), float(slope), tuple(int(x) for x in batches), tuple(int(x) for x in footprints))

    def predict(self, batch: int) -> float:
        return self.intercept + self.slope * batch

    @property
    def max_relative_residual(self) -> float:
        """Largest |fit - footprint| / footprint over the probes (0: exactly affine)."""
        return max(abs(self.predict(b) - f) / f for b, f in zip(self.batches, self.footprints))

    def largest_batch_under(self, budget: int, limit: int) -> int:
        """Largest batch the line keeps <= budget (limit when it does not grow, 0 when even
        batch 1 is over)."""
        if self.slope <= 0:
            return limit if self.predict(1) <= budget else 0
        return int(max(0, min(limit, math.floor((budget - self.intercept) / self.slope))))


@dataclass
class MaxBatch:
    """The answer of max_batch: `batch` is verified unless `verified` is False (compile cap)."""

    budget_bytes: int
    batch: int  # 0: not even batch 1 fits
    predicted_batch: int  # from the affine fit alone
    fit: AffineFit
    footprint: int | None  # at `batch` (None when batch == 0)
    next_footprint: int | None  # at batch + 1 (None at the limit)
    verified: bool
    compiles: int
    stats: dict[int, dict[str, int]] = field(default_factory=dict)  # every batch compiled

    @property
    def prediction_error(self) -> int:
        """predicted - verified batch (0 when the affine fit was exact at the boundary)."""
        return self.predicted_batch - self.batch

    def curve(self) -> list[tuple[int, int]]:
        """(batch, footprint) of every compiled batch, sorted."""
        return sorted((b, s["footprint_bytes"]) for b, s in self.stats.items())

    def as_dict(self) -> dict[str, Any]:
        return dict(budget_bytes=self.budget_bytes, batch=self.batch, predicted_batch=self.predicted_batch,
                    fit_intercept=self.fit.intercept, fit_slope=self.fit.slope,
                    fit_max_relative_residual=self.fit.max_relative_residual,
                    footprint=self.footprint, next_footprint=self.next_footprint,
                    verified=self.verified, compiles=self.compiles, curve=self.curve())

    def explain(self) -> str:
        gib = lambda n: "-" if n is None else f"{n / 2**30:.3f} GiB"  # noqa: E731
        lines = [
            f"budget {gib(self.budget_bytes)}: largest batch {self.batch}"
            + ("" if self.verified else " (not verified: compile cap reached)"),
            f"  fit over batches {list(self.fit.batches)}: {self.fit.intercept / 2**20:.2f} MiB + "
            f"{self.fit.slope / 2**20:.3f} MiB x batch (max residual {100 * self.fit.max_relative_residual:.2f}%)",
            f"  predicted {self.predicted_batch}, verified {self.batch}: footprint {gib(self.footprint)} at "
            f"{self.batch}, {gib(self.next_footprint)} at {self.batch + 1}; {self.compiles} compiles",
        ]
        return "\n".join(lines)


def model_program(model, *, train: bool = False, dtype="float32", backend: str = "xla",
                  optimizer="sgd_momentum", donate: bool = True) -> Program:
    """program(batch) for a zoo model: inference fn(params, images), or with train=True one
    optimizer step (params and optimizer state donated unless donate=False)."""
    if train:
        fn = training.train_step(model, optimizer, backend=backend)
        jitted = donating_jit(fn) if donate else jax.jit(fn)
        return lambda batch: (jitted, training.training_args(model, batch, dtype, optimizer))
    jitted = jax.jit(training.inference_fn(model, backend=backend))
    return lambda batch: (jitted, training.inference_args(model, batch, dtype))


def _as_program(program_or_model, model_kwargs: dict) -> Program:
    if isinstance(program_or_model, str) or type(program_or_model).__name__ == "ModelSpec":
        return model_program(program_or_model, **model_kwargs)
    if model_kwargs:
        raise TypeError(f"{', '.join(model_kwargs)} only apply to a zoo model, not to a program function")
    if not callable(program_or_model):
        raise TypeError(f"program must be a zoo model name, a ModelSpec or program(batch) -> (fn, args), "
                        f"got {type(program_or_model).__name__}")
    return program_or_model


class _Compiler:
    """Compiles program(batch) once per batch, counting compiles."""

    def __init__(self, program: Program, max_compiles: int):
        self.program, self.max_compiles = program, max_compiles
        self.stats: dict[int, dict[str, int]] = {}

    def footprint(self, batch: int) -> int:
        if batch not in self.stats:
            if len(self.stats) >= self.max_compiles:
                raise _CompileCap
            self.stats[batch] = compile_stats(self.program, batch)
        return self.stats[batch]["footprint_bytes"]


class _CompileCap(Exception):
    pass


def max_batch(program_or_model, budget_bytes: int | str, *, probe_batches=DEFAULT_PROBES,
              limit: int = 1 << 16, max_compiles: int = 24, **model_kwargs) -> MaxBatch:
    """Largest batch whose footprint (module doc) is <= budget_bytes.

    program_or_model: a zoo model name / ModelSpec (model_kwargs go to model_program: train,
    dtype, backend, optimizer, donate) or program(batch) -> (fn, example args).
    probe_batches: >= 2 distinct batches for the affine fit; limit: the largest batch tried.
    """
    budget = parse_bytes(budget_bytes)
    program = _as_program(program_or_model, model_kwargs)
    probes = sorted({int(b) for b in probe_batches})
    if len(probes) < 2 or probes[0] < 1:
        raise ValueError(f"probe_batches needs two distinct batches >= 1, got {probe_batches!r}")
    if not isinstance(limit, int) or limit < probes[-1]:
        raise ValueError(f"limit must be an int >= the largest probe batch, got {limit!r}")
    if max_compiles < len(probes) + 2:
        raise ValueError(f"max_compiles must leave room to verify: >= {len(probes) + 2}, got {max_compiles}")

    compiler = _Compiler(program, max_compiles)
    fit = AffineFit.of(probes, [compiler.footprint(b) for b in probes])
    predicted = fit.largest_batch_under(budget, limit)
    verified = True
    try:
        batch = _boundary(compiler, budget, max(predicted, 1), limit)
    except _CompileCap:
        verified = False
        fitting = [b for b in compiler.stats if compiler.footprint(b) <= budget]
        batch = max(fitting, default=0)
    stats = compiler.stats
    return MaxBatch(
        budget_bytes=budget, batch=batch, predicted_batch=predicted, fit=fit,
        footprint=stats[batch]["footprint_bytes"] if batch in stats else None,
        next_footprint=stats[batch + 1]["footprint_bytes"] if batch + 1 in stats else None,
        verified=verified, compiles=len(stats), stats=dict(sorted(stats.items())),
    )


def _boundary(compiler: _Compiler, budget: int, guess: int, limit: int) -> int:
    """n with footprint(n) <= budget < footprint(n + 1) near `guess` (0: batch 1 is over)."""
    fits = lambda b: compiler.footprint(b) <= budget  # noqa: E731
    if fits(guess):
        if guess == limit or not fits(guess + 1):
            return guess
        lo, step = guess + 1, max(1, guess // 8)
        hi = None
        while hi is None:  # grow until a batch is over the budget
            probe = min(limit, lo + step)
            if fits(probe):
                if probe == limit:
                    return limit
                lo, step = probe, step * 2
            else:
                hi = probe
    else:
        if guess == 1:
            return 0
        hi, lo = guess, None
        fitting = [b for b in compiler.stats if b < guess and fits(b)]
        lo = max(fitting, default=None)
        if lo is None:
            if not fits(1):
                return 0
            lo = 1
    # Invariant: fits(lo), not fits(hi), lo < hi. Interpolate on the footprints (exact for an
    # affine footprint); when a step fails to halve the bracket, bisect next (curved footprints).
    interpolate = True
    while hi - lo > 1:
        width = hi - lo
        if interpolate:
            f_lo, f_hi = compiler.footprint(lo), compiler.footprint(hi)
            guess = lo + (budget - f_lo) * (hi - lo) // max(1, f_hi - f_lo)
        else:
            guess = (lo + hi) // 2
        guess = min(max(guess, lo + 1), hi - 1)
        if fits(guess):
            lo = guess
        else:
            hi = guess
        interpolate = 2 * (hi - lo) <= width
    return lo


@dataclass(frozen=True)
class CurvePoint:
    batch: int
    footprint: int
    stats: dict[str, int]


def max_batch_curve(program_or_model, batches, **model_kwargs) -> list[CurvePoint]:
    """Footprint (and XLA's memory stats) of program(batch) for each batch, for plotting."""
    program = _as_program(program_or_model, model_kwargs)
    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1:
        raise ValueError(f"batches must be >= 1, got {batches}")
    points = []
    for b in batches:
        stats = compile_stats(program, b)
        points.append(CurvePoint(b, stats["footprint_bytes"], stats))
    return points
