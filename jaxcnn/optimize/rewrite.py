"""The jaxpr rewriter behind `jaxcnn.optimize`: trace once per input signature, find the
patterns (patterns.py), then evaluate the jaxpr equation by equation with those patterns
replaced by jaxcnn primitives and every other equation bound unchanged.

The evaluation runs under whatever transformation the caller applies (jit, grad, vmap): the
jaxcnn primitives carry their own gradients and batching rules, and unchanged equations are
bound as they were traced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np
from jax.extend.core import Literal
from jax.sharding import AxisType

from jaxcnn import _ffi
from jaxcnn.ops.conv_args import ALGORITHMS
from jaxcnn.optimize.patterns import CALL_PRIMITIVES, MATCHERS, Match, Site, Uses, _inner_jaxpr

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

    def describe(self) -> str:
        shapes = f"x{list(self.x_shape)}"
        if self.w_shape is not None:
            shapes += f" w(HWIO){list(self.w_shape)}" + (" +bias" if self.bias else "")
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items() if v is not None)
        algo = f", algorithm={self.algorithm!r}" if self.algorithm else ""
        where = f" in {self.path}" if self.path else ""
        return (f"{' + '.join(self.replaced)} -> jaxcnn.{self.op}({shapes} {self.dtype}, {args}{algo})"
                f" -> {list(self.out_shape)}{where}")


@dataclass
class Plan:
    """The matches of one jaxpr and the plans of its call equations' bodies."""

    jaxpr: Any
    matches: dict[int, Match] = field(default_factory=dict)  # keyed by the last equation index
    skipped: set[int] = field(default_factory=set)
    calls: dict[int, "Plan"] = field(default_factory=dict)  # only bodies holding a rewrite
    # Run once the inputs are bound, before any equation: each puts values the matches read
    # into the environment (e.g. all weights relaid out in one op rather than one per match).
    prologue: list[Callable[[dict], None]] = field(default_factory=list)

    def rewrites(self, path: str = "") -> list[Rewrite]:
        out = []
        for i, eqn in enumerate(self.jaxpr.eqns):
            if i in self.matches:
                m = self.matches[i]
                s = m.site
                out.append(Rewrite(m.op, m.replaced, s.x_shape, tuple(m.out_var.aval.shape), s.dtype,
                                   s.layout, s.w_shape, s.bias, dict(s.kwargs), m.algorithm if m.op == "conv2d" else None,
                                   path))
            elif i in self.calls:
                name = eqn.params.get("name", "")
                label = f"{eqn.primitive.name}[{name}]" if name else eqn.primitive.name
                out.extend(self.calls[i].rewrites(f"{path}/{label}" if path else label))
        return out


# Pools and softmax stay XLA's under policy="auto": on the H200 (pool_softmax bench) XLA's
# reduce_window / softmax ran at 0.43-1.01x of jaxcnn's time on CNN shapes, and XLA fuses them
# into their neighbours, which a custom call prevents.
AUTO_KEEPS_XLA = ("max_pool2d", "avg_pool2d", "softmax", "log_softmax")


