"""fold_weights (many weights scaled per channel, cast and permuted in one op) and optimize's
weight prologue, which folds every rewritten conv's BatchNorm through it: the reference
against jnp, the CUDA lowering's one custom call, bad arguments, gradients; the prologue's
outputs, its one fold per program, the weight layout XLA's convs get, and the sites it leaves."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcnn
from jaxcnn.tuning import decision as D
from cuda_lowering import cuda_text, custom_calls

PERMS = list(itertools.permutations(range(4)))
OHWI_FROM_HWIO = (3, 0, 1, 2)


def want_fold(w, s, axis, perm, dtype):
    v = np.asarray(w, np.float64)
    if s is not None:
        shape = [1, 1, 1, 1]
        shape[axis] = w.shape[axis]
        v = v * np.asarray(s, np.float64).reshape(shape)
    return np.transpose(np.asarray(jnp.asarray(v.astype(np.float32)).astype(dtype), np.float64), perm)


@pytest.mark.parametrize("src,dst", [("float32", "bfloat16"), ("bfloat16", "bfloat16"), ("float16", "float32")])
def test_reference_folds_casts_and_permutes(src, dst):
    rng = np.random.default_rng(0)
    shapes = [(3, 5, 7, 33), (1, 1, 40, 31), (2, 3, 1, 9)]
    ws, ss, axes, perms = [], [], [], []
    for i, shape in enumerate(shapes * 2):
        ws.append(jnp.asarray(rng.standard_normal(shape), src))
        axis = i % 4
        ss.append(None if i == 2 else jnp.asarray(rng.uniform(0.5, 2.0, shape[axis]), jnp.float32))
        axes.append(axis)
        perms.append(PERMS[(5 * i) % 24])
    vectors = [jnp.asarray(rng.standard_normal(n), jnp.float32) for n in (7, 1, 40)]
    outs = jaxcnn.fold_weights(ws, ss, axes, perms, [dst] * len(ws), vectors=vectors, vector_dtypes=[dst] * 3)
    for got, v in zip(outs[len(ws):], vectors):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(v.astype(dst)))
    for got, w, s, axis, perm in zip(outs, ws, ss, axes, perms):
        assert got.dtype == jnp.dtype(dst)
        # fp32 product then one rounding: equal to the float64 product rounded once, up to
        # the fp32 product's own rounding (well below a 16-bit ulp; exact for fp32 results).
        np.testing.assert_allclose(np.asarray(got, np.float64), want_fold(w, s, axis, perm, dst),
                                   rtol=2 ** -22 if dst == "float32" else 2 ** -8)


def test_cuda_lowering_is_one_custom_call_with_its_attributes():
    w = jnp.ones((3, 3, 8, 16), jnp.bfloat16)
    s = jnp.ones((16,), jnp.float32)
    b = jnp.ones((1, 1, 1, 16), jnp.float32)
    text = cuda_text(lambda w, s, b: jaxcnn.fold_weights([w, b], [s, None], [3, -1], [OHWI_FROM_HWIO, (0, 1, 2, 3)],
                                                         ["bfloat16", "bfloat16"], vectors=[s, s[:5]],
                                                         vector_dtypes=["bfloat16", "float32"]), w, s, b)
    (call,) = custom_calls(text, "jaxcnn_weight_fold")
    assert "perms = dense<[3, 0, 1, 2, 0, 1, 2, 3]>" in call and "scale_axes = dense<[3, -1]>" in call
    # every vector packed into one operand: factors at 0, the two vectors after them
    assert "scale_offsets = dense<[0, -1]>" in call and "vector_offsets = dense<[16, 32]>" in call
    assert "tensor<37xf32>" in call


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(scales=[None, None]), ValueError, "scales must hold one entry per weight"),
    (dict(perms=[(0, 1, 2, 2)]), ValueError, r"perms\[0\] must be a permutation"),
    (dict(dtypes=["int8"]), TypeError, r"dtypes\[0\] must be one of"),
    (dict(scales=[jnp.ones((3,))]), ValueError, r"scales\[0\] must have shape \(16,\)"),
    (dict(weights=[jnp.ones((3, 16))]), ValueError, r"weights\[0\] must be rank 4"),
    (dict(weights=[jnp.ones((1, 1, 1, 16), jnp.int32)]), TypeError, r"weights\[0\] dtype must be one of"),
    (dict(vectors=[jnp.ones((2, 2))], vector_dtypes=["float32"]), ValueError, r"vectors\[0\] must be rank 1"),
    (dict(vectors=[jnp.ones((2,))], vector_dtypes=[]), ValueError, "vector_dtypes must hold one entry"),
])
def test_bad_arguments_name_themselves(kwargs, error, match):
    args = dict(weights=[jnp.ones((1, 1, 2, 16))], scales=[jnp.ones((16,))], scale_axes=[3],
                perms=[(0, 1, 2, 3)], dtypes=["float32"])
    args.update(kwargs)
    with pytest.raises(error, match=match):
        jaxcnn.fold_weights(**args)


def test_gradients_and_vmap_follow_the_reference():
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((3, 3, 4, 5)), jnp.float32)
    s = jnp.asarray(rng.uniform(0.5, 2.0, 5), jnp.float32)

    def loss(fold):
        return lambda w, s: jnp.sum(jnp.sin(fold(w, s)))

    ours = loss(lambda w, s: jaxcnn.fold_weights([w], [s], [3], [OHWI_FROM_HWIO], ["float32"])[0])
    ref = loss(lambda w, s: jnp.transpose(w * s, OHWI_FROM_HWIO))
    for a, b in zip(jax.grad(ours, (0, 1))(w, s), jax.grad(ref, (0, 1))(w, s)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    batched = jax.vmap(lambda w: jaxcnn.fold_weights([w], [s], [3], [OHWI_FROM_HWIO], ["float32"])[0])(jnp.stack([w, 2 * w]))
    np.testing.assert_allclose(batched[1], jnp.transpose(2 * w * s, OHWI_FROM_HWIO), rtol=1e-6)


# ---------------------------------------------------------------- optimize's weight prologue

def bn_model(dtype, train_stats=False):
    """Two conv -> inference BatchNorm -> ReLU blocks (Keras' form) and a residual add, NHWC;
    train_stats=True takes the second BatchNorm's statistics from the batch (not foldable)."""
    def block(x, p, stats_from_x=False):
        y = lax.conv_general_dilated(x, p["w"].astype(dtype), (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        mean, var = (jnp.mean(y, (0, 1, 2)), jnp.var(y, (0, 1, 2))) if stats_from_x else (p["mean"], p["var"])
        scale = (p["gamma"] * lax.rsqrt(var.astype(jnp.float32) + 1e-3)).astype(dtype)
        return jax.nn.relu((y - mean.astype(dtype)) * scale + p["beta"].astype(dtype))

    def fn(params, x):
        h = block(x, params[0])
        return block(h, params[1], train_stats) + h
    return fn


def bn_params(c, seed=0):
    rng = np.random.default_rng(seed)
    return [dict(w=jnp.asarray(rng.standard_normal((3, 3, c, c)) * 0.2, jnp.float32),
                 mean=jnp.asarray(rng.standard_normal(c), jnp.float32),
                 var=jnp.asarray(rng.uniform(0.5, 2.0, c), jnp.float32),
                 gamma=jnp.asarray(rng.uniform(0.5, 1.5, c), jnp.float32),
                 beta=jnp.asarray(rng.standard_normal(c), jnp.float32)) for _ in range(2)]


def fake_decisions(choice):
    def decide_all(sites, **kw):
        return [D.Decision(choice if s.key_fields.get("folded") else "xla", "measured", "fake") for s in sites]
    return decide_all


@pytest.mark.parametrize("choice", ["xla_folded", "jaxcnn:auto"])
def test_prologue_folds_every_rewritten_conv_in_one_op(monkeypatch, choice):
    from jaxcnn.optimize import rewrite
    monkeypatch.setattr(rewrite, "decide_all", fake_decisions(choice))
    fn, params = bn_model(jnp.bfloat16), bn_params(16)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 9, 7, 16)), jnp.bfloat16)
    opt = jaxcnn.optimize(fn, fuse="none")
    got, want = jax.jit(opt)(params, x), jax.jit(fn)(params, x)
    # bf16: folding rounds the weights once and skips the unfolded program's roundings
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=0.05, atol=0.1)
    text = cuda_text(opt, params, x)
    (call,) = custom_calls(text, "jaxcnn_weight_fold")
    assert "scale_axes = dense<3> : tensor<2xi64>" in call and "vector_offsets = dense<[32, 48]>" in call
    if choice == "xla_folded":
        # XLA's convs read the weights as OHWI (cuDNN's KRSC): nothing left to transpose
        assert text.count("[b, 0, 1, f]x[o, 0, 1, i]->[b, 0, 1, f]") == 2
        assert "transpose" not in text
    assert "weight prologue: 2 conv(s)" in opt.explain(params, x)


