"""Buffer donation: which arguments of a jitted function XLA can alias to its outputs, and a `jit`
that donates them.

How jax pairs donated buffers with outputs (jax/_src/interpreters/mlir.py, `_set_up_aliases`):
each output leaf, in order, takes the first still-unpaired donated input leaf of the same shape
and dtype (weak types and shardings aside). A donated leaf left unpaired is not aliased and jax
warns "Some donated buffers were not usable". So a set of donated arguments is warning-free
exactly when, for every (shape, dtype), its leaves number at most the output leaves of that
(shape, dtype); every donated leaf is then aliased to an output (alias_size_in_bytes).

The rule `plan_donation` (and `jit(donate="auto")`) applies, argument by argument:
  1. static arguments are never donated;
  2. candidates: with consumable=None, every argument whose pytree reappears in the output, i.e.
     the output has a subtree of the same structure with the same leaf shapes and dtypes (the
     state-update pattern: params -> new params, opt_state -> new opt_state; a batch of images is
     not returned, so it is kept). consumable=(argnums and/or argnames) names the arguments the
     caller will not use after the call; those are matched leaf by leaf, whatever the structure;
  3. a candidate needs every leaf to be a jax.Array (or a ShapeDtypeStruct when planning on
     shapes): donating a Python scalar or a NumPy array frees nothing the caller holds;
  4. a candidate the function never reads is kept: jit prunes unused arguments, so donating it
     would alias nothing;
  5. among the remaining candidates, the donated set is the one with the most bytes that
     satisfies the count condition above (exact over subsets up to EXACT_SEARCH_LIMIT
     candidates, largest-first greedy beyond), so the warning can never fire.
Donation is per top-level argument (jax's donate_argnums/donate_argnames); an argument with one
leaf no output can take is kept whole, and the explanation names that leaf.
"""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
from jax.extend import core as jex_core

from jaxcnn.memory.footprint import footprint_bytes, memory_stats

# Up to this many candidate arguments the donated set is found by trying every subset.
EXACT_SEARCH_LIMIT = 16
DONATE_MODES = ("auto", "none")

Key = tuple[tuple[int, ...], str]  # (shape, dtype name): what jax pairs donated inputs by


def _key(leaf) -> Key:
    return tuple(int(d) for d in leaf.shape), np.dtype(leaf.dtype).name


def _nbytes(leaf) -> int:
    return math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize


def _is_array_leaf(leaf) -> bool:
    return isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct))


@dataclass(frozen=True)
class ArgDecision:
    """One argument: donated or not, and why."""

    label: str  # "arg 0 (params)" or "kwarg opt_state"
    argnum: int | None  # position, None for an argument passed by keyword
    argname: str | None
    donated: bool
    reason: str
    leaves: int
    bytes: int


@dataclass(frozen=True)
class DonationPlan:
    """What to donate; `jit_kwargs()` gives the donate_argnums/donate_argnames for jax.jit."""

    donate_argnums: tuple[int, ...]
    donate_argnames: tuple[str, ...]
    decisions: tuple[ArgDecision, ...]
    output_bytes: int

    @property
    def donated_bytes(self) -> int:
        """Bytes XLA will alias: every donated leaf is paired with an output."""
        return sum(d.bytes for d in self.decisions if d.donated)

    def jit_kwargs(self) -> dict[str, tuple]:
        out: dict[str, tuple] = {"donate_argnums": self.donate_argnums}
        if self.donate_argnames:
            out["donate_argnames"] = self.donate_argnames
        return out

    def explain(self) -> str:
        lines = [f"donate_argnums={self.donate_argnums}"
                 + (f" donate_argnames={self.donate_argnames}" if self.donate_argnames else "")
                 + f": {_mib(self.donated_bytes)} of {_mib(self.output_bytes)} of outputs aliased to inputs"]
        for d in self.decisions:
            lines.append(f"  {'donate' if d.donated else 'keep  '} {d.label}: {d.leaves} leaves, "
                         f"{_mib(d.bytes)} - {d.reason}")
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _normalize_indices(value, name: str) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (int, str)):
        value = (value,)
    try:
        value = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, a str or a sequence of them, got {value!r}") from None
    for v in value:
        if not isinstance(v, (int, str)) or isinstance(v, bool):
            raise TypeError(f"{name} must hold argument positions (int) or names (str), got {v!r}")
    return value