def auto_policy(site: Site) -> str | None:
    """policy="auto": the rewrites that pay. A conv the autotuner has measured on this GPU (its
    cache holds the layer) takes that measured winner, XLA's conv included. Otherwise:
      * depthwise convs (groups == C > 1) run jaxcnn's depthwise kernel;
      * fp32 convs at precision "highest" (HIGH/HIGHEST) run the tensor-core kernel (NHWC,
        groups 1, C >= 8, K a multiple of 4): its 3xTF32 path ran 1.4-3.2x faster than XLA's
        HIGHEST on the H200;
      * on Hopper, bf16/fp16 3x3/1 SAME convs the wgmma kernel takes run it where its tiles
        cover the image exactly, else the tensor-core kernel from 256 input channels on
        (hopper_3x3_choice: VGG-19 1.15-1.21x the original with it, 1.13-1.17x with XLA's);
      * ReLU convs of an image (C < 8) into >= 64 channels run the stem kernel (stem_pays:
        VGG-19's c1_1 2.0-2.5x XLA);
      * every other dense conv (bf16/fp16, fp32 at default/TF32 precision) stays XLA's: on the
        H200 our tensor-core conv ran at 0.84-0.91x of cuDNN on VGG layers and whole models
        with it at 0.98-1.04x of the original, so only a measured win (the cache) rewrites it.
    Convs that would fall back to the CUDA-core direct kernel (NCHW/CHWN, grouped, odd K) stay
    XLA's, as do pools and softmax (AUTO_KEEPS_XLA). fuse= still offers the convs left here
    to XLA to its groups (fire, conv -> max pool), where the fusion planner decides.
    policy="all" rewrites every recognised pattern instead."""
    if site.op != "conv2d":
        return None if site.op in AUTO_KEEPS_XLA else "auto"
    measured = _cached_choice(site)
    if measured is not None:
        return measured
    n, h, w, c = site.logical_x_shape()
    k, groups = site.w_shape[3], site.kwargs["groups"]
    if groups == c > 1 and k % c == 0:
        return "auto"  # the depthwise kernel
    hopper = hopper_3x3_choice(site)
    if hopper is not None:
        return hopper
    if stem_pays(site):
        return "stem"
    if not (jax.numpy.dtype(site.dtype) == jax.numpy.float32 and site.kwargs["precision"] == "highest"):
        return None  # a dense conv at cuDNN's own speed: XLA's unless measured (above)
    # C < 8 (an image's 1-3 channels) pads GEMM-K with zeros: cuDNN's own first-layer kernels
    # won there (H200: a C=1 MNIST conv ran at 0.92x of XLA). fp32 rows: 16 bytes = 4 channels.
    if (site.layout == "NHWC" and groups == 1 and c >= 8 and k % 4 == 0
            and max(site.kwargs["stride"]) <= 8):
        return "auto"  # the tensor-core kernel (3xTF32)
    return None


def unpooled_plan(site: Site, algorithm: str) -> str:
    """The library's plan line for running NHWC groups-1 conv `site` as a conv_pool kernel with
    a 1x1/1 pool (what conv2d's "wgmma" and "stem" algorithms launch), e.g. "kernel=wgmma
    block=28x8 ... recompute=1.00"; "" where the kernel does not take it or no GPU library is
    loaded."""
    if (site.op != "conv2d" or site.layout != "NHWC" or site.kwargs["groups"] != 1
            or jax.default_backend() != "gpu" or not _ffi.handlers_registered()):
        return ""
    from jaxcnn.ops.conv_pool_args import make_conv_pool_config

    k = site.kwargs
    try:
        cfg = make_conv_pool_config(site.x_shape, site.w_shape, stride=k["stride"], padding=k["padding"],
                                    dilation=k["dilation"], pool_window=1, pool_stride=1,
                                    precision=k["precision"], algorithm=algorithm)
    except ValueError:
        return ""
    plan = _ffi.conv_pool_plan(site.x_shape, site.w_shape, site.dtype, cfg) or ""
    return plan if plan.startswith(f"kernel={algorithm}") else ""


def hopper_3x3_choice(site: Site) -> str | None:
    """auto_policy's kernel for a conv jaxcnn.conv2d's Hopper wgmma kernel takes on this
    process's GPU (the library's own plan: bf16/fp16 NHWC 3x3/1 SAME, groups 1, C % 32, K % 64,
    sm_90), else None: "wgmma" where its tiles cover the image exactly (the plan's recompute
    1.00); else "tensor_core" for C >= 256 and XLA's conv (None) below. Measured on an H100
    (benchmarks/results/h100-2026-11-26-optimize_conv_policy_s15.md), VGG-19 bf16 under
    optimize(fuse="auto") in one process: XLA's convs 1.13-1.17x the original, wgmma
    everywhere 1.12-1.23x, this rule 1.15-1.21x. Alone (XLA's time / the kernel's), the wgmma
    kernel ran 0.97-1.59x on the 224-, 112- and 56-pixel layers and 0.76-0.91x at 28 and 14
    pixels, where its 28x8 and 16x16 tiles pad the image by 14% and 31%. Inside VGG the
    tensor-core kernel on those 256-512-channel convs beat XLA's (alone: 0.79-1.01x), but on
    nnx_cnn's 32-channel 14x14 conv it ran 0.97x."""
    plan = unpooled_plan(site, "wgmma")
    if "recompute=" not in plan:
        return None
    if float(plan.split("recompute=")[1].split()[0]) <= 1.0:
        return "wgmma"
    return "tensor_core" if site.logical_x_shape()[3] >= 256 else None


