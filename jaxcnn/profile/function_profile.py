"""Profile any function per conv site, into the same ModelProfile (and store run) as a zoo model.

    from jaxcnn.profile.function_profile import profile_function
    profile = profile_function(model.apply, (params, x), name="my_cnn", store="profiles.sqlite")

The layers are the conv sites jaxcnn.optimize's rewriter finds in fn's jaxpr (a conv with its
epilogue: bias or folded BatchNorm, residual add, activation; also inside jit / custom_jvp /
custom_vjp bodies), and the average pools read by a 1x1 conv (optimize/pool_conv.py: the
pool with its conv, "commuted" where optimize runs the conv first). jaxcnn.optimize(fn) with
its defaults decides first; then each site is timed
alone on its own inputs as fn computes them from example_args, on two backends:

    xla     the site's equations exactly as traced (what fn runs);
    jaxcnn  what that optimize runs at the site, as the decision owner's candidate of that name
            (jaxcnn.optimize.conv_sites): "xla_folded" (XLA's conv on BatchNorm-folded weights)
            or "jaxcnn:<alg>" (jaxcnn.conv2d with the whole epilogue) where optimize rewrote the
            site alone, timed as optimize measures it (where BatchNorm folds: on weights folded
            beforehand, plus the site's share of the program's one fold, none where the weights
            are fn's constants); "xla", the traced equations again (its xla time, ratio 1.0),
            where optimize kept the site as traced or fused it into a group, whose gain shows
            end to end only.

End to end, "xla" is fn itself and "jaxcnn" is that optimize(fn); each site records what it
decided there (its params' "optimize"), the candidate its jaxcnn time is of ("candidate") and
the fold share that time includes ("fold_share_ms", None without one).
Like profile_model, a machine without a GPU times the lax reference path with host wall time
(and optimize decides by its rules, unmeasured) and says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxcnn.models.layers import LayerInfo
from jaxcnn.ops.conv2d.config import conv2d_flops
from jaxcnn.optimize import optimize
from jaxcnn.optimize.conv_sites import FOLDED, OURS, site_candidate, subgraph_fn
from jaxcnn.optimize.pool_conv import COMMUTED, POOL_CONV, pool_conv_candidate
from jaxcnn.optimize.rewrite import assemble, evaluate, find_matches
from jaxcnn.profile.device_time import DeviceTiming, device_times, stats_fields
from jaxcnn.profile.environment import collect_environment
from jaxcnn.profile.gpu_specs import floor_ms, lookup_gpu_spec
from jaxcnn.profile.model_profile import LayerProfile, ModelProfile
from jaxcnn.profile.profiler import (
    BACKENDS,
    check_count,
    timing_note,
    whole_model_timings,
    zero_fraction,
)
from jaxcnn.profile.record import record_profile, writable_store
from jaxcnn.tuning.decision import BASELINE, Candidate, candidate_runs, prepared, shared_cases, shared_share_ms

# Any algorithm puts a match in the plan site_inputs evaluates (its build is then replaced).
RECORDING_ALGORITHM = "auto"
# The matches profiled as layers: conv sites, and average pools read by a 1x1 conv (the conv's
# layer, with the pool before or after it as optimize decides).
SITE_OPS = ("conv2d", POOL_CONV)


class SiteChoice(NamedTuple):
    """What jaxcnn.optimize(fn) runs at a conv site: in words, and as the name of the decision
    owner's candidate the site's "jaxcnn" time is of."""

    optimize: str
    candidate: str


def profile_function(
    fn: Callable,
    example_args: Sequence,
    *,
    name: str | None = None,
    batch: int | None = None,
    backends: Sequence[str] = BACKENDS,
    iters: int = 20,
    warmup: int = 3,
    sparsity: bool = True,
    predict: bool = True,
    store: Any = None,
    note: str = "",
    extra: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ModelProfile:
    """Profile fn(*example_args) per conv site (see the module doc) and end to end.

    name: the model's name in the store (default fn's __name__); batch: the run's batch (default
    the N of the first conv site's input); backends: "xla" and/or "jaxcnn"; store: a
    jaxcnn.store.Store, a path or None (not stored), opened and checked before any work and
    written in one transaction at the end; extra: JSON-ready data kept with the run.
    ValueError when fn has no conv site.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(example_args, (tuple, list)):
        raise TypeError(f"example_args must be a tuple of fn's positional arguments, got {type(example_args).__name__}")
    check_count("iters", iters, 1)
    check_count("warmup", warmup, 0)
    if batch is not None:
        check_count("batch", batch, 1)
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise ValueError(f"backends must be some of {BACKENDS}, got {tuple(backends)!r}")
    name = name or getattr(fn, "__name__", None) or "function"
    with writable_store(store) as target:
        profile = _profile(fn, tuple(example_args), name, batch, tuple(backends), iters, warmup, sparsity,
                           note, extra or {}, progress or (lambda message: None))
        if target is not None:
            (progress or (lambda message: None))("recording")
            record_profile(profile, target, predict=predict)
    return profile