def _positional_names(fn: Callable) -> list[str | None]:
    """Names of fn's positional parameters (None past *args or when there is no signature)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _subtree_signatures(tree) -> set:
    """(structure, leaf keys) of every subtree of `tree`, the whole and each leaf included."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = [_key(leaf) for leaf in leaves]
    found = set()

    def walk(node, start: int) -> None:
        n = node.num_leaves
        found.add((node, tuple(keys[start:start + n])))
        for child in node.children():
            walk(child, start)
            start += child.num_leaves

    walk(treedef, 0)
    return found


def _used_invars(closed_jaxpr) -> list[bool]:
    """Per flattened input: does the program read it (an equation or an output uses it)?"""
    jaxpr = closed_jaxpr.jaxpr
    used = set()
    for eqn in jaxpr.eqns:
        used.update(id(v) for v in eqn.invars if not isinstance(v, jex_core.Literal))
    used.update(id(v) for v in jaxpr.outvars if not isinstance(v, jex_core.Literal))
    return [id(v) in used for v in jaxpr.invars]


def _best_subset(candidates: list[tuple[int, collections.Counter, int]],
                 capacity: collections.Counter) -> set[int]:
    """Indices of the candidate set with the most bytes whose leaf counts fit `capacity`."""
    def fits(chosen) -> bool:
        total = collections.Counter()
        for _, counts, _ in chosen:
            total.update(counts)
        return all(n <= capacity[k] for k, n in total.items())

    if len(candidates) <= EXACT_SEARCH_LIMIT:
        best, best_bytes = (), -1
        for r in range(len(candidates), -1, -1):
            for chosen in itertools.combinations(candidates, r):
                size = sum(b for _, _, b in chosen)
                if size > best_bytes and fits(chosen):
                    best, best_bytes = chosen, size
        return {i for i, _, _ in best}
    chosen: list = []
    for cand in sorted(candidates, key=lambda c: -c[2]):
        if fits(chosen + [cand]):
            chosen.append(cand)
    return {i for i, _, _ in chosen}