def stem_pays(site: Site) -> bool:
    """Whether auto_policy runs this conv on jaxcnn.conv2d's stem kernel: an NHWC ReLU conv of
    fewer than 8 input channels (an image) and at least 64 output channels that the kernel takes
    on this process's GPU (the library's own plan). Measured on an H100 (VGG-19's c1_1, 224x224
    RGB -> 64, bf16): 285 us vs XLA's 579 us at N=64, 8.0 vs 20.1 us at N=1; the small CNNs'
    1-channel, 6-32-filter convs stay XLA's (not measured)."""
    if site.op != "conv2d" or site.layout != "NHWC" or site.kwargs["activation"] != "relu":
        return False
    if site.logical_x_shape()[3] >= 8 or site.w_shape[3] < 64:
        return False
    return bool(unpooled_plan(site, "stem"))


def _conv_candidates(site: Site) -> list[tuple[str, str]]:
    """The kernels a conv site can run in its own layout, and XLA's conv."""
    channels = site.logical_x_shape()[3]
    candidates = [(site.layout, "direct"), (site.layout, "xla")]
    if site.layout == "NHWC":
        candidates.append(("NHWC", "tensor_core"))
    if site.kwargs["groups"] == channels and channels > 1:
        candidates.append((site.layout, "depthwise"))
    return candidates


def _conv_layer_kwargs(site: Site) -> dict:
    k = site.kwargs
    return dict(stride=k["stride"], padding=k["padding"], dilation=k["dilation"], groups=k["groups"],
                activation=k["activation"], precision=k["precision"], bias=site.bias,
                candidates=_conv_candidates(site))


def _cached_choice(site: Site):
    """The autotuner's measured choice for this conv when its cache already holds one for
    this GPU (e.g. from `jaxcnn layouts --autotune` or policy="autotune"), else None."""
    import jaxcnn.layouts as L  # imported only when a conv site is decided

    return L.cached_conv_choice(site.logical_x_shape(), site.w_shape, site.dtype, **_conv_layer_kwargs(site))


def autotune_policy(site: Site):
    """policy="autotune": jaxcnn.layouts.autotune_conv's choice among the kernels that run in
    the site's own layout and XLA's conv (measured device times on a GPU, cached per GPU kind;
    model estimates elsewhere). XLA winning keeps the conv as lax: never slower than XLA on a
    layer the autotuner measured. Pools and softmax follow auto_policy (XLA's)."""
    if site.op != "conv2d":
        return auto_policy(site)
    import jaxcnn.layouts as L  # not imported by jaxcnn.optimize until this policy is used

    return L.autotune_conv(site.logical_x_shape(), site.w_shape, site.dtype, **_conv_layer_kwargs(site))


def choose_algorithm(policy, site: Site) -> str | None:
    """The conv algorithm for `site` (None: leave the pattern as lax)."""
    if policy == "all":
        return "auto"
    if policy == "auto":
        policy = auto_policy
    if policy == "autotune":
        policy = autotune_policy
    choice = policy(site)
    if choice is None or choice == "xla":
        return None
    if site.op != "conv2d":
        return "auto"
    algorithm = getattr(choice, "algorithm", choice)  # a layouts.ConvChoice works too
    if algorithm == "xla":
        return None
    if algorithm not in ALGORITHMS:
        raise ValueError(f"policy returned algorithm {algorithm!r} for {site}; expected one of {ALGORITHMS} or None")
    return algorithm


def build_plan(jaxpr, policy) -> Plan:
    plan = Plan(jaxpr)
    uses = Uses(jaxpr)
    claimed: set[int] = set()
    for i, eqn in enumerate(jaxpr.eqns):
        if i in claimed:
            continue
        matcher = MATCHERS.get(eqn.primitive.name)
        match = matcher(uses, i) if matcher else None
        if match is not None and not claimed.intersection(match.eqn_indices):
            algorithm = choose_algorithm(policy, match.site)
            if algorithm is not None:
                match.algorithm = algorithm
                match.build = match.make_build(algorithm)
                last = max(match.eqn_indices)
                plan.matches[last] = match
                claimed.update(match.eqn_indices)
                plan.skipped.update(j for j in match.eqn_indices if j != last)
                continue
        body = _inner_jaxpr(eqn)
        if body is not None:
            child = build_plan(body, policy)
            if child.matches or child.calls:
                plan.calls[i] = child
    return plan


