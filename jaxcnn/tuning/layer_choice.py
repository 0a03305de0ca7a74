"""What autotuning one layer answers: every candidate (layout, algorithm) with its time or why
it cannot run, XLA's time, the layout transforms around the layer, the winner and the rule."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from jaxcnn.ops.layout_axes import LAYOUTS
from jaxcnn.tuning.layer import Layer
from jaxcnn.tuning.layout_rules import RuleChoice
from jaxcnn.tuning.text_table import fmt_ms, text_table


@dataclass(frozen=True)
class CandidateResult:
    """One (layout, algorithm) of a layer: its time, or why it cannot run."""

    layout: str
    algorithm: str
    time_ms: float | None
    source: str  # "measured" | "model"
    error: str = ""
    note: str = ""  # how it was estimated, or the timing's method/caveats
    kernels: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.time_ms is not None and math.isfinite(self.time_ms)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["kernels"] = list(self.kernels)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CandidateResult":
        return cls(d["layout"], d["algorithm"], d.get("time_ms"), d.get("source", "measured"),
                   d.get("error", ""), d.get("note", ""), tuple(d.get("kernels", ())))


@dataclass(frozen=True)
class LayerChoice:
    """What conv and pool choices share: candidates, XLA's time, transforms, the rule."""

    layer: Layer
    candidates: tuple[CandidateResult, ...]
    xla_ms: float | None
    transforms: Mapping[str, Mapping[str, float]]  # layout -> {"in_ms", "out_ms"} vs NHWC
    rule: RuleChoice
    source: str  # "measured" | "model"
    device: str
    cached: bool = False
    note: str = ""
    xla_note: str = ""

    @property
    def best(self) -> CandidateResult | None:
        ok = [c for c in self.candidates if c.ok]
        return min(ok, key=lambda c: c.time_ms) if ok else None

    @property
    def layout(self) -> str | None:
        return None if self.best is None else self.best.layout

    @property
    def algorithm(self) -> str | None:
        return None if self.best is None else self.best.algorithm

    @property
    def time_ms(self) -> float | None:
        return None if self.best is None else self.best.time_ms

    def best_in(self, layout: str) -> CandidateResult | None:
        ok = [c for c in self.candidates if c.ok and c.layout == layout]
        return min(ok, key=lambda c: c.time_ms) if ok else None

    def times_by_layout(self) -> dict[str, float]:
        return {lay: c.time_ms for lay in LAYOUTS if (c := self.best_in(lay)) is not None}

    @property
    def xla_ratio(self) -> float | None:
        """XLA time / winner time: > 1 means jaxcnn's pick beats XLA."""
        if self.xla_ms is None or self.time_ms is None or self.time_ms <= 0:
            return None
        return self.xla_ms / self.time_ms

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return dict(
            op=self.layer.op, layer=dataclasses.asdict(self.layer), source=self.source,
            device=self.device, cached=self.cached, note=self.note,
            candidates=[c.to_dict() for c in self.candidates],
            winner=None if best is None else best.to_dict(),
            xla_ms=self.xla_ms, xla_note=self.xla_note, xla_ratio=self.xla_ratio,
            transforms={k: dict(v) for k, v in self.transforms.items()},
            rule=self.rule.to_dict(),
        )

    def explain(self) -> str:
        best = self.best
        head = f"{self.layer.name + ': ' if self.layer.name else ''}{self.layer.describe()}"
        where = f"{self.source}{' (cache)' if self.cached else ''} on {self.device}"
        rows = []
        for c in sorted(self.candidates, key=lambda c: (not c.ok, c.time_ms or 0.0)):
            vs = f"{self.xla_ms / c.time_ms:.2f}x" if c.ok and self.xla_ms else "-"
            mark = "<- winner" if c is best else ""
            why = c.error or c.note
            rows.append([c.layout, c.algorithm, fmt_ms(c.time_ms), vs, mark, why[:90]])
        rows.append(["NHWC", "xla", fmt_ms(self.xla_ms), "1.00x" if self.xla_ms else "-", "reference",
                     self.xla_note[:90]])
        lines = [head, f"times: {where}" + (f"; {self.note}" if self.note else ""),
                 text_table(["layout", "algorithm", "ms", "XLA/this", "", "note"], rows)]
        if self.transforms:
            trows = [[lay, fmt_ms(t.get("in_ms")), fmt_ms(t.get("out_ms"))]
                     for lay, t in sorted(self.transforms.items())]
            lines += ["transforms from/to NHWC:", text_table(["layout", "in ms", "out ms"], trows)]
        if best is None:
            lines.append("winner: none (no candidate can run)")
        else:
            ratio = self.xla_ratio
            lines.append(f"winner: {best.layout}/{best.algorithm} {fmt_ms(best.time_ms)} ms"
                         + (f"; XLA {fmt_ms(self.xla_ms)} ms, XLA/winner = {ratio:.2f}" if ratio else ""))
        agree = best is not None and (best.layout, best.algorithm) == (self.rule.layout, self.rule.algorithm)
        lines.append(f"rule: {self.rule.layout}/{self.rule.algorithm} ({'agrees' if agree else 'differs'}): "
                     f"{self.rule.reason}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ConvChoice(LayerChoice):
    """autotune_conv's answer: every candidate's time, XLA's, transforms, winner and rule."""


@dataclass(frozen=True)
class PoolChoice(LayerChoice):
    """autotune_pool's answer (lax.reduce_window in each layout)."""
