"""The jaxpr rewriter behind `jaxcnn.optimize`: trace once per input signature, find the
patterns (patterns.py), then evaluate the jaxpr equation by equation with those patterns
replaced by jaxcnn primitives and every other equation bound unchanged.

The evaluation runs under whatever transformation the caller applies (jit, grad, vmap): the
jaxcnn primitives carry their own gradients and batching rules, and unchanged equations are
bound as they were traced.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np
from jax.extend.core import Literal
from jax.sharding import AxisType

from jaxcnn.tuning import sparse_dispatch
from jaxcnn.ops.sparse_conv2d.api import sparse_conv2d
from jaxcnn.optimize.conv_sites import OURS, algorithm_for, conv_site
from jaxcnn.optimize.jaxpr_reading import bind
from jaxcnn.optimize.patterns import MATCHERS as OP_MATCHERS
from jaxcnn.optimize.patterns import Match, Site, Uses, _inner_jaxpr
from jaxcnn.optimize.policy import auto_policy, choose_algorithm
from jaxcnn.optimize.pool_conv import POOL_CONV, match_sum_pool, pool_conv_algorithm, pool_conv_site
from jaxcnn.optimize.weight_prologue import plan_weight_prologue
from jaxcnn.tuning.decision import BASELINE, Candidate, can_measure, decide_all, fingerprint
from jaxcnn.tuning.decision import Site as DecisionSite

PROGRAM = "jaxcnn"  # the whole rewritten program, as a decision candidate
# The anchor primitive -> its matcher: patterns.py's ops, and a sum pool read by a 1x1 conv
# (pool_conv.py) tried before the pool alone.
MATCHERS = {**OP_MATCHERS, "reduce_window_sum": match_sum_pool}
POLICIES = ("auto", "all", "xla", "autotune")
SPARSE = ("none", "auto")


@dataclass(frozen=True)
class Rewrite:
    """One replaced pattern: what it was, what runs instead, where (call path)."""

    op: str
    replaced: tuple[str, ...]
    x_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: str
    layout: str | None
    w_shape: tuple[int, ...] | None
    bias: bool
    kwargs: dict
    algorithm: str | None
    path: str
    why: str = ""  # the decision owner's explanation (conv sites under policy="auto")
    eqn_indices: tuple[int, ...] = ()  # the equations of its jaxpr (at `path`) it replaced

    def describe(self) -> str:
        shapes = f"x{list(self.x_shape)}"
        if self.w_shape is not None:
            shapes += f" w(HWIO){list(self.w_shape)}" + (" +bias" if self.bias else "")
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items() if v is not None)
        algo = f", algorithm={self.algorithm!r}" if self.algorithm else ""
        where = f" in {self.path}" if self.path else ""
        why = f"\n       chosen: {self.why}" if self.why else ""
        return (f"{' + '.join(self.replaced)} -> jaxcnn.{self.op}({shapes} {self.dtype}, {args}{algo})"
                f" -> {list(self.out_shape)}{where}{why}")


@dataclass
class RewritePlan:
    """The matches of one jaxpr and the plans of its call equations' bodies."""

    jaxpr: Any
    matches: dict[int, Match] = field(default_factory=dict)  # keyed by the last equation index
    skipped: set[int] = field(default_factory=set)
    calls: dict[int, "RewritePlan"] = field(default_factory=dict)  # only bodies holding a rewrite
    # Run once the inputs are bound, before any equation: each puts values the matches read
    # into the environment (e.g. all weights relaid out in one op rather than one per match).
    prologue: list[Callable[[dict], None]] = field(default_factory=list)
    found: Any = None  # the Found this plan was assembled from (every site, kept or not)
    # The folds of its rewritten convs in one op (weight_prologue), planned on first evaluation
    # (once the fused groups have taken their convs); None when no conv takes part.
    weight_prologue: Any = None
    weight_prologue_planned: bool = False

    def folds(self):
        """The plan's WeightPrologue (planned now if not yet), or None."""
        if not self.weight_prologue_planned:
            self.weight_prologue = plan_weight_prologue(self)
            self.weight_prologue_planned = True
        return self.weight_prologue

    def forget_folds(self) -> None:
        """After its matches change (fused groups took convs): the prologue is planned again."""
        self.weight_prologue, self.weight_prologue_planned = None, False
        for child in self.calls.values():
            child.forget_folds()

    def folded_convs(self, constant: bool = False) -> int:
        """Convs folded by the weight prologues of this plan and its call bodies (constant: those
        whose weights are the program's constants, folded once when it is traced)."""
        folds = self.folds()
        own = 0 if folds is None else folds.constant if constant else len(folds.folds)
        return own + sum(c.folded_convs(constant) for c in self.calls.values())

    def declined(self) -> list[Match]:
        """The sites found but kept as traced (their policy or decision chose XLA's own)."""
        if self.found is None:
            return []
        return [m for _, _, m in self.found.all_matches() if m.algorithm is None]

    def has_rewrites(self) -> bool:
        """Whether any match is replaced here or in a call body (calls holds only bodies with one)."""
        return bool(self.matches or self.calls)

    def rewrites(self, path: str = "") -> list[Rewrite]:
        out = []
        for i, eqn in enumerate(self.jaxpr.eqns):
            if i in self.matches:
                m = self.matches[i]
                s = m.site
                out.append(Rewrite(m.op, m.replaced, s.x_shape, tuple(m.out_var.aval.shape), s.dtype,
                                   s.layout, s.w_shape, s.bias, dict(s.kwargs), m.algorithm if m.op == "conv2d" else None,
                                   path, m.decision.explain() if m.decision is not None else "",
                                   tuple(m.eqn_indices)))
            elif i in self.calls:
                name = eqn.params.get("name", "")
                label = f"{eqn.primitive.name}[{name}]" if name else eqn.primitive.name
                out.extend(self.calls[i].rewrites(f"{path}/{label}" if path else label))
        return out


