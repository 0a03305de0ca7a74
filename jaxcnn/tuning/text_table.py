"""Plain-text tables of the tuners' explain(): times in ms and aligned columns."""

from __future__ import annotations

import math
from typing import Any, Sequence


def fmt_ms(value: float | None) -> str:
    """A time in ms with 4 significant decimals below 1 ms; "-" for None or not finite."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.4f}" if value < 1 else f"{value:.3f}"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns under a dashed rule."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
