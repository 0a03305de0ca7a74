"""Buffer lifetimes from XLA's compiled, scheduled HLO: the ENTRY computation's instruction order
(is_scheduled=true) is the step axis, each instruction output one rectangle [def, last use] x bytes.

Modelling choices (they follow XLA buffer assignment closely enough for bounds, not byte-exactly):
- a `fusion` is one buffer (its result); the fused computation's internals live in registers/loops,
  and so do the bodies of to_apply/calls/while computations: only ENTRY instructions are parsed;
- `bitcast` and `get-tuple-element` alias (part of) their operand and `tuple` only groups its
  operands: none of them allocates, they extend the lifetime of the buffers they refer to;
- a tuple-shaped result of any other op (multi-output fusion, sort, async start...) is one buffer
  per leaf element; tuple index tables (one pointer per element) are not counted;
- entry parameters, constants and the buffers reaching ROOT span the whole program: XLA keeps
  argument, constant and live-out allocations apart from the reusable temp allocations.
A buffer's last use and a new definition at the same step overlap (inclusive ends, as in
lifetimes.py), whereas XLA may let an elementwise fusion write into its dying operand in place; so
the live-bytes bound of the temps can exceed memory_analysis().temp_size_in_bytes.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

import jax

from jaxcnn.planner.lifetimes import Buffer

# Bits per element; sub-byte types are packed, so sizes round up to whole bytes.
_DTYPE_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "f16": 16, "bf16": 16, "s32": 32, "u32": 32, "f32": 32,
    "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128,
    "token": 0, "opaque": 0,
}
# Ops whose result is a view of, or a grouping of, operand buffers: no allocation of their own.
_ALIASING = ("bitcast", "get-tuple-element", "tuple")
ROLES = ("parameter", "constant", "output", "temp")

_LEAF_RE = re.compile(r"^([a-z][a-z0-9]*)\[([^\]]*)\]")
_INSTR_RE = re.compile(r"^(?:ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")
_OPCODE_RE = re.compile(r"^([a-z][\w\-]*)\(")
_INDEX_RE = re.compile(r"\bindex=(\d+)")
_MEMORY_FIELDS = (
    "temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
    "alias_size_in_bytes", "generated_code_size_in_bytes", "peak_memory_in_bytes",
)


def _split_top(text: str) -> list[str]:
    """Split on commas outside (), [], {} (layouts like {3,2,1,0} hold commas)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail:
        parts.append(tail)
    return parts


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced brackets in {text!r}")


def leaf_bytes(shape: str) -> int:
    """Bytes of one array shape like `f32[8,56,56,64]{3,2,1,0}` or `s32[<=16]`."""
    m = _LEAF_RE.match(shape.strip())
    if m is None:
        raise ValueError(f"not an array shape: {shape!r}")
    dtype, dims = m.groups()
    if dtype.startswith("f8") or dtype.startswith("f4") or dtype.startswith("f6"):
        bits = int(dtype[1])  # f8e4m3fn, f4e2m1fn, f6e3m2fn...: width is the digit after 'f'
    elif dtype in _DTYPE_BITS:
        bits = _DTYPE_BITS[dtype]
    else:
        raise ValueError(f"unknown HLO element type {dtype!r}")
    n = 1
    for d in filter(None, (d.strip() for d in dims.split(","))):
        n *= int(d.lstrip("<="))  # dynamic dims `<=N` are allocated at their bound
    return (n * bits + 7) // 8


def parse_shape(shape: str):
    """Shape text -> bytes (int) for an array, list of subtrees for a tuple."""
    shape = shape.strip()
    if shape.startswith("("):
        return [parse_shape(s) for s in _split_top(shape[1:_balanced(shape, 0) - 1])]
    return leaf_bytes(shape)


def _leaves(tree) -> list:
    return [tree] if not isinstance(tree, list) else [x for t in tree for x in _leaves(t)]


def _entry_lines(text: str) -> list[str]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("ENTRY"):
            body = []
            for inner in lines[i + 1:]:
                if inner.strip() == "}":
                    return body
                if inner.strip():
                    body.append(inner.strip())
            raise ValueError("ENTRY computation is not closed")
    raise ValueError("no ENTRY computation in the HLO text")


