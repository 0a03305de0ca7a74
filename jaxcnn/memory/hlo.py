"""Buffer lifetimes from XLA's compiled, scheduled HLO: the ENTRY computation's instruction order
(is_scheduled=true) is the step axis, each instruction output one rectangle [def, last use] x bytes.

Modelling choices (they follow XLA buffer assignment closely enough for bounds, not byte-exactly):
- a `fusion` is one buffer (its result); the fused computation's internals live in registers/loops,
  and so do the bodies of to_apply/calls/while computations: only ENTRY instructions are parsed;
- `bitcast` and `get-tuple-element` alias (part of) their operand and `tuple` only groups its
  operands: none of them allocates, they extend the lifetime of the buffers they refer to;
- a tuple-shaped result of any other op (multi-output fusion, sort, async start...) is one buffer
  per leaf element; tuple index tables (one pointer per element) are not counted;
- in-place reuse (XLA's CanShareOperandBufferWithUser, `share=True`): an instruction whose array
  result has exactly the shape (layout included) of a temp operand that dies at this instruction
  writes into that operand's buffer instead of a new one, when it is elementwise, a loop/input
  fusion that uses the operand's parameter only through elementwise ops, or an in-place update
  (`dynamic-update-slice`/`scatter` operand 0, or a fusion whose root is one, on a parameter);
  the two values become one buffer. Without it, a last use and a new definition at the same step
  overlap (inclusive ends), so the bound of the temps would exceed XLA's temp allocation;
- entry parameters and constants span the whole program, and so do the buffers reaching ROOT
  unless `outputs_from_definition=True`, where they live from their definition to the end: XLA
  keeps argument and constant allocations apart, and (on CPU at least) lets temps use the bytes
  of an output allocation before the output is written, so the temps + outputs-from-definition
  set is the one whose bound compares with temp_size + output_size of memory_analysis.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

import jax

from jaxcnn.memory.footprint import memory_stats
from jaxcnn.memory.lifetimes import Buffer

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
_CALLS_RE = re.compile(r"\bcalls=%?([\w.\-]+)")
_KIND_RE = re.compile(r"\bkind=(k\w+)")
_COMPUTATION_RE = re.compile(r"^%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
# Ops that compute output element i from operand element i alone (XLA's IsElementwise).
ELEMENTWISE = frozenset("""
    abs add and atan2 cbrt ceil clamp clz compare complex convert copy cosine divide erf
    exponential exponential-minus-one floor imag is-finite log log-plus-one logistic maximum
    minimum multiply negate not or popcnt power real reduce-precision remainder round-nearest-afz
    round-nearest-even rsqrt select shift-left shift-right-arithmetic shift-right-logical sign
    sine sqrt stochastic-convert subtract tan tanh xor