@dataclass
class Found:
    """Every pattern of one jaxpr (claimed greedily in program order) and of its call bodies."""

    jaxpr: Any
    uses: Uses
    matches: list[Match] = field(default_factory=list)
    calls: dict[int, "Found"] = field(default_factory=dict)

    def all_matches(self, path: str = ""):
        """(path, Found, match) for every match here and in the call bodies."""
        for m in self.matches:
            yield path, self, m
        for i, child in self.calls.items():
            yield from child.all_matches(f"{path}/{_call_label(self.jaxpr.eqns[i])}" if path else _call_label(self.jaxpr.eqns[i]))


def _call_label(eqn) -> str:
    name = eqn.params.get("name", "")
    return f"{eqn.primitive.name}[{name}]" if name else eqn.primitive.name


def find_matches(jaxpr) -> Found:
    found = Found(jaxpr, Uses(jaxpr))
    claimed = found.uses.blocked  # a later match stops where an earlier one took equations
    for i, eqn in enumerate(jaxpr.eqns):
        if i in claimed:
            continue
        matcher = MATCHERS.get(eqn.primitive.name)
        match = matcher(found.uses, i) if matcher else None
        if match is not None and not claimed.intersection(match.eqn_indices):
            found.matches.append(match)
            claimed.update(match.eqn_indices)
            continue
        body = _inner_jaxpr(eqn)
        if body is not None:
            child = find_matches(body)
            if child.matches or child.calls:
                found.calls[i] = child
    return found


def decide_matches(found: Found, policy) -> None:
    """Sets each match's algorithm (None: it stays as traced) and, for conv sites under
    policy="auto", its Decision: measured against XLA's own subgraph on this GPU (all pending
    sites in one trace, cached on disk), by auto_policy's rules elsewhere."""
    entries = list(found.all_matches())
    sites = []
    for path, where, m in entries:
        m.path = path
        if policy == "auto" and m.op == "conv2d":
            sites.append((m, conv_site(where.uses, m, functools.partial(_rule, m.site))))
        elif policy == "auto" and m.op == POOL_CONV:
            sites.append((m, pool_conv_site(where.uses, m)))
        else:
            m.algorithm = choose_algorithm(policy, m.site)
    for (m, _), d in zip(sites, decide_all([site for _, site in sites])):
        m.decision = d
        m.algorithm = (pool_conv_algorithm if m.op == POOL_CONV else algorithm_for)(d.choice)