def _parse_instruction(line: str):
    """-> (name, shape text, opcode, operand names, attribute text, is_root)."""
    m = _INSTR_RE.match(line)
    if m is None:
        raise ValueError(f"not an HLO instruction: {line!r}")
    name, rest = m.groups()
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:  # array shape: up to the first space outside brackets (layouts may hold T(8,128))
        end, depth = len(rest), 0
        for i, ch in enumerate(rest):
            depth += ch in "([{"
            depth -= ch in ")]}"
            if ch == " " and depth == 0:
                end = i
                break
    shape, rest = rest[:end], rest[end:].strip()
    om = _OPCODE_RE.match(rest)
    if om is None:
        raise ValueError(f"no opcode in {line!r}")
    opcode = om.group(1)
    close = _balanced(rest, om.end() - 1)
    operand_text, attrs = rest[om.end():close - 1], rest[close:]
    # Operands print as `%a` or `f32[2]{0} %a`: the name is the last token of each entry.
    operands = [] if opcode == "constant" else [
        p.split()[-1].lstrip("%") for p in _split_top(operand_text) if p
    ]
    return name, shape, opcode, operands, attrs, line.startswith("ROOT")


def hlo_buffer_roles(compiled_text: str) -> list[tuple[Buffer, str]]:
    """Every buffer of the ENTRY computation with its role, one of ROLES."""
    instrs = [_parse_instruction(line) for line in _entry_lines(compiled_text)]
    last_step = max(len(instrs) - 1, 0)
    # Per buffer key: [name, size, start, end, role]; per value name: tree of buffer keys.
    bufs: list[list] = []
    values: dict[str, object] = {}
    root = None

    def new_tree(tree, name, step, role, path=()):
        if isinstance(tree, list):
            return [new_tree(t, name, step, role, path + (i,)) for i, t in enumerate(tree)]
        suffix = "".join(f"#{i}" for i in path)
        bufs.append([name + suffix, tree, step, step, role])
        return len(bufs) - 1

    for step, (name, shape, opcode, operands, attrs, is_root) in enumerate(instrs):
        known = [values[o] for o in operands if o in values]
        for tree in known:
            for key in _leaves(tree):
                bufs[key][3] = max(bufs[key][3], step)
        if opcode in ("bitcast", "get-tuple-element") and known:
            value = known[0]
            if opcode == "get-tuple-element" and isinstance(value, list):
                value = value[int(_INDEX_RE.search(attrs).group(1))]
        elif opcode == "tuple":
            value = known
        else:
            role = {"parameter": "parameter", "constant": "constant"}.get(opcode, "temp")
            value = new_tree(parse_shape(shape), name, step, role)
        values[name] = value
        if is_root:
            root = value
    if root is None and instrs:
        root = values[instrs[-1][0]]  # no ROOT marker: the last instruction is the result

    for key in _leaves(root) if root is not None else []:
        if bufs[key][4] == "temp":
            bufs[key][4] = "output"
    for b in bufs:
        if b[4] != "temp":  # arguments, constants and live-out allocations are never reused
            b[2], b[3] = 0, last_step
    return [(Buffer(n, size, s, e), role) for n, size, s, e, role in bufs]


def hlo_buffers(compiled_text: str, roles: Iterable[str] | None = None) -> list[Buffer]:
    """Buffers of the ENTRY computation of compiled HLO text, steps = schedule order;
    `roles` (subset of ROLES) filters, e.g. roles=("temp",) for the reusable temporaries."""
    keep = set(ROLES if roles is None else roles)
    if not keep <= set(ROLES):
        raise ValueError(f"roles must be among {ROLES}, got {sorted(keep)}")
    return [b for b, role in hlo_buffer_roles(compiled_text) if role in keep]


def memory_stats(compiled) -> dict[str, int]:
    """compiled.memory_analysis() as a dict; fields a backend does not report are left out."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # some backends raise Unimplemented instead of returning None
        return {}
    if analysis is None:
        return {}
    out = {}
    for field in _MEMORY_FIELDS:
        if isinstance(analysis, dict):
            value = analysis.get(field)
        else:
            value = getattr(analysis, field, None)
        if value is not None:
            out[field] = int(value)
    return out


def compiled_buffers(fn: Callable, *args) -> tuple[list[Buffer], dict[str, int]]:
    """jit + lower + compile fn(*args); its ENTRY buffers and its memory stats."""
    compiled = jax.jit(fn).lower(*args).compile()
    return hlo_buffers(compiled.as_text()), memory_stats(compiled)