def _profile(fn, example_args, name, batch, backends, iters, warmup, sparsity, note, extra, say) -> ModelProfile:
    say("finding conv sites")
    leaves = jax.tree.leaves(example_args)
    closed = jax.make_jaxpr(fn)(*example_args)
    found = find_matches(closed.jaxpr)
    sites = [(path, where, m) for path, where, m in found.all_matches() if m.op in SITE_OPS]
    if not sites:
        raise ValueError(f"{name}: jaxcnn.optimize finds no conv site in fn (no lax.conv_general_dilated with 2 "
                         "spatial dimensions it can run): nothing to profile per layer")
    say(f"computing the inputs of {len(sites)} conv sites")
    inputs = site_inputs(closed, found, [m for _, _, m in sites], leaves)

    say("jaxcnn.optimize deciding")
    optimized = optimize(fn)
    optimized(*example_args)  # decide (and on a GPU measure) before any timing
    choices = optimize_choices(optimized.rewrites(*example_args), [(path, m) for path, _, m in sites])

    say("timing conv sites")
    timings, shares = {}, [None] * len(sites)
    if "xla" in backends:
        timings["xla"] = time_traced(sites, inputs, iters, warmup, say)
    if "jaxcnn" in backends:
        candidates = [(site_candidate if m.op == "conv2d" else pool_conv_candidate)(where.uses, m, c.candidate)
                      for (_, where, m), c in zip(sites, choices)]
        timings["jaxcnn"], shares = time_candidates(sites, inputs, candidates, timings.get("xla"), iters, warmup, say)

    say("timing end to end")
    forwards = {"xla": fn, "jaxcnn": optimized}
    end_to_end, wall, memory = whole_model_timings({b: forwards[b] for b in backends}, example_args,
                                                   iters=iters, warmup=warmup)

    gpu = lookup_gpu_spec()
    layers = []
    for index, (path, _, m) in enumerate(sites):
        args, out = inputs[id(m)]
        info = site_layer_info(f"conv{index}", m, path)
        zin, zout = (zero_fraction(args[0]), zero_fraction(out)) if sparsity else (None, None)
        layers.append(LayerProfile(
            info, {b: timings[b][index] for b in backends}, zin, zout,
            floor_ms(info.flops, info.bytes, gpu, info.dtype) if gpu else None,
            params=dict(replaced=list(m.replaced), layout=m.site.layout, residual=m.site.residual,
                        folded=m.site.folded, optimize=choices[index].optimize,
                        candidate=choices[index].candidate,
                        fold_share_ms=shares[index]),
        ))
    is_device = all(t.is_device_time for t in end_to_end.values())
    first_n = sites[0][2].site.logical_x_shape()[0]
    dtype = Counter(m.site.dtype for _, _, m in sites).most_common(1)[0][0]
    run_extra = dict(extra, profiled="conv sites of a function", conv_sites=len(sites),
                     optimize=optimized.explain(*example_args))
    return ModelProfile(name, batch or first_n, dtype, backends, is_device, layers, end_to_end, wall, memory,
                        collect_environment(), timing_note(note, is_device), extra=run_extra)