def _rule(site: Site) -> tuple[str, str]:
    """auto_policy as a decision: (choice, reason) where nothing can be measured."""
    choice = auto_policy(site)
    algorithm = getattr(choice, "algorithm", choice)  # a cached autotuner ConvChoice, or a name
    if algorithm is None:
        return BASELINE, "a dense conv at cuDNN's own speed stays XLA's unless measured"
    if algorithm == "xla":
        return BASELINE, "the autotuner's cached measurement: XLA's conv won"
    how = "the autotuner's cached measurement" if algorithm is not choice else "auto_policy's rules"
    return OURS + algorithm, f"{how} pick {algorithm!r}"


def assemble(found: Found) -> RewritePlan:
    """The plan of the matches whose algorithm is set."""
    plan = RewritePlan(found.jaxpr)
    plan.found = found
    for m in found.matches:
        if m.algorithm is None:
            continue
        m.build = m.make_build(m.algorithm)
        last = max(m.eqn_indices)
        plan.matches[last] = m
        plan.skipped.update(j for j in m.eqn_indices if j != last)
    for i, child in found.calls.items():
        sub = assemble(child)
        if sub.matches or sub.calls:
            plan.calls[i] = sub
    return plan


def build_plan(jaxpr, policy) -> RewritePlan:
    found = find_matches(jaxpr)
    decide_matches(found, policy)
    return assemble(found)


def declined_convs(plan: RewritePlan, uses: Uses | None = None) -> list[Match]:
    """The conv patterns of plan.jaxpr (not its call bodies) the policy left to XLA: fuse= and
    sparse="auto" still offer them to a fused group or the sparse kernel, decided by a
    measurement (or the fusion cost model) against XLA."""
    taken = set(plan.matches) | plan.skipped
    if plan.found is not None:  # the sites decide_matches kept as traced
        return [m for m in plan.found.matches
                if m.op == "conv2d" and m.algorithm is None and not taken.intersection(m.eqn_indices)]
    uses = Uses(plan.jaxpr) if uses is None else uses
    out = []
    for i, eqn in enumerate(plan.jaxpr.eqns):
        if eqn.primitive.name != "conv_general_dilated" or i in taken:
            continue
        m = MATCHERS["conv_general_dilated"](uses, i)
        if m is not None and not taken.intersection(m.eqn_indices):
            out.append(m)
    return out


def evaluate(plan: RewritePlan, consts, args, *, weight_prologue: bool = True) -> list:
    """Evaluates plan.jaxpr on `args` with the planned replacements; weight_prologue=False runs
    each match's own build (its own fold), e.g. to record what each match reads."""
    jaxpr = plan.jaxpr
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for step in plan.prologue:
        step(env)
    folds = plan.folds() if weight_prologue else None
    early, replaced = (set(folds.early), folds.replaced) if folds is not None else (set(), {})
    if folds is not None:
        folds.run(env, _bind_eqn, jaxpr.eqns)
    for i, eqn in enumerate(jaxpr.eqns):
        if i in plan.skipped or i in early:
            continue
        if i in plan.matches:
            m = plan.matches[i]
            in_vars, build = replaced.get(i, (m.in_vars, m.build))
            env[m.out_var] = build(*map(read, in_vars))
            continue
        if i in plan.calls:
            invals = list(map(read, eqn.invars))
            # The body holds a rewrite: inline it (custom_jvp/vjp bodies then differentiate
            # through the jaxcnn primitives' own rules instead of the custom rule).
            body = plan.calls[i].jaxpr
            # custom_vjp_call may pass leading operands its body does not take.
            outs = evaluate(plan.calls[i], _call_consts(eqn), invals[len(invals) - len(body.invars):],
                            weight_prologue=weight_prologue)
            env.update(zip(eqn.outvars, outs))
        else:
            _bind_eqn(eqn, env)
    return [read(v) for v in jaxpr.outvars]