def plan_donation(fn: Callable, *example_args, consumable: Sequence[int | str] | int | str | None = None,
                  static_argnums: Sequence[int] | int = (), static_argnames: Sequence[str] | str = (),
                  **example_kwargs) -> DonationPlan:
    """Which arguments of `fn(*example_args, **example_kwargs)` to donate (see the module doc for
    the rule). Arguments may be arrays or jax.ShapeDtypeStruct; nothing is compiled, only traced.

    consumable: None (arguments whose pytree reappears in the output) or the argnums/argnames the
      caller promises not to use after the call.
    """
    consumable = None if consumable is None else _normalize_indices(consumable, "consumable")
    static_argnums = tuple(_normalize_indices(static_argnums, "static_argnums"))
    static_argnames = tuple(_normalize_indices(static_argnames, "static_argnames"))
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    n_args = len(example_args)
    static_pos = {i % n_args if n_args else i for i in static_argnums if isinstance(i, int)}
    names = _positional_names(fn)
    static_pos |= {names.index(n) for n in static_argnames if n in names and names.index(n) < n_args}
    if consumable is not None:
        for c in consumable:
            if isinstance(c, int) and not -n_args <= c < n_args:
                raise ValueError(f"consumable names argument {c}, but fn gets {n_args} positional arguments")
            if isinstance(c, str) and c not in example_kwargs and c not in names[:n_args]:
                raise ValueError(f"consumable names argument {c!r}, which fn does not receive")

    traced = jax.jit(fn, static_argnums=tuple(sorted(static_pos)), static_argnames=static_argnames).trace(
        *example_args, **example_kwargs)
    out_leaves = jax.tree.leaves(traced.out_info)
    capacity = collections.Counter(_key(leaf) for leaf in out_leaves)
    output_bytes = sum(_nbytes(leaf) for leaf in out_leaves)
    out_signatures = _subtree_signatures(traced.out_info)
    used = _used_invars(traced.jaxpr)

    # Arguments in the order jit flattens them: positional (static ones dropped), then kwargs by name.
    entries = [(i, names[i] if i < len(names) else None, a) for i, a in enumerate(example_args) if i not in static_pos]
    entries += [(None, k, example_kwargs[k]) for k in sorted(example_kwargs) if k not in static_argnames]
    flat_used = iter(used if len(used) == sum(len(jax.tree.leaves(a)) for _, _, a in entries) else [])

    def declared(argnum, argname) -> bool:
        if consumable is None:
            return False
        return any((isinstance(c, int) and argnum is not None and c % n_args == argnum)
                   or (isinstance(c, str) and c == argname) for c in consumable)

    pending: dict[int, ArgDecision] = {}
    candidates = []
    decisions: list[ArgDecision] = []
    for argnum, argname, value in entries:
        leaves, treedef = jax.tree.flatten(value)
        leaf_used = [next(flat_used, True) for _ in leaves]
        label = f"arg {argnum}" + (f" ({argname})" if argname else "") if argnum is not None else f"kwarg {argname}"
        size = sum(_nbytes(leaf) for leaf in leaves if hasattr(leaf, "shape") and hasattr(leaf, "dtype"))
        decision = functools.partial(ArgDecision, label, argnum, argname, leaves=len(leaves), bytes=size)
        if not leaves:
            decisions.append(decision(False, "no array leaves"))
            continue
        if not all(_is_array_leaf(leaf) for leaf in leaves):
            bad = next(type(leaf).__name__ for leaf in leaves if not _is_array_leaf(leaf))
            decisions.append(decision(False, f"holds a {bad} leaf, not a jax array: donating frees nothing"))
            continue
        keys = [_key(leaf) for leaf in leaves]
        if consumable is not None and not declared(argnum, argname):
            decisions.append(decision(False, "not declared consumable"))
            continue
        if consumable is None and (treedef, tuple(keys)) not in out_signatures:
            decisions.append(decision(
                False, "its pytree does not reappear in the output (the caller may still need it)"))
            continue
        if not any(leaf_used):
            decisions.append(decision(False, "fn never reads it: jit prunes it, nothing to alias"))
            continue
        counts = collections.Counter(keys)
        short = next((k for k, n in counts.items() if n > capacity[k]), None)
        if short is not None:
            decisions.append(decision(
                False, f"{counts[short]} leaves {_key_text(short)} but only {capacity[short]} outputs of that shape"))
            continue
        index = len(decisions)
        decisions.append(decision(True, ""))
        pending[index] = decision
        candidates.append((index, counts, size))

    chosen = _best_subset(candidates, capacity)
    for index, make in pending.items():
        if index in chosen:
            reason = "every leaf pairs with an output of the same shape and dtype"
            decisions[index] = make(True, reason + ("" if consumable is None else " (declared consumable)"))
        else:
            decisions[index] = make(False, "outputs of its shapes are taken by larger donated arguments")
    return DonationPlan(
        donate_argnums=tuple(d.argnum for d in decisions if d.donated and d.argnum is not None),
        donate_argnames=tuple(d.argname for d in decisions if d.donated and d.argnum is None),
        decisions=tuple(decisions),
        output_bytes=output_bytes,
    )


def _key_text(key: Key) -> str:
    shape, dtype = key
    return f"{dtype}[{','.join(map(str, shape))}]"


@dataclass(frozen=True)
class DonationSavings:
    """Compiled memory of one function without and with the planned donation."""

    plan: DonationPlan
    before: dict[str, int]  # memory_stats of jax.jit(fn)
    after: dict[str, int]  # memory_stats of jax.jit(fn, **plan.jit_kwargs())

    @property
    def alias_bytes(self) -> int:
        return self.after.get("alias_size_in_bytes", 0)

    @property
    def peak_before(self) -> int:
        return footprint_bytes(self.before)

    @property
    def peak_after(self) -> int:
        return footprint_bytes(self.after)

    @property
    def saved_bytes(self) -> int:
        return self.peak_before - self.peak_after

    def explain(self) -> str:
        return "\n".join([
            self.plan.explain(),
            f"footprint (arguments + outputs - aliased + temp): {_mib(self.peak_before)} -> "
            f"{_mib(self.peak_after)}, saved {_mib(self.saved_bytes)} "
            f"(alias_size_in_bytes {self.before.get('alias_size_in_bytes', 0)} -> {self.alias_bytes}, "
            f"temp {_mib(self.before.get('temp_size_in_bytes', 0))} -> "
            f"{_mib(self.after.get('temp_size_in_bytes', 0))})",
        ])


def measure_donation(fn: Callable, *example_args, consumable=None, static_argnums=(), static_argnames=(),
                     **example_kwargs) -> DonationSavings:
    """Plan the donation of fn, compile it without and with it, and read XLA's memory analysis."""
    plan = plan_donation(fn, *example_args, consumable=consumable, static_argnums=static_argnums,
                         static_argnames=static_argnames, **example_kwargs)
    statics = dict(static_argnums=static_argnums, static_argnames=static_argnames)
    before = jax.jit(fn, **statics).lower(*example_args, **example_kwargs).compile()
    after = jax.jit(fn, **statics, **plan.jit_kwargs()).lower(*example_args, **example_kwargs).compile()
    return DonationSavings(plan, memory_stats(before), memory_stats(after))