def site_inputs(closed, found, matches, leaves) -> dict[int, tuple[tuple, Any]]:
    """id(match) -> (the match's input values, its output) when fn runs on `leaves`: the jaxpr
    evaluated by jaxcnn.optimize's own evaluator with each match run as traced and recorded."""
    for m in matches:
        m.algorithm = RECORDING_ALGORITHM  # puts the match in the plan (its build is replaced below)
    plan = assemble(found)
    record: dict[int, tuple[tuple, Any]] = {}
    wanted = {id(m) for m in matches}
    for _, where, m in found.all_matches():
        if id(m) in wanted:
            m.build = _recording(subgraph_fn(where.uses, m), m, record)
    evaluate(plan, closed.consts, leaves, weight_prologue=False)
    return record


def _recording(run: Callable, match, record: dict) -> Callable:
    def build(*values):
        out = run(*values)
        record[id(match)] = (values, out)
        return out
    return build


def time_traced(sites, inputs, iters, warmup, say) -> list[DeviceTiming]:
    """Each (path, Found, match) site's equations as traced, on its recorded inputs: one timing
    per site, sites of one _site_key timed once."""
    unique = {}
    for _, where, m in sites:
        unique.setdefault(_site_key(m), (subgraph_fn(where.uses, m), inputs[id(m)][0]))
    timed = device_times([(key, f, args) for key, (f, args) in unique.items()], iters=iters, warmup=warmup,
                         progress=lambda key: say("xla conv site"))
    return [timed[_site_key(m)] for _, _, m in sites]


def time_candidates(sites, inputs, candidates: Sequence[Candidate], traced: list[DeviceTiming] | None,
                    iters, warmup, say) -> tuple[list[DeviceTiming], list[float | None]]:
    """(timing, fold share in ms or None) of each site's candidate on its recorded inputs, timed
    as the decision owner measures it (decision.candidate_runs: its fn on its prepared inputs,
    plus the site's share of work shared across sites). A site whose candidate is the baseline
    (the traced equations) takes its `traced` timing where there is one: the same function on
    the same inputs, so its ratio is 1.0."""
    cases, keys = {}, []
    for (_, _, m), c in zip(sites, candidates):
        key = _site_key(m)
        keys.append(key)
        if (key, c.name) not in cases and not (c.name == BASELINE and traced is not None):
            for case, fn, args, prepare in candidate_runs(key, c, inputs[id(m)][0]):
                if case in cases:  # work shared with a candidate already listed
                    continue
                args, error = prepared(prepare, args) if prepare is not None else (args, "")
                if error:
                    raise RuntimeError(f"{c.name} at a conv site of shape {m.site.x_shape}: {error}")
                cases[case] = (fn, args)
    timed = device_times([(case, fn, args) for case, (fn, args) in cases.items()], iters=iters, warmup=warmup,
                         progress=lambda case: say("jaxcnn conv site")) if cases else {}
    out, shares = [], []
    for index, (key, c) in enumerate(zip(keys, candidates)):
        if (key, c.name) not in timed:
            out.append(traced[index])
            shares.append(None)
        elif (share_cases := shared_cases(key, c)) is not None and share_cases[0] in timed:
            share = shared_share_ms(timed[share_cases[0]].median_ms, timed[share_cases[1]].median_ms)
            out.append(_plus(timed[(key, c.name)], share))
            shares.append(share)
        else:
            out.append(timed[(key, c.name)])
            shares.append(None)
    return out, shares


def _plus(t: DeviceTiming, ms: float) -> DeviceTiming:
    """The timing with `ms` added to every sample (a constant share of shared work)."""
    return dataclasses.replace(t, **stats_fields([v + ms for v in t.samples_ms]))


def _site_key(m) -> tuple:
    """Sites that compute the same thing on the same shapes time the same: timed once."""
    return (repr(m.site), m.replaced, tuple(str(getattr(v, "aval", v)) for v in m.in_vars))