def declined_convs(plan: Plan, uses: Uses | None = None) -> list[Match]:
    """The conv patterns of plan.jaxpr (not its call bodies) the policy left to XLA: fuse= and
    sparse="auto" still offer them to a fused group or the sparse kernel, decided by a
    measurement (or the fusion cost model) against XLA."""
    uses = Uses(plan.jaxpr) if uses is None else uses
    out = []
    taken = set(plan.matches) | plan.skipped
    for i, eqn in enumerate(plan.jaxpr.eqns):
        if eqn.primitive.name != "conv_general_dilated" or i in taken:
            continue
        m = MATCHERS["conv_general_dilated"](uses, i)
        if m is not None and not taken.intersection(m.eqn_indices):
            out.append(m)
    return out


def evaluate(plan: Plan, consts, args) -> list:
    """Evaluates plan.jaxpr on `args` with the planned replacements."""
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
    for i, eqn in enumerate(jaxpr.eqns):
        if i in plan.skipped:
            continue
        if i in plan.matches:
            m = plan.matches[i]
            env[m.out_var] = m.build(*map(read, m.in_vars))
            continue
        invals = list(map(read, eqn.invars))
        if i in plan.calls:
            # The body holds a rewrite: inline it (custom_jvp/vjp bodies then differentiate
            # through the jaxcnn primitives' own rules instead of the custom rule).
            body = plan.calls[i].jaxpr
            # custom_vjp_call may pass leading operands its body does not take.
            outs = evaluate(plan.calls[i], _call_consts(eqn), invals[len(invals) - len(body.invars):])
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*invals, **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


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
    plan: Plan | None
    sparse: list = field(default_factory=list)  # (Match, sparse_dispatch.Decision) per conv site


def _sparse_build(m: Match):
    """The conv match's replacement as jaxcnn.sparse_conv2d (weights to HWIO, bias to [K])."""
    kwargs, k = m.site.kwargs, m.site.w_shape[3]

    def build(x, w, *b):
        from jaxcnn.ops.sparse_conv2d import sparse_conv2d

        return sparse_conv2d(x, m.weight_hwio(w), b[0].reshape(k) if b else None, stride=kwargs["stride"],
                             padding=kwargs["padding"], dilation=kwargs["dilation"],
                             activation=kwargs["activation"], precision=kwargs["precision"])
    return build