def test_prologue_leaves_batch_statistics_and_differentiates(monkeypatch):
    from jaxcnn.optimize import rewrite
    monkeypatch.setattr(rewrite, "decide_all", fake_decisions("xla_folded"))
    fn, params = bn_model(jnp.float32, train_stats=True), bn_params(8, seed=3)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 6, 6, 8)), jnp.float32)
    opt = jaxcnn.optimize(fn, fuse="none")
    (call,) = custom_calls(cuda_text(opt, params, x), "jaxcnn_weight_fold")
    assert "scale_axes = dense<3> : tensor<1xi64>" in call  # the first conv only
    np.testing.assert_allclose(jax.jit(opt)(params, x), fn(params, x), rtol=1e-4, atol=1e-4)
    g_opt = jax.grad(lambda p: jnp.sum(opt(p, x) ** 2))(params)
    g_ref = jax.grad(lambda p: jnp.sum(fn(p, x) ** 2))(params)
    for a, b in zip(jax.tree.leaves(g_opt), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)


def test_prologue_with_ohwi_weights_differentiates(monkeypatch):
    """XLA's 16-bit convs read the prologue's OHWI weights: gradients flow back through the
    fold and the layout to the user's HWIO weights and BatchNorm parameters."""
    from jaxcnn.optimize import rewrite
    monkeypatch.setattr(rewrite, "decide_all", fake_decisions("xla_folded"))
    fn, params = bn_model(jnp.float16), bn_params(8, seed=5)
    x = jnp.asarray(np.random.default_rng(6).standard_normal((2, 6, 6, 8)), jnp.float16)
    opt = jaxcnn.optimize(fn, fuse="none")
    assert "x[o, 0, 1, i]" in cuda_text(opt, params, x)
    loss = lambda f: lambda p: jnp.sum(f(p, x).astype(jnp.float32) ** 2)  # noqa: E731
    got, want = jax.grad(loss(opt))(params), jax.grad(loss(fn))(params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert bool(jnp.all(jnp.isfinite(a)))
        # fp16 programs that round differently: the gradients agree to a few fp16 ulps of their scale
        np.testing.assert_allclose(a, b, rtol=0.05, atol=0.05 * float(jnp.max(jnp.abs(b))))


def test_folding_sites_are_measured_on_prologue_weights(monkeypatch):
    """A BatchNorm conv site's replacements run on weights folded beforehand (prepare) and say
    what the prologue's fold costs them (shared): together they compute the traced subgraph."""
    from jaxcnn.optimize import rewrite
    seen = []

    def decide_all(sites, **kw):
        seen.extend(sites)
        return fake_decisions("xla_folded")(sites, **kw)

    monkeypatch.setattr(rewrite, "decide_all", decide_all)
    fn, params = bn_model(jnp.float32), bn_params(8, seed=7)
    x = jnp.asarray(np.random.default_rng(8).standard_normal((2, 6, 6, 8)), jnp.float32)
    jaxcnn.optimize(fn, fuse="none").explain(params, x)
    folded = [s for s in seen if s.key_fields.get("folded")]
    assert len(folded) == 2 and all(s.key_fields["weights"] == "prologue" for s in folded)
    for s in folded:
        rng = np.random.default_rng(9)
        vals = [jnp.asarray(rng.uniform(0.5, 1.5, a.shape), a.dtype) for a in s.input_avals]
        base, *replacements = s.candidates
        want = np.asarray(base.fn(*vals))
        for c in replacements:
            assert c.prepare is not None and c.shared is not None and c.shared_floor is not None
            np.testing.assert_allclose(np.asarray(c.fn(*c.prepare(*vals))), want, rtol=1e-4, atol=1e-4)
            w, b = c.shared(*vals)
            assert b.shape == (8,) and sorted(w.shape) == sorted(vals[1].shape)
            w1, b1 = c.shared_floor(*vals)  # the same fold of one weight per output channel
            assert w1.size == 8 and np.array_equal(np.asarray(b1), np.asarray(b))


@pytest.mark.parametrize("choice", ["xla_folded", "jaxcnn:auto"])
def test_closed_over_weights_fold_once_when_traced(monkeypatch, choice):
    """Weights the function closes over are constants of its jaxpr: their fold runs when the
    program is traced, so the compiled program holds folded weights and runs no fold, and the
    sites are measured with no share of one."""
    from jaxcnn.optimize import rewrite
    seen = []

    def decide_all(sites, **kw):
        seen.extend(sites)
        return fake_decisions(choice)(sites, **kw)

    monkeypatch.setattr(rewrite, "decide_all", decide_all)
    fn, params = bn_model(jnp.float32), bn_params(8, seed=10)
    x = jnp.asarray(np.random.default_rng(11).standard_normal((2, 6, 6, 8)), jnp.float32)
    closed = lambda x: fn(params, x)  # noqa: E731
    opt = jaxcnn.optimize(closed, fuse="none")
    np.testing.assert_allclose(jax.jit(opt)(x), fn(params, x), rtol=1e-4, atol=1e-4)
    assert not custom_calls(cuda_text(opt, x), "jaxcnn_weight_fold")
    assert "weight_fold" not in str(jax.make_jaxpr(opt)(x))
    explained = opt.explain(x)
    assert "weight prologue: 2 conv(s)" in explained and "2 of them fold once, when the program is traced" in explained
    folded = [s for s in seen if s.key_fields.get("folded")]
    assert len(folded) == 2 and all(s.key_fields["weights"] == "constant" for s in folded)
    for s in folded:
        assert all(c.prepare is not None and c.shared is None for c in s.candidates[1:])
    # the same model with its weights as arguments folds on every call
    assert custom_calls(cuda_text(jaxcnn.optimize(fn, fuse="none"), params, x), "jaxcnn_weight_fold")


def test_weights_mixing_constants_and_inputs_fold_every_call(monkeypatch):
    """A BatchNorm whose gamma is an argument while the weight is a constant folds in the
    program, and still matches the traced function."""
    from jaxcnn.optimize import rewrite
    monkeypatch.setattr(rewrite, "decide_all", fake_decisions("xla_folded"))
    fn, params = bn_model(jnp.float32), bn_params(8, seed=12)
    x = jnp.asarray(np.random.default_rng(13).standard_normal((2, 6, 6, 8)), jnp.float32)

    def half_closed(gammas, x):
        p = [dict(layer, gamma=g) for layer, g in zip(params, gammas)]
        return fn(p, x)

    gammas = [layer["gamma"] for layer in params]
    opt = jaxcnn.optimize(half_closed, fuse="none")
    np.testing.assert_allclose(jax.jit(opt)(gammas, x), fn(params, x), rtol=1e-4, atol=1e-4)
    assert custom_calls(cuda_text(opt, gammas, x), "jaxcnn_weight_fold")
    assert "fold once, when the program is traced" not in opt.explain(gammas, x)


def test_shared_work_is_measured_once_and_charged_per_site(monkeypatch):
    """_measure_sites times fn on the prepared inputs and adds the site's shared work less its
    floor; a shared case without a timing fails the candidate."""
    times = {"base": 1.0, "ours": 0.5, "alone": 0.3, "floor": 0.2}
    timed = []

    class T:
        def __init__(self, ms):
            self.median_ms, self.is_device_time, self.note = ms, True, ""

    def device_times(cases, **kw):
        timed.extend(key for key, _, _ in cases)
        # site b's shared case has no timing (as a case whose kernels the trace lacks)
        return {key: T(times[f.__name__]) for key, f, _ in cases if key != ("b", "jaxcnn:auto", "shared")}

    def base(x):
        return x + 1

    def ours(x):
        return x * 2  # takes the prepared input

    def alone(x):
        return x

    def floor(x):
        return x[:1]

    monkeypatch.setattr(D, "device_times", device_times)
    sites = {}
    for name in ("a", "b"):
        cands = [D.Candidate("xla", base), D.Candidate("jaxcnn:auto", ours, prepare=lambda x: (x / 2,),
                                                       shared=alone, shared_floor=floor)]
        sites[name] = D.Site(dict(kind="test", name=name), cands, [jax.ShapeDtypeStruct((4,), jnp.float32)],
                             lambda: ("xla", "rule"))
    records = D._measure_sites(sites)
    assert sorted(k for k in timed if k[-1] == "floor") == [("a", "jaxcnn:auto", "floor"), ("b", "jaxcnn:auto", "floor")]
    assert records["a"]["times_ms"] == {"xla": 1.0, "jaxcnn:auto": pytest.approx(0.6)}
    assert records["a"]["shared_ms"] == {"jaxcnn:auto": pytest.approx(0.1)}
    assert records["b"]["times_ms"]["jaxcnn:auto"] is None and "jaxcnn:auto" in records["b"]["errors"]


@pytest.mark.parametrize("groups, dtype, want", [
    (1, jnp.bfloat16, "OHWI"),   # cuDNN's KRSC: XLA transposes nothing
    (8, jnp.bfloat16, "HWIO"),   # depthwise / grouped: the traced layout (XLA autotunes it fast)
    (1, jnp.float32, "HWIO"),    # fp32: XLA picks its own layout
])
def test_xla_folded_weight_layout(groups, dtype, want):
    from jaxcnn.optimize.weight_prologue import FoldSite
    fold = FoldSite(None, None, (0, 1, 2, 3), (3, 3, 1, 8), dtype, dtype, dict(layout="NHWC", groups=groups))
    assert fold.target("xla")[0] == want and fold.target("auto")[0] == "HWIO"