def _nhwc(shape: Sequence[int], layout: str | None) -> tuple[int, ...]:
    return tuple(shape) if layout is None else tuple(shape[layout.index(d)] for d in "NHWC")


def site_layer_info(name: str, m, path: str) -> LayerInfo:
    """A conv site as the zoo's layer row: NHWC input and output, HWIO weight, the conv's
    attributes, 2 x multiply-adds and its compulsory bytes (input, weight, bias, residual, output)."""
    s = m.site
    x = s.logical_x_shape()
    out = _nhwc(m.out_var.aval.shape, s.layout)
    k = s.w_shape[3]
    itemsize = np.dtype(s.dtype).itemsize
    elements = math.prod(x) + math.prod(s.w_shape) + math.prod(out) * (2 if s.residual else 1) + (k if s.bias else 0)
    # a pool_conv site is its 1x1 conv's layer (stride 1, no padding; the pool keeps the image size
    # or shrinks it, and its FLOPs are the conv's on the output's pixels)
    kw = s.kwargs if m.op == "conv2d" else dict(stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1,
                                                activation=None)
    return LayerInfo(name=name, op="conv2d", dtype=s.dtype, input_shapes=(x,), output_shape=out,
                     weight_shape=tuple(s.w_shape), bias_shape=(k,) if s.bias else None, stride=tuple(kw["stride"]),
                     padding=tuple(tuple(p) for p in kw["padding"]), dilation=tuple(kw["dilation"]),
                     groups=kw["groups"], activation=kw["activation"], block=path or None,
                     flops=conv2d_flops(x, s.w_shape, out), bytes=itemsize * elements)


def optimize_choices(rewrites, sites) -> list[SiteChoice]:
    """What jaxcnn.optimize(fn) runs at each (path, match) site, from its Rewrites:
      * inside a fused group's rewrite (same path, its conv among the group's equations):
        'fused into jaxcnn.<op>', candidate "xla" (the group kernel has no per-site time);
      * an average pool read by a 1x1 conv (a pool_conv site) that optimize commuted: 'the
        average pool moved after the 1x1 conv', candidate "commuted";
      * rewritten alone (its Rewrite: same path and shapes, in program order) with algorithm A:
        'jaxcnn.conv2d (algorithm A)', candidate "xla_folded" where A is "xla" and the site has
        something to fold (not match.plain), else "jaxcnn:A";
      * else 'kept as traced (XLA)', candidate "xla"."""
    left = [r for r in rewrites if r.op == "conv2d"]
    groups = [r for r in rewrites if r.op not in SITE_OPS]
    out = []
    for path, m in sites:
        if m.op == POOL_CONV:
            hit = next((r for r in rewrites if r.op == POOL_CONV and r.path == path
                        and r.eqn_indices == tuple(m.eqn_indices)), None)
            out.append(SiteChoice("kept as traced (XLA)", BASELINE) if hit is None else
                       SiteChoice("the average pool moved after the 1x1 conv" + (f": {hit.why}" if hit.why else ""),
                                  COMMUTED))
            continue
        group = next((r for r in groups if r.path == path and m.eqn_indices[0] in r.eqn_indices), None)
        if group is not None:
            out.append(SiteChoice(f"fused into jaxcnn.{group.op}" + (f": {group.why}" if group.why else ""), BASELINE))
            continue
        hit = next((r for r in left if r.path == path and r.x_shape == m.site.x_shape
                    and r.w_shape == m.site.w_shape), None)
        if hit is None:
            out.append(SiteChoice("kept as traced (XLA)", BASELINE))
            continue
        left.remove(hit)
        candidate = FOLDED if hit.algorithm == "xla" and not m.plain else OURS + hit.algorithm
        out.append(SiteChoice(f"jaxcnn.conv2d (algorithm {hit.algorithm})" + (f": {hit.why}" if hit.why else ""),
                              candidate))
    return out