def _bind_eqn(eqn, env: dict) -> None:
    """Runs one traced equation on the values in `env` and puts its outputs there."""
    env.update(zip(eqn.outvars, bind(eqn, [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars])))


def _call_consts(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = eqn.params.get(key)
        if body is not None:
            return list(getattr(body, "consts", ()))
    return []


def _explicit_sharding(aval):
    """The aval's sharding where a mesh with Explicit axes gives it (and so the traced jaxpr's
    types must carry it: a sharding-less type reads as replicated there), else None."""
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty or not any(t == AxisType.Explicit for t in mesh.axis_types):
        return None
    return sharding


@dataclass
class _Traced:
    closed: Any
    out_tree: Any
    plan: RewritePlan | None
    sparse: list = field(default_factory=list)  # (Match, sparse_dispatch.Decision) per conv site
    program: Any = None  # the whole-program Decision (policy="auto" on a GPU), once made
    program_checked: bool = False


def _sparse_build(m: Match):
    """The conv match's replacement as jaxcnn.sparse_conv2d (weights to HWIO, bias to [K])."""
    kwargs, k = m.site.kwargs, m.site.w_shape[3]

    def build(x, w, *b):
        return sparse_conv2d(x, m.weight_hwio(w), b[0].reshape(k) if b else None, stride=kwargs["stride"],
                             padding=kwargs["padding"], dilation=kwargs["dilation"],
                             activation=kwargs["activation"], precision=kwargs["precision"])
    return build


def plan_sparse(plan: RewritePlan, closed, leaves) -> list:
    """sparse="auto": for each top-level NHWC conv (groups 1, undilated, at most a bias and ReLU
    after it: sparse_conv2d takes no folded BatchNorm or residual; matched by the policy
    or left to XLA by it), the fraction of zeros of its input on these concrete arguments, and
    jaxcnn.tuning.sparse_dispatch's pick at that sparsity from the crossover measured for the layer on
    this GPU (none measured: dense). A sparse pick swaps the match's build for
    jaxcnn.sparse_conv2d (a conv the policy left to XLA joins the plan); a dense pick leaves
    the conv as the policy had it. Returns (match, Decision)s."""
    convs = sorted([*plan.matches.values(), *declined_convs(plan)], key=lambda m: max(m.eqn_indices))
    sites = [m for m in convs
             if m.op == "conv2d" and m.site.layout == "NHWC" and m.site.kwargs["groups"] == 1 and m.plain
             and tuple(m.site.kwargs["dilation"]) == (1, 1) and not isinstance(m.in_vars[0], Literal)]
    if not sites:
        return []
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        raise ValueError("sparse='auto' measures each conv input's zeros on concrete arguments: give "
                         "optimize example_args (or call the optimized function outside jit first)")
    jaxpr = plan.jaxpr
    # The same program, returning each site's input instead of the outputs.
    info = jaxpr.debug_info
    probe = jaxpr.replace(outvars=[m.in_vars[0] for m in sites],
                          debug_info=None if info is None else info._replace(result_paths=None))
    inputs = jax.core.eval_jaxpr(probe, closed.consts, *leaves)
    table, device = sparse_dispatch.CrossoverTable(), sparse_dispatch.device_kind()
    picks = []
    for m, x in zip(sites, inputs):
        s = m.site
        sparsity = float(np.mean(np.asarray(x) == 0))
        decision = sparse_dispatch.choose(s.x_shape, s.w_shape, s.dtype, sparsity, stride=s.kwargs["stride"],
                                          padding=s.kwargs["padding"], precision=s.kwargs["precision"],
                                          table=table, device=device)
        if decision.sparse:
            m.build, m.algorithm = _sparse_build(m), "sparse"
            last = max(m.eqn_indices)
            if plan.matches.get(last) is not m:  # a conv the policy left to XLA
                plan.matches[last] = m
                plan.skipped.update(j for j in m.eqn_indices if j != last)
        picks.append((m, decision))
    return picks


class Optimized:
    """`fn` with jaxcnn kernels in place of the lax patterns it traces to (see api.optimize)."""

    def __init__(self, fn: Callable, example_args, policy, sparse="none"):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if not (callable(policy) or policy in POLICIES):
            raise ValueError(f"policy must be one of {POLICIES} or a callable(site) -> algorithm, got {policy!r}")
        if not (isinstance(sparse, str) and sparse in SPARSE):
            raise ValueError(f"sparse must be one of {SPARSE}, got {sparse!r}")
        self.sparse = sparse
        if example_args is not None and not isinstance(example_args, (tuple, list)):
            raise TypeError(f"example_args must be a tuple of fn's positional arguments, got {type(example_args).__name__}")
        self.fn = fn
        self.policy = policy
        self.example_args = None if example_args is None else tuple(example_args)
        self._cache: dict = {}
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "optimized")
        self.__doc__ = getattr(fn, "__doc__", None)
        if self.example_args is not None and policy != "xla":
            self._traced(self.example_args, {})

    def _traced(self, args, kwargs) -> _Traced:
        leaves, treedef = jax.tree.flatten((args, kwargs))
        avals = []
        for leaf in leaves:
            try:
                aval = jax.typeof(leaf)
            except TypeError:
                raise TypeError(f"args: every leaf must be an array or scalar, got {type(leaf).__name__}") from None
            avals.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False),
                                              sharding=_explicit_sharding(aval)))
        key = (treedef, tuple((a.shape, a.dtype, a.weak_type, a.sharding) for a in avals))
        traced = self._cache.get(key)
        if traced is None:
            def flat_fn(*flat):
                a, k = jax.tree.unflatten(treedef, flat)
                return self.fn(*a, **k)
            closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*avals)
            plan = None if self.policy == "xla" else build_plan(closed.jaxpr, self.policy)
            picks = plan_sparse(plan, closed, leaves) if plan is not None and self.sparse == "auto" else []
            traced = self._cache[key] = _Traced(closed, jax.tree.structure(out_shape), plan, picks)
        return traced

    def __call__(self, *args, **kwargs):
        if self.policy == "xla":
            return self.fn(*args, **kwargs)
        traced = self._traced(args, kwargs)
        if self._runs_rewrites(traced) is False:
            return self.fn(*args, **kwargs)
        flat = jax.tree.leaves((args, kwargs))
        outs = evaluate(traced.plan, traced.closed.consts, flat)
        return jax.tree.unflatten(traced.out_tree, outs)

    def _program_decision(self, traced: _Traced):
        """policy="auto" where the kernels run: the rewritten program as a whole against fn's
        own, measured once per program and GPU (cached like the sites). Sites measured alone
        do not always add up (XLA fuses across them), so the rewritten program runs only where
        it beats fn's by the decision owner's margin. None where nothing is measured."""
        if traced.program_checked:
            return traced.program
        traced.program_checked = True
        if self.policy != "auto" or traced.sparse or not can_measure():
            return None
        closed, plan = traced.closed, traced.plan
        rewrites = " ".join(f"{r.op}:{r.algorithm}:{r.path}" for r in plan.rewrites())
        rewrites += f" weight_prologue:{plan.folded_convs()}"  # a program of another build differs
        fields = dict(kind="program", jaxpr=fingerprint(str(closed.jaxpr)), rewrites=fingerprint(rewrites))
        candidates = [Candidate(BASELINE, lambda *flat: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *flat)),
                      Candidate(PROGRAM, lambda *flat: evaluate(plan, closed.consts, list(flat)))]
        site = DecisionSite(fields, candidates, [v.aval for v in closed.jaxpr.invars],
                            lambda: (PROGRAM, "not measured"))
        (traced.program,) = decide_all([site])
        return traced.program

    def _args(self, args, kwargs):
        if args or kwargs:
            return args, kwargs
        if self.example_args is None:
            raise ValueError("args: pass fn's arguments (or give optimize example_args)")
        return self.example_args, {}

    def runs_rewrites(self, *args, **kwargs) -> bool | None:
        """Whether calls on these arguments run the rewritten program: False where the whole
        program measured no faster than fn (fn runs unchanged, whatever rewrites() lists) or
        nothing is rewritten, None where the program is not measured (off GPU, other policies)."""
        if self.policy == "xla":
            return False
        return self._runs_rewrites(self._traced(*self._args(args, kwargs)))

    def _runs_rewrites(self, traced: _Traced) -> bool | None:
        if not traced.sparse and not traced.plan.has_rewrites():
            # Nothing rewritten: fn itself, not its re-emitted jaxpr (H200: re-emitting VGG-19
            # unchanged ran at 0.96x of the original at N=64).
            return False
        program = self._program_decision(traced)
        return None if program is None else program.choice == PROGRAM

    def rewritten(self, *args, **kwargs) -> Callable:
        """The rewritten program for arguments like these, as a function of the same arguments,
        whether or not the whole-program check lets calls run it (to time or profile what it
        declined). fn itself where nothing is rewritten."""
        if self.policy == "xla":
            return self.fn
        traced = self._traced(*self._args(args, kwargs))

        def run(*a, **k):
            outs = evaluate(traced.plan, traced.closed.consts, jax.tree.leaves((a, k)))
            return jax.tree.unflatten(traced.out_tree, outs)

        return run

    def rewrites(self, *args, **kwargs) -> list[Rewrite]:
        """The rewrites applied to fn on these arguments (default: example_args), in program order."""
        if self.policy == "xla":
            return []
        return self._traced(*self._args(args, kwargs)).plan.rewrites()

    def explain(self, *args, **kwargs) -> str:
        """The rewrites as text, one line each, after a count."""
        if self.policy == "xla":
            return "policy='xla': no rewrite; fn runs unchanged"
        found = self.rewrites(*args, **kwargs)
        counts = {}
        for r in found:
            counts[r.op] = counts.get(r.op, 0) + 1
        traced = self._traced(*self._args(args, kwargs))
        declined = traced.plan.declined()
        summary = ", ".join(f"{n} {op}" for op, n in counts.items()) or (
            "none kept" if declined else "no pattern found")
        lines = [f"{len(found)} rewrite(s): {summary}"]
        lines += [f"  {i}. {r.describe()}" for i, r in enumerate(found, 1)]
        folded = traced.plan.folded_convs()
        if folded:
            lines.append(f"weight prologue: {folded} conv(s) take their folded weights and bias from one "
                         "jaxcnn.fold_weights per program (each conv's own layout)")
            constant = traced.plan.folded_convs(constant=True)
            if constant:
                lines.append(f"  {constant} of them fold once, when the program is traced: their weights and "
                             "BatchNorm vectors are the function's constants (closed over)")
        if declined:
            lines.append(f"{len(declined)} site(s) found and kept as traced (XLA's own):")
            for m in declined:
                why = m.decision.explain() if m.decision is not None else f"policy {self.policy!r} keeps it"
                shapes = f" x{list(m.site.x_shape)}" + (f" w(HWIO){list(m.site.w_shape)}" if m.site.w_shape else "")
                where = f" in {m.path}" if m.path else ""
                lines.append(f"  - {' + '.join(m.replaced)}{shapes} {m.site.dtype}{where}: {why}")
        program = self._program_decision(traced)
        if program is not None:
            verdict = "the rewrites run" if program.choice == PROGRAM else "fn runs unchanged"
            lines.append(f"whole program: {verdict}: {program.explain()}")
        picks = traced.sparse
        if picks:
            lines.append(f"dense or sparse ({len(picks)} conv(s), sparse='auto'):")
            for m, decision in picks:
                shapes = f"x{list(m.site.x_shape)} w(HWIO){list(m.site.w_shape)}"
                lines.append(f"  {shapes}: " + decision.explain().replace("\n", "\n    "))
        return "\n".join(lines)
