#!/usr/bin/env python3
"""Writes docs/api.md: every public name of jaxcnn's public modules, each documented once (under
the first module below that exports it, with the other modules that re-export it named beside
it), by the first paragraph of its docstring. tests/repo/test_api_reference.py fails when the
file falls behind the code, or when a public name has no docstring.

  python scripts/write_api_reference.py            # rewrite docs/api.md
  python scripts/write_api_reference.py --check    # exit 1 if docs/api.md is not up to date
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api.md"
# The public modules, in the order a user meets them; each exports its names in __all__.
PUBLIC_MODULES = ["jaxcnn", "jaxcnn.ops", "jaxcnn.optimize", "jaxcnn.layouts", "jaxcnn.fusion", "jaxcnn.flax",
                  "jaxcnn.memory", "jaxcnn.profile", "jaxcnn.store", "jaxcnn.costmodel", "jaxcnn.models"]
# Names of __all__ that are not API objects.
SKIP = {"__version__"}


def summary(obj) -> str:
    """The first paragraph of obj's own docstring, on one line ("" when it has none; a constant
    is described by its value)."""
    if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj) or callable(obj):
        doc = inspect.getdoc(obj) or ""
        return " ".join(doc.split("\n\n", 1)[0].split())
    return constant_text(obj)


def constant_text(obj) -> str:
    """A constant by what it holds: a dict by its keys, a sequence of plain values or a plain value
    by its value, anything else by its type (no object addresses: the text must not change
    between runs)."""
    plain = (str, int, float, bool, type(None))
    if isinstance(obj, dict):
        keys = [str(k) for k in obj]
        return f"dict of {len(keys)}: `{', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}`"
    if isinstance(obj, (tuple, list, frozenset, set)) and all(isinstance(v, plain) for v in obj):
        values = sorted(obj, key=str) if isinstance(obj, (set, frozenset)) else list(obj)
        text = repr(type(obj)(values) if not isinstance(obj, (set, frozenset)) else values)
        return f"`{text if len(text) <= 80 else text[:77] + '...'}`"
    if isinstance(obj, plain):
        return f"`{obj!r}`"
    return f"a `{type(obj).__name__}`"


def kind(obj) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if inspect.isroutine(obj) or callable(obj):
        return "function"
    return "constant"


def entries() -> list[tuple[str, list[tuple[str, str, str, list[str]]]]]:
    """[(module, [(name, kind, summary, other modules exporting the same object)])]."""
    exported: dict[int, list[str]] = {}
    modules = [importlib.import_module(name) for name in PUBLIC_MODULES]
    for module in modules:
        for name in module.__all__:
            if name not in SKIP:
                exported.setdefault(id(getattr(module, name)), []).append(f"{module.__name__}.{name}")
    seen: set[int] = set()
    out = []
    for module in modules:
        rows = []
        for name in module.__all__:
            obj = getattr(module, name)
            if name in SKIP or id(obj) in seen:
                continue
            seen.add(id(obj))
            others = [full for full in exported[id(obj)] if full != f"{module.__name__}.{name}"]
            rows.append((name, kind(obj), summary(obj), others))
        out.append((module.__name__, rows))
    return out


def render() -> str:
    lines = ["# API reference", "",
             "Every public name of jaxcnn, once, under the first module that exports it (its other public",
             "homes beside it), by the first paragraph of its docstring: `help(name)` has the rest.",
             "Written by `scripts/write_api_reference.py` from the code; do not edit by hand.", ""]
    for module, rows in entries():
        if not rows:
            continue
        first = summary(importlib.import_module(module))
        lines += [f"## `{module}`", "", first, "", "| name | kind | what | also |", "| --- | --- | --- | --- |"]
        for name, what, text, others in rows:
            cell = text.replace("|", "\\|") or "**undocumented**"
            also = ", ".join(f"`{o}`" for o in others) or "-"
            lines.append(f"| `{name}` | {what} | {cell} | {also} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is not up to date")
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(ROOT))
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is not up to date: run python scripts/write_api_reference.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