def plan_sparse(plan: Plan, closed, leaves) -> list:
    """sparse="auto": for each top-level NHWC conv (groups 1, undilated; matched by the policy
    or left to XLA by it), the fraction of zeros of its input on these concrete arguments, and
    jaxcnn.sparse_dispatch's pick at that sparsity from the crossover measured for the layer on
    this GPU (none measured: dense). A sparse pick swaps the match's build for
    jaxcnn.sparse_conv2d (a conv the policy left to XLA joins the plan); a dense pick leaves
    the conv as the policy had it. Returns (match, Decision)s."""
    from jaxcnn import sparse_dispatch

    convs = sorted([*plan.matches.values(), *declined_convs(plan)], key=lambda m: max(m.eqn_indices))
    sites = [m for m in convs
             if m.op == "conv2d" and m.site.layout == "NHWC" and m.site.kwargs["groups"] == 1
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
    """`fn` with jaxcnn kernels in place of the lax patterns it traces to (see `optimize`)."""

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
        if not traced.sparse and not traced.plan.rewrites():
            # Nothing rewritten: fn itself, not its re-emitted jaxpr (H200: re-emitting VGG-19
            # unchanged ran at 0.96x of the original at N=64).
            return self.fn(*args, **kwargs)
        flat = jax.tree.leaves((args, kwargs))
        outs = evaluate(traced.plan, traced.closed.consts, flat)
        return jax.tree.unflatten(traced.out_tree, outs)

    def _args(self, args, kwargs):
        if args or kwargs:
            return args, kwargs
        if self.example_args is None:
            raise ValueError("args: pass fn's arguments (or give optimize example_args)")
        return self.example_args, {}

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
        summary = ", ".join(f"{n} {op}" for op, n in counts.items()) or "no pattern found"
        lines = [f"{len(found)} rewrite(s): {summary}"]
        lines += [f"  {i}. {r.describe()}" for i, r in enumerate(found, 1)]
        picks = self._traced(*self._args(args, kwargs)).sparse
        if picks:
            lines.append(f"dense or sparse ({len(picks)} conv(s), sparse='auto'):")
            for m, decision in picks:
                shapes = f"x{list(m.site.x_shape)} w(HWIO){list(m.site.w_shape)}"
                lines.append(f"  {shapes}: " + decision.explain().replace("\n", "\n    "))
        return "\n".join(lines)


def optimize(fn: Callable, *, example_args=None, policy="auto", fuse="none", sparse="none") -> Optimized:
    """`fn` with the lax patterns it traces to replaced by jaxcnn kernels.

    Recognised (also inside jit / closed_call / custom_jvp / custom_vjp bodies, e.g. jax.nn.relu):
      * conv_general_dilated with 2 spatial dims, activations NHWC/NCHW/CHWN, any weight order
        (transposed to HWIO), strides, padding, rhs_dilation, feature groups, DEFAULT/HIGH/HIGHEST
        precision, [+ bias broadcast along the channel axis] [+ max(x, 0)] -> jaxcnn.conv2d;
      * reduce_window_max -> max_pool2d; reduce_window_sum / window size (f32, or between the
        f32 converts of a bf16/f16 model) -> avg_pool2d(count_include_pad=True);
      * jax.nn.softmax / log_softmax over one axis -> jaxcnn.softmax / log_softmax;
      * with `fuse`: fire modules (squeeze 1x1 -> [expand 1x1, expand 3x3] -> concatenate, as
        three of the conv matches above) -> one fused jaxcnn.fire, and NHWC conv + ReLU read
        only by a max pool -> jaxcnn.conv2d_pool (jaxcnn.fusion.optimize; also for convs the
        policy leaves to XLA).
    A bias or ReLU is fused only when nothing else reads the value before it. Everything else
    (lhs_dilation, batch groups, a preferred_element_type that changes the dtype, ...) runs as
    traced. The result works under jax.jit, jax.grad and jax.vmap.

    Args:
      fn: the function to optimize (array pytrees in, array pytrees out).
      example_args: optional tuple of arguments: traced now, and the default of explain/rewrites.
      policy: "auto" (the rewrites that pay on a Hopper GPU: depthwise convs, fp32
        precision="highest" convs on the tensor-core kernel, and any conv whose autotuner
        measurement (cached) beat XLA; other dense convs stay XLA's; see auto_policy), "all"
        (every recognised pattern, conv2d picking its kernel), "xla" (nothing is rewritten),
        "autotune" (each conv takes jaxcnn.layouts.autotune_conv's winner among its layout's
        kernels and XLA's conv, see autotune_policy), or a
        callable(Site) -> algorithm name ("auto", "tensor_core", "direct", "depthwise"; "xla" or
        None keeps that op as lax). Off CUDA the rewritten ops run their lax reference. Plugging
        in the autotuner (it measures on a GPU, and falls back to a model estimate elsewhere):

            import jaxcnn.layouts as L
            def tuned(site):
                if site.op != "conv2d":
                    return "auto"
                k = site.kwargs
                return L.autotune_conv(site.logical_x_shape(), site.w_shape, site.dtype,
                                       stride=k["stride"], padding=k["padding"],
                                       dilation=k["dilation"], groups=k["groups"],
                                       activation=k["activation"], bias=site.bias).algorithm
            fast = jaxcnn.optimize(model_fn, policy=tuned)

      fuse: "none" (no cross-layer fusion), "auto" (each fire-shaped group and each NHWC
        conv+ReLU read only by a max pool fused, into jaxcnn.fire / jaxcnn.conv2d_pool, where the
        fusion planner measures the fused kernel faster on this GPU, or its cost model says so
        off GPU), "all", or a callable(jaxcnn.fusion.JaxprGroup) -> bool.
      sparse: "none" (dense convs) or "auto": each top-level NHWC conv (groups 1, undilated)
        runs jaxcnn.sparse_conv2d where jaxcnn.sparse_dispatch's crossover, measured for that
        layer on this GPU (sparse_dispatch.measure_crossover), says so at the fraction of zeros
        its input has on the concrete arguments traced (example_args, or the first call outside
        jit); no crossover measured means dense. explain() lists each pick and why. A conv
        that fusion takes (fuse=) runs fused whatever its pick.

    Returns:
      An `Optimized` callable with `.explain(*args)` (text) and `.rewrites(*args)` (Rewrite list);
      the trace is cached per argument structure, shapes and dtypes.
    """
    if fuse != "none":
        from jaxcnn.fusion.user import GROUPS, optimize as fused_optimize  # imports this module

        if not (callable(fuse) or fuse in GROUPS):
            raise ValueError(f"fuse must be one of {GROUPS} or a callable(group) -> bool, got {fuse!r}")
        return fused_optimize(fn, example_args=example_args, policy=policy, groups=fuse, sparse=sparse)
    return Optimized(fn, example_args, policy, sparse)