class DonatingJit:
    """`jax.jit(fn)` that donates what `plan_donation` picks, planned once per call signature
    (argument structure, shapes and dtypes, static values)."""

    def __init__(self, fn: Callable, consumable, jit_kwargs: dict[str, Any]):
        self._fn = fn
        self._consumable = consumable
        self._jit_kwargs = jit_kwargs
        self._static_argnums = _normalize_indices(jit_kwargs.get("static_argnums"), "static_argnums")
        self._static_argnames = _normalize_indices(jit_kwargs.get("static_argnames"), "static_argnames")
        self._compiled: dict[Any, tuple[DonationPlan, Callable]] = {}
        functools.update_wrapper(self, fn)

    def _signature(self, args, kwargs):
        def part(value, static):
            if static:
                return ("static", value)
            leaves, treedef = jax.tree.flatten(value)
            return (treedef, tuple(_key(x) if _is_array_leaf(x) else (type(x), getattr(x, "dtype", None))
                                   for x in leaves))
        n = len(args)
        static_pos = {i % n for i in self._static_argnums if n}
        return (tuple(part(a, i in static_pos) for i, a in enumerate(args)),
                tuple((k, part(v, k in self._static_argnames)) for k, v in sorted(kwargs.items())))

    def _entry(self, args, kwargs) -> tuple[DonationPlan, Callable]:
        key = self._signature(args, kwargs)
        if key not in self._compiled:
            plan = plan_donation(self._fn, *args, consumable=self._consumable,
                                 static_argnums=self._static_argnums, static_argnames=self._static_argnames,
                                 **kwargs)
            self._compiled[key] = (plan, jax.jit(self._fn, **self._jit_kwargs, **plan.jit_kwargs()))
        return self._compiled[key]

    def plan(self, *args, **kwargs) -> DonationPlan:
        """The donation this call would make."""
        return self._entry(args, kwargs)[0]

    def lower(self, *args, **kwargs):
        return self._entry(args, kwargs)[1].lower(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        plan, jitted = self._entry(args, kwargs)
        donated = [args[i] for i in plan.donate_argnums] + [kwargs[k] for k in plan.donate_argnames]
        if donated and _shares_buffers(donated, args, kwargs):
            # XLA refuses a buffer donated twice or donated and read at once: run undonated.
            return jax.jit(self._fn, **self._jit_kwargs)(*args, **kwargs)
        return jitted(*args, **kwargs)


def _shares_buffers(donated: Iterable, args, kwargs) -> bool:
    """Does a donated leaf appear twice among all the call's leaves?"""
    donated_ids = collections.Counter(id(x) for x in jax.tree.leaves(list(donated)) if isinstance(x, jax.Array))
    all_ids = collections.Counter(id(x) for x in jax.tree.leaves((args, kwargs)) if isinstance(x, jax.Array))
    return any(all_ids[i] > 1 for i in donated_ids)


def jit(fn: Callable | None = None, *, donate: str | None = "auto", consumable=None, **jit_kwargs):
    """`jax.jit` that donates the arguments XLA can alias to outputs (see the module doc).

    donate="auto" plans per call signature (`.plan(*args)` shows the decision); "none" or None is
    plain jax.jit. consumable: None (arguments whose pytree reappears in the output) or the
    argnums/argnames the caller will not use after the call. Other keywords go to jax.jit;
    donate_argnums/donate_argnames belong to donate="none". Usable as a decorator.
    """
    if donate is None:
        donate = "none"
    if donate not in DONATE_MODES:
        raise ValueError(f"donate must be one of {DONATE_MODES}, got {donate!r}")
    if consumable is not None:
        _normalize_indices(consumable, "consumable")
    if donate == "auto":
        for name in ("donate_argnums", "donate_argnames"):
            if name in jit_kwargs:
                raise TypeError(f"{name} is chosen by donate='auto'; pass donate='none' to set it yourself")
    if fn is None:
        return functools.partial(jit, donate=donate, consumable=consumable, **jit_kwargs)
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if donate == "none":
        return jax.jit(fn, **jit_kwargs)
    return DonatingJit(fn, consumable, jit_kwargs)