""".split())
# Ops that update their operand 0 in place.
IN_PLACE = frozenset({"dynamic-update-slice", "scatter"})


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


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    """Instruction lines of every computation by name, and the ENTRY computation's name."""
    comps: dict[str, list[str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            is_entry = stripped.startswith("ENTRY")
            m = _COMPUTATION_RE.match(stripped[len("ENTRY"):].strip() if is_entry else stripped)
            if m is not None:
                current = m.group(1)
                comps[current] = []
                if is_entry:
                    entry = current
        elif stripped == "}":
            current = None
        elif stripped:
            comps[current].append(stripped)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    if current is not None:
        raise ValueError(f"computation {current} is not closed")
    return comps, entry


def _entry_lines(text: str) -> list[str]:
    comps, entry = _computations(text)
    return comps[entry]


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


def _leaf_shapes(shape: str):
    """Like parse_shape, with each leaf's shape text (spaces removed) instead of its bytes."""
    shape = shape.strip()
    if shape.startswith("("):
        return [_leaf_shapes(x) for x in _split_top(shape[1:_balanced(shape, 0) - 1])]
    return shape.replace(" ", "")


def _fused_shareable(lines: list[str]) -> set[int]:
    """Parameter numbers of a fused computation whose buffer the fusion may overwrite: used only
    through elementwise ops (or tuples), or operand 0 of an in-place root (through bitcasts)."""
    instrs = [_parse_instruction(line) for line in lines]
    users: dict[str, list[tuple[str, str, int]]] = {}
    params: dict[str, int] = {}
    root = instrs[-1][0] if instrs else None
    by_name = {}
    for name, _, opcode, operands, _, is_root in instrs:
        by_name[name] = (opcode, operands)
        if opcode == "parameter":
            params[name] = int(operands[0])  # `parameter(3)` parses as operand "3"
        for i, op in enumerate(operands):
            users.setdefault(op, []).append((name, opcode, i))
        if is_root:
            root = name
    shareable = set()
    for pname, number in params.items():
        frontier, seen, ok = [pname], {pname}, bool(users.get(pname))
        while frontier and ok:
            for user, opcode, _ in users.get(frontier.pop(), []):
                ok = opcode in ELEMENTWISE or opcode == "tuple"
                if not ok:
                    break
                if user not in seen:
                    seen.add(user)
                    frontier.append(user)
        if ok:
            shareable.add(number)
    # In-place root: dynamic-update-slice / scatter writing into a parameter (through bitcasts).
    opcode, operands = by_name.get(root, (None, []))
    while opcode == "bitcast":
        opcode, operands = by_name.get(operands[0], (None, []))
    if opcode in IN_PLACE and operands:
        target = operands[0]
        while by_name.get(target, (None,))[0] == "bitcast":
            target = by_name[target][1][0]
        if target in params:
            shareable.add(params[target])
    return shareable


def hlo_buffer_roles(
    compiled_text: str, *, share: bool = True, outputs_from_definition: bool = False
) -> list[tuple[Buffer, str]]:
    """Every buffer of the ENTRY computation with its role, one of ROLES (module docstring:
    `share` models XLA's in-place operand reuse, `outputs_from_definition` the live-out span)."""
    comps, entry = _computations(compiled_text)
    instrs = [_parse_instruction(line) for line in comps[entry]]
    last_step = max(len(instrs) - 1, 0)
    # Per buffer key: [name, size, start, end, role, shape text]; per value name: tree of keys.
    bufs: list[list] = []
    values: dict[str, object] = {}
    root = None
    # Per step: (opcode, attrs, operand values, key of its new array buffer or None).
    trace: list[tuple] = []

    def new_tree(tree, shapes, name, step, role, path=()):
        if isinstance(tree, list):
            return [new_tree(t, sh, name, step, role, path + (i,))
                    for i, (t, sh) in enumerate(zip(tree, shapes))]
        suffix = "".join(f"#{i}" for i in path)
        bufs.append([name + suffix, tree, step, step, role, shapes])
        return len(bufs) - 1

    for step, (name, shape, opcode, operands, attrs, is_root) in enumerate(instrs):
        known = [values.get(o) for o in operands]
        for tree in known:
            for key in _leaves(tree) if tree is not None else []:
                bufs[key][3] = max(bufs[key][3], step)
        new_key = None
        if opcode in ("bitcast", "get-tuple-element") and known and known[0] is not None:
            value = known[0]
            if opcode == "get-tuple-element" and isinstance(value, list):
                value = value[int(_INDEX_RE.search(attrs).group(1))]
        elif opcode == "tuple":
            value = [k for k in known if k is not None]
        else:
            role = {"parameter": "parameter", "constant": "constant"}.get(opcode, "temp")
            value = new_tree(parse_shape(shape), _leaf_shapes(shape), name, step, role)
            new_key = value if isinstance(value, int) else None
        values[name] = value
        trace.append((opcode, attrs, known, new_key))
        if is_root:
            root = value
    if root is None and instrs:
        root = values[instrs[-1][0]]  # no ROOT marker: the last instruction is the result

    # In-place sharing: merge a result into the operand buffer that dies where it is written.
    group = list(range(len(bufs)))  # key -> key of the buffer whose bytes it uses

    def find(k):
        while group[k] != k:
            group[k] = group[group[k]]
            k = group[k]
        return k

    shareable_cache: dict[str, set[int]] = {}
    for step, (opcode, attrs, known, new_key) in enumerate(trace) if share else ():
        if new_key is None:
            continue
        if opcode == "fusion":
            kind, calls = _KIND_RE.search(attrs), _CALLS_RE.search(attrs)
            if kind is None or calls is None or calls.group(1) not in comps:
                continue
            comp = calls.group(1)
            if comp not in shareable_cache:
                shareable_cache[comp] = _fused_shareable(comps[comp])
            if kind.group(1) not in ("kLoop", "kInput"):
                continue
            positions = sorted(shareable_cache[comp])
        elif opcode in ELEMENTWISE:
            positions = range(len(known))
        elif opcode in IN_PLACE:
            positions = [0]
        else:
            continue
        for i in positions:
            operand = known[i] if i < len(known) else None
            if not isinstance(operand, int):
                continue
            b = bufs[operand]
            if b[4] == "temp" and b[3] == step and b[5] == bufs[new_key][5]:
                group[new_key] = find(operand)
                break

    outputs = {find(k) for k in _leaves(root)} if root is not None else set()
    merged: dict[int, list] = {}
    for key, (name, size, start, end, role, _) in enumerate(bufs):
        head = find(key)
        if head not in merged:
            merged[head] = [name, size, start, end, role]
        else:
            m = merged[head]
            m[1], m[2], m[3] = max(m[1], size), min(m[2], start), max(m[3], end)
    for head, m in merged.items():
        if head in outputs and m[4] == "temp":
            m[4] = "output"
        if m[4] in ("parameter", "constant") or (m[4] == "output" and not outputs_from_definition):
            m[2] = 0  # arguments, constants and live-out allocations are never reused
        if m[4] != "temp":
            m[3] = last_step
    return [(Buffer(n, size, s, e), role) for n, size, s, e, role in merged.values()]


def hlo_buffers(
    compiled_text: str, roles: Iterable[str] | None = None, *, share: bool = True,
    outputs_from_definition: bool = False,
) -> list[Buffer]:
    """Buffers of the ENTRY computation of compiled HLO text, steps = schedule order;
    `roles` (subset of ROLES) filters, e.g. roles=("temp",) for the reusable temporaries;
    `share` and `outputs_from_definition` as in hlo_buffer_roles."""
    keep = set(ROLES if roles is None else roles)
    if not keep <= set(ROLES):
        raise ValueError(f"roles must be among {ROLES}, got {sorted(keep)}")
    roles_list = hlo_buffer_roles(
        compiled_text, share=share, outputs_from_definition=outputs_from_definition)
    return [b for b, role in roles_list if role in keep]


_ALLOCATION_RE = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
_VALUE_RE = re.compile(r"^\s*value: <\d+ ([^\s{>]+)(?:\{([\d,]*)\})? @\d+> \(size=(\d+),offset=(\d+)\)")


def _allocation_kind(attrs: str) -> str:
    if "parameter" in attrs:
        return "parameter"
    if "constant" in attrs:
        return "constant"
    if "thread-local" in attrs:
        return "thread-local"
    if "live-out" in attrs or "output shape" in attrs:
        return "live-out"
    return "temp"  # preallocated-temp, or a plain temp allocation


def parse_buffer_assignment(text: str) -> list[dict]:
    """XLA's buffer-assignment dump (`*after_optimizations-buffer-assignment.txt`, written with
    the xla_dump_to option) -> allocations: index, size, kind (parameter, constant, thread-local,
    live-out or temp), attrs text and values [{name, size, offset}]; a tuple element's value is
    named like our buffers, `instr#i`."""
    allocations: list[dict] = []
    for line in text.splitlines():
        m = _ALLOCATION_RE.match(line)
        if m is not None:
            index, size, attrs = m.groups()
            allocations.append(dict(index=int(index), size=int(size), kind=_allocation_kind(attrs),
                                    attrs=attrs.strip(" ,"), values=[]))
            continue
        v = _VALUE_RE.match(line)
        if v is not None and allocations:
            name, shape_index, size, offset = v.groups()
            if shape_index:
                name += "".join(f"#{i}" for i in shape_index.split(","))
            allocations[-1]["values"].append(dict(name=name, size=int(size), offset=int(offset)))
    return allocations


def compiled_buffers(fn: Callable, *args) -> tuple[list[Buffer], dict[str, int]]:
    """jit + lower + compile fn(*args); its ENTRY buffers and its memory stats."""
    compiled = jax.jit(fn).lower(*args).compile()
    return hlo_buffers(compiled.as_text()), memory_stats(compiled)
