"""jaxcnn.optimize end to end on the GPU: Flax linen / nnx and Equinox models run with the
CUDA kernels in place of every conv, pool and softmax (compiled HLO checked), and give the
unmodified model's results. fp32 tolerances allow TF32 (the tensor-core convs and XLA's
DEFAULT precision both use it). Run: pytest -m gpu tests/optimize/test_optimize_gpu.py"""

import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn
from jaxcnn.optimize.policy import unpooled_plan

pytestmark = pytest.mark.gpu
pytest.importorskip("flax")
pytest.importorskip("equinox")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import thirdparty_models as tm  # noqa: E402

# max |optimized - original| / max |original|: TF32 on both sides in fp32, one bf16 rounding
# per layer output in bf16 (over 26 layers).
REL_TOL = {jnp.float32: 2e-2, jnp.bfloat16: 6e-2}
MODELS = ["linen_squeezenet1_1", "linen_vgg19", "linen_resnet_small", "linen_googlenet_head", "nnx_squeezenet1_1",
          "nnx_cnn", "equinox_squeezenet1_1", "equinox_cnn"]


def build(name, batch, dtype):
    kw = dict(num_classes=100, hidden=256) if name.endswith("vgg19") else {}
    return tm.build(name, batch=batch, dtype=dtype, **({"hw": 112} if tm.MODELS[name][2] == 224 else {}), **kw)


def rel_diff(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", MODELS)
def test_model_runs_the_kernels_and_matches(name, dtype):
    m = build(name, 8, dtype)
    opt = jaxcnn.optimize(m.apply, policy="all", fuse="none")
    rewrites = opt.rewrites(m.params, m.x)
    fast = jax.jit(opt)
    hlo = fast.lower(m.params, m.x).compile().as_text()
    targets = set(re.findall(r"jaxcnn_\w+_fwd", hlo))
    kernel_of = {"conv2d": "jaxcnn_conv2d_fwd", "max_pool2d": "jaxcnn_max_pool2d_fwd",
                 "avg_pool2d": "jaxcnn_avg_pool2d_fwd", "softmax": "jaxcnn_softmax_fwd", "log_softmax": "jaxcnn_softmax_fwd"}
    assert {kernel_of[r.op] for r in rewrites} <= targets, targets
    assert " convolution(" not in hlo and "__cudnn$conv" not in hlo, "every conv must run on jaxcnn's kernels"
    got, want = fast(m.params, m.x), jax.jit(m.apply)(m.params, m.x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert rel_diff(got, want) <= REL_TOL[dtype], rel_diff(got, want)


@pytest.mark.parametrize("name", ["linen_squeezenet1_1", "equinox_squeezenet1_1"])
def test_fused_squeezenet_runs_one_kernel_per_fire(name):
    """fuse="all": every fire module is one jaxcnn_fire call and the stem conv + its pool one
    conv2d_pool, in NHWC (linen) and in NCHW (Equinox, the kernels between transposes that
    XLA cancels between consecutive groups)."""
    m = build(name, 8, jnp.bfloat16)
    fast = jax.jit(jaxcnn.optimize(m.apply, fuse="all"))
    hlo = fast.lower(m.params, m.x).compile().as_text()
    assert len(re.findall(r'custom_call_target="jaxcnn_fire_fwd"', hlo)) == 8
    assert len(re.findall(r'custom_call_target="jaxcnn_conv2d_pool_fwd"', hlo)) == 1
    # Equinox's OIHW weights: one batched relayout to HWIO; linen's are HWIO already.
    relayouts = len(re.findall(r'custom_call_target="jaxcnn_weight_relayout"', hlo))
    assert relayouts == (1 if name.startswith("equinox") else 0)
    assert rel_diff(fast(m.params, m.x), jax.jit(m.apply)(m.params, m.x)) <= REL_TOL[jnp.bfloat16]


def test_fused_googlenet_runs_one_inception_call_per_block():
    m = build("linen_googlenet_head", 8, jnp.bfloat16)
    fast = jax.jit(jaxcnn.optimize(m.apply, fuse="all"))
    hlo = fast.lower(m.params, m.x).compile().as_text()
    # Each jaxcnn.inception lowers to jaxcnn's kernels: one split 1x1 conv, the 3x3 and 5x5
    # branch convs, the pool and its projection (the stem's 1x1 conv is the auto policy's XLA).
    assert len(re.findall(r'custom_call_target="jaxcnn_conv2d_fwd', hlo)) == 3 * 4
    assert len(re.findall(r'custom_call_target="jaxcnn_max_pool2d_fwd"', hlo)) == 3
    assert len(re.findall(r'custom_call_target="jaxcnn_conv2d_pool_fwd"', hlo)) == 2
    assert rel_diff(fast(m.params, m.x), jax.jit(m.apply)(m.params, m.x)) <= REL_TOL[jnp.bfloat16]


@pytest.mark.parametrize("algorithm", ["auto", "wgmma", "stem"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
def test_zero_pad_taken_into_the_conv_padding(dtype, algorithm):
    """A zero pad before a "valid" conv (Keras' ZeroPadding2D) becomes the kernel's own padding,
    uneven sides included: the stride-2 depthwise 5x5 of EfficientNet, a 3x3/2 conv and the
    ResNet stem's 7x7/2 on an RGB image, each on the kernels' pick and on the named family
    where it takes the shape, and a zero pad of a ReLU's output before a max pool the pool's;
    the compiled program keeps no pad of its own."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.uniform(0.5, 1.0, (4, 37, 37, 3)), dtype)
    w0 = jnp.asarray(rng.normal(size=(7, 7, 3, 32)) / 8, dtype)
    wd = jnp.asarray(rng.normal(size=(5, 5, 1, 32)) / 5, dtype)
    w1 = jnp.asarray(rng.normal(size=(3, 3, 32, 64)) / 16, dtype)
    dn = ("NHWC", "HWIO", "NHWC")

    def fn(x, w0, wd, w1):
        y = jnp.pad(x, ((0, 0), (3, 3), (3, 3), (0, 0)))
        y = jax.nn.relu(jax.lax.conv_general_dilated(y, w0, (2, 2), "VALID", dimension_numbers=dn))
        y = jnp.pad(y, ((0, 0), (1, 2), (1, 2), (0, 0)))
        y = jax.nn.silu(jax.lax.conv_general_dilated(y, wd, (2, 2), "VALID", dimension_numbers=dn,
                                                     feature_group_count=32))
        y = jnp.pad(y, ((0, 0), (0, 1), (0, 1), (0, 0)))
        y = jax.nn.relu(jax.lax.conv_general_dilated(y, w1, (2, 2), "VALID", dimension_numbers=dn))
        y = jnp.pad(y, ((0, 0), (1, 1), (1, 1), (0, 0)))  # a ReLU's output: the pool takes it in
        return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID")

    def policy(site):
        return algorithm if site.op == "conv2d" and unpooled_plan(site, algorithm) else "auto"

    opt = jaxcnn.optimize(fn, policy="all" if algorithm == "auto" else policy, fuse="none")
    args = (x, w0, wd, w1)
    assert all(r.replaced[0] == "pad" for r in opt.rewrites(*args) if r.op in ("conv2d", "max_pool2d"))
    fast = jax.jit(opt)
    hlo = fast.lower(*args).compile().as_text()
    if algorithm == "auto":
        assert " pad(" not in hlo, "the pads must be the kernels' padding"
    assert rel_diff(fast(*args), jax.jit(fn)(*args)) <= REL_TOL[dtype]


@pytest.mark.parametrize("name", ["linen_squeezenet1_1", "equinox_cnn"])
def test_grad_on_gpu(name):
    m = build(name, 4, jnp.float32)

    def loss(apply):
        return lambda params, x: jnp.sum(jnp.log(apply(params, x) + 1e-3) if name.endswith("squeezenet1_1")
                                          else apply(params, x))

    got = jax.jit(jax.grad(loss(jaxcnn.optimize(m.apply, policy="all"))))(m.params, m.x)
    want = jax.jit(jax.grad(loss(m.apply)))(m.params, m.x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert rel_diff(g, w) <= 5e-2


def test_data_parallel_on_all_gpus():
    n = jax.device_count()
    if n < 2:
        pytest.skip(f"{n} GPU visible: data parallelism needs 2 or more")
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((n,), ("data",))
    for name in ("linen_squeezenet1_1", "linen_vgg19"):
        m = build(name, 4 * n, jnp.bfloat16)
        fast = jax.jit(jaxcnn.optimize(m.apply, policy="all"))  # every conv rewritten, sharded
        params = jax.device_put(m.params, NamedSharding(mesh, P()))
        x = jax.device_put(m.x, NamedSharding(mesh, P("data")))
        hlo = fast.lower(params, x).compile().as_text()
        assert "all-gather" not in hlo and "all-to-all" not in hlo
        y = fast(params, x)
        assert y.sharding.spec[0] == "data"
        assert rel_diff(y, jax.jit(m.apply)(m.params, m.x)) <= REL_TOL[jnp.bfloat16]
