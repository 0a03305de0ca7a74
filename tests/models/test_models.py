"""Model zoo: shapes, layer tables, FLOP counts against hand counts and XLA, backend agreement.

Only lenet5, squeezenet1_1 and mobilenetv2 run; the big models are checked on shapes alone
(jax.eval_shape, lowering) so the file stays fast on CPU.
"""

import functools
import sqlite3

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcnn import models
from jaxcnn.models.backends import BACKENDS, XLA_OPS
from jaxcnn.models.layers import bind_layer

EXECUTED = ("lenet5", "squeezenet1_1", "mobilenetv2")

CONV_COUNTS = {
    "lenet5": 2, "alexnet": 5, "vgg16": 13, "vgg19": 16, "googlenet": 57,
    "squeezenet1_0": 26, "squeezenet1_1": 26, "resnet50": 53, "mobilenetv2": 52,
}

# GFLOP (2 x multiply-adds) of conv + dense layers at batch 1. torchvision's model docs list
# GMACs (under the name "GFLOPS"): alexnet 0.71, vgg16 15.47, vgg19 19.63, squeezenet1_0
# 0.82, squeezenet1_1 0.35, resnet50 4.09, mobilenet_v2 0.30; the values here are 2x those.
# lenet5 by hand: convs 28*28*6*25 + 10*10*16*150, dense 400*120 + 120*84 + 84*10 MACs.
# googlenet: 1.58 GMACs, not torchvision's 1.50, because torchvision's "5x5" branch is a 3x3
# conv (a bug kept for its weights) and this model uses 5x5 as the paper does: 84 MMACs more.
# Per inception module it matches the paper's table 1 (3a 128M, 3b 304M, ..., 5b 71M).
CONV_DENSE_GFLOPS = {
    "lenet5": 2 * (117_600 + 240_000 + 48_000 + 10_080 + 840) / 1e9,
    "alexnet": 2 * 0.714,
    "vgg16": 2 * 15.47,
    "vgg19": 2 * 19.63,
    "googlenet": 2 * 1.583,
    "squeezenet1_0": 2 * 0.82,
    "squeezenet1_1": 2 * 0.35,
    "resnet50": 2 * 4.09,
    "mobilenetv2": 2 * 0.30,
}
# Convolutions alone, summed by hand: VGG-16's 13 convs are 15.35 GMACs.
CONV_GFLOPS = {"vgg16": 2 * 15.3465, "alexnet": 2 * 0.65557}


def total_flops(layers, ops):
    return sum(layer.flops for layer in layers if layer.op in ops)


def relative_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def abstract_input(model, batch, dtype=jnp.float32, sharding=None):
    return jax.ShapeDtypeStruct(model.input_shape(batch), dtype, sharding=sharding)


def full_float32():
    """Float32 matmuls and convs in full precision (XLA's default may be TF32 on a GPU)."""
    return jax.default_matmul_precision("float32")


@functools.lru_cache(maxsize=None)
def params_and_input(name, dtype=jnp.float32, batch=1):
    model = models.get_model(name)
    x = jax.random.normal(jax.random.PRNGKey(1), model.input_shape(batch), jnp.float32).astype(dtype)
    return model.init(0, dtype), x


# -- registry and errors -----------------------------------------------------------------


def test_registry_lists_every_model():
    assert models.list_models() == list(CONV_COUNTS)
    assert all(models.get_model(name).name == name for name in models.MODELS)


def test_unknown_model_lists_known_names():
    with pytest.raises(ValueError, match="known models: lenet5, alexnet.*mobilenetv2"):
        models.get_model("resnet18")


def test_unknown_backend_is_value_error():
    model = models.get_model("lenet5")
    with pytest.raises(ValueError, match="known backends: xla, jaxcnn"):
        model.apply(model.abstract_params(), jnp.zeros(model.input_shape(1)), backend="cudnn")


def test_bad_inputs_and_params_are_rejected():
    model = models.get_model("lenet5")
    params, x = params_and_input("lenet5")
    with pytest.raises(ValueError, match="1 channels"):
        model.apply(params, jnp.zeros((1, 32, 32, 3)))
    with pytest.raises(TypeError, match="params are float32"):
        model.apply(params, x.astype(jnp.bfloat16))
    with pytest.raises(TypeError, match="dtype must be one of"):
        model.init(0, jnp.int32)


# -- shapes and layer tables (no execution) ----------------------------------------------


@pytest.mark.parametrize("backend", ["xla", "jaxcnn"])
@pytest.mark.parametrize("name", list(CONV_COUNTS))
def test_eval_shape_gives_logits(name, backend):
    model = models.get_model(name)
    apply = functools.partial(model.apply, backend=backend)
    out = jax.eval_shape(apply, model.abstract_params(jnp.bfloat16), abstract_input(model, 2, jnp.bfloat16))
    assert out.shape == (2, model.num_classes) and out.dtype == jnp.bfloat16


@pytest.mark.parametrize("name", list(CONV_COUNTS))
def test_layer_table_conv_count_and_flops(name):
    layers = models.layer_table(name, batch=1)
    assert sum(layer.op == "conv2d" for layer in layers) == CONV_COUNTS[name]
    gflops = total_flops(layers, ("conv2d", "dense")) / 1e9
    assert gflops == pytest.approx(CONV_DENSE_GFLOPS[name], rel=0.01)
    if name in CONV_GFLOPS:
        assert total_flops(layers, ("conv2d",)) / 1e9 == pytest.approx(CONV_GFLOPS[name], rel=0.01)
    # The last layer's output is the logits (before a flatten for global pools).
    assert np.prod(layers[-1].output_shape) == models.get_model(name).num_classes


def test_layer_table_scales_with_batch_and_dtype():
    small = models.layer_table("resnet50", batch=1, dtype=jnp.float32)
    big = models.layer_table("resnet50", batch=4, dtype=jnp.bfloat16)
    for one, four in zip(small, big):
        assert four.flops == 4 * one.flops
        assert four.output_shape == (4, *one.output_shape[1:]) and four.dtype == "bfloat16"
    conv1 = big[0]
    weights = 7 * 7 * 3 * 64 + 64
    assert conv1.bytes == 2 * (4 * 224 * 224 * 3 + weights + 4 * 112 * 112 * 64)


def test_layer_names_blocks_and_attributes():
    resnet = {layer.name: layer for layer in models.layer_table("resnet50")}
    conv = resnet["layer2.0.conv2"]
    assert (conv.block, conv.stride, conv.padding, conv.activation) == ("layer2.0", (2, 2), ((1, 1), (1, 1)), "relu")
    assert conv.input_shape == (1, 56, 56, 128) and conv.output_shape == (1, 28, 28, 128)
    assert resnet["layer2.0.conv3"].activation is None
    assert resnet["layer2.0.add"].activation == "relu" and len(resnet["layer2.0.add"].input_shapes) == 2
    assert resnet["layer1.0.downsample"].weight_shape == (1, 1, 64, 256)

    squeeze = {layer.name: layer for layer in models.layer_table("squeezenet1_1")}
    assert squeeze["fire2/expand3x3"].weight_shape == (3, 3, 16, 64)
    assert squeeze["fire2/concat"].output_shape == (1, 55, 55, 128)
    assert squeeze["maxpool1"].window == (3, 3) and squeeze["maxpool1"].output_shape == (1, 55, 55, 64)

    mobile = {layer.name: layer for layer in models.layer_table("mobilenetv2")}
    depthwise = mobile["features.2.depthwise"]
    assert depthwise.groups == 96 and depthwise.weight_shape == (3, 3, 1, 96)
    assert mobile["features.2.depthwise.relu6"].op == "relu6"

    googlenet = {layer.name: layer for layer in models.layer_table("googlenet")}
    assert googlenet["maxpool1"].output_shape == (1, 56, 56, 64)  # ceil mode (floor gives 55)
    assert googlenet["inception5b/concat"].output_shape == (1, 7, 7, 1024)


def test_layer_rows_go_into_pandas_and_sqlite():
    pandas = pytest.importorskip("pandas")
    rows = models.layer_rows(models.layer_table("squeezenet1_1", 2, jnp.bfloat16), model="squeezenet1_1")
    frame = pandas.DataFrame(rows)
    assert len(frame) == len(rows) and frame.loc[0, "input_shapes"] == "2x224x224x3"
    assert frame.loc[0, "padding"] == "((0, 0), (0, 0))" and frame.loc[0, "model"] == "squeezenet1_1"
    with sqlite3.connect(":memory:") as db:
        frame.to_sql("layers", db)
        convs, flops = db.execute("select count(*), sum(flops) from layers where op = 'conv2d'").fetchone()
    assert convs == 26 and flops == 2 * total_flops(models.layer_table("squeezenet1_1"), ("conv2d",))


# -- FLOPs against XLA's cost analysis ---------------------------------------------------


def _taps_inside(size, window, stride, pads, outputs):
    """Kernel taps that land in the unpadded input along one dimension, over all outputs."""
    return sum(0 <= o * stride - pads[0] + t < size for o in range(outputs) for t in range(window))


def _unpadded_conv_flops(layer):
    n, h, w, _ = layer.input_shape
    r, s, cg, k = layer.weight_shape
    _, p, q, _ = layer.output_shape
    rows = _taps_inside(h, r, layer.stride[0], layer.padding[0], p)
    cols = _taps_inside(w, s, layer.stride[1], layer.padding[1], q)
    return 2 * n * k * cg * rows * cols


def _xla_counted_flops(layer):
    """What XLA's cost analysis counts for the layer: convs over the unpadded taps only, and
    one flop per element for each bias add, activation and residual add."""
    elements = int(np.prod(layer.output_shape))
    if layer.op in ("conv2d", "dense"):
        products = _unpadded_conv_flops(layer) if layer.op == "conv2d" else layer.flops
        return products + elements * (1 + (layer.activation is not None))
    if layer.op == "add":
        return elements * (1 + (layer.activation is not None))
    return layer.flops  # pools: window size per output; relu6: 1 per element; concat: 0


@pytest.mark.parametrize("name", ["squeezenet1_1", "resnet50", "vgg16"])
def test_flops_match_xla_cost_analysis(name):
    """XLA counts 2 flops per multiply-add of a conv, but only for kernel taps that land inside
    the unpadded input; 2 per multiply-add of a dot; 1 per element of elementwise ops; the
    window size per output of a pool. The table's conv + dense FLOPs (padding taps included,
    the usual convention) therefore exceed XLA's total by 1-4%; counted XLA's way the layers
    agree with it to <1%."""
    model = models.get_model(name)
    layers = model.layers(1)
    # XLA:CPU's count, on every machine: on a GPU convolutions become cuDNN calls.
    on_cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on_cpu), model.abstract_params())
    compiled = jax.jit(model.apply).lower(params, abstract_input(model, 1, sharding=on_cpu)).compile()
    xla_flops = compiled.cost_analysis()["flops"]
    assert 1.0 < total_flops(layers, ("conv2d", "dense")) / xla_flops < 1.05
    assert sum(_xla_counted_flops(layer) for layer in layers) == pytest.approx(xla_flops, rel=0.01)


# -- execution -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", EXECUTED)
def test_backends_agree_in_float32(name):
    params, x = params_and_input(name)
    model = models.get_model(name)
    with full_float32():
        xla = jax.jit(functools.partial(model.apply, backend="xla"))(params, x)
        ours = jax.jit(functools.partial(model.apply, backend="jaxcnn"))(params, x)
    assert xla.shape == (1, model.num_classes)
    assert np.all(np.isfinite(xla)) and float(jnp.std(xla)) > 0.1  # He init keeps the logits O(1)
    assert relative_error(ours, xla) < 1e-4


def test_jaxcnn_backend_runs_the_jaxcnn_conv():
    model = models.get_model("squeezenet1_1")
    args = (model.abstract_params(), abstract_input(model, 1))
    ours = str(jax.make_jaxpr(functools.partial(model.apply, backend="jaxcnn"))(*args))
    xla = str(jax.make_jaxpr(functools.partial(model.apply, backend="xla"))(*args))
    assert ours.count("jaxcnn_conv2d") >= 26 and "conv_general_dilated" not in ours
    assert "jaxcnn_conv2d" not in xla and xla.count("conv_general_dilated") == 26


def test_init_is_deterministic():
    model = models.get_model("squeezenet1_1")
    first, again = model.init(jax.random.PRNGKey(3)), model.init(3)
    other = model.init(4)
    assert jax.tree.structure(first) == jax.tree.structure(model.abstract_params())
    for a, b, c in zip(jax.tree.leaves(first), jax.tree.leaves(again), jax.tree.leaves(other)):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)


def test_init_is_he_scaled():
    params = models.get_model("mobilenetv2").init(0)
    w = params["features.18"]["w"]  # 1x1 conv from 320 channels
    assert float(jnp.std(w)) == pytest.approx(np.sqrt(2 / 320), rel=0.05)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("backend", ["xla", "jaxcnn"])
def test_low_precision_runs_in_its_dtype(backend, dtype):
    model = models.get_model("lenet5")
    params, x = params_and_input("lenet5", dtype, 2)
    reference_params, reference_x = params_and_input("lenet5", jnp.float32, 2)
    logits = jax.jit(functools.partial(model.apply, backend=backend))(params, x)
    assert logits.dtype == dtype and logits.shape == (2, 10)
    assert relative_error(logits, model.apply(reference_params, reference_x)) < 0.05


def test_softmax_head():
    model = models.get_model("lenet5")
    params, x = params_and_input("lenet5")
    probabilities = model.apply(params, x, backend="jaxcnn", softmax=True)
    np.testing.assert_allclose(jnp.sum(probabilities, axis=-1), 1.0, rtol=1e-5)
    assert model.layers(1, softmax=True)[-1].op == "softmax"


@pytest.mark.slow
def test_layer_fns_run_each_layer_alone():
    model = models.get_model("squeezenet1_1")
    params, _ = params_and_input("squeezenet1_1")
    conv_calls = model.layer_fns(params, 1, jnp.float32, "jaxcnn", ops=("conv2d",))
    assert [call.info.name for call in conv_calls] == [l.name for l in model.layers(1) if l.op == "conv2d"]
    for info, fn, args in model.layer_fns(params, 1, jnp.float32, "jaxcnn"):
        out = jax.jit(fn)(*args)
        assert out.shape == info.output_shape and out.dtype == jnp.float32


def test_a_fused_block_kernel_slots_in_by_name(monkeypatch):
    """A table entry named after a block kind replaces the block's layers with one call."""
    calls = []

    def fire_kernel(layers, params, x):
        calls.append([layer.name for layer in layers])
        squeeze, expand1x1, expand3x3, concat = (bind_layer(layer, XLA_OPS) for layer in layers)
        weights = [(params[layer.name]["w"], params[layer.name]["b"]) for layer in layers[:3]]
        squeezed = squeeze(x, *weights[0])
        return concat(expand1x1(squeezed, *weights[1]), expand3x3(squeezed, *weights[2]))

    monkeypatch.setitem(BACKENDS, "fused", {**XLA_OPS, "fire": fire_kernel})
    model = models.get_model("squeezenet1_1")
    params, x = params_and_input("squeezenet1_1")
    with full_float32():
        fused, unfused = model.apply(params, x, backend="fused"), model.apply(params, x)
    assert len(calls) == 8
    assert calls[0] == ["fire2/squeeze1x1", "fire2/expand1x1", "fire2/expand3x3", "fire2/concat"]
    assert relative_error(fused, unfused) < 1e-5


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 5e-2)])
def test_mobilenetv2_inverted_residual_block_entry_matches_the_layers(monkeypatch, dtype, tol):
    """ops["inverted_residual"]: the 16 blocks with an expand run expand -> depthwise as one
    jaxcnn.conv1x1_depthwise (ReLU6 both), features.1 (no expand) layer by layer; the logits
    are XLA's (bf16: the fused op rounds once after each conv, XLA after the conv and the bias)."""
    from jaxcnn.models.mobilenet import inverted_residual_block

    monkeypatch.setitem(BACKENDS, "fused", {**XLA_OPS, "inverted_residual": inverted_residual_block})
    model = models.get_model("mobilenetv2")
    params = model.init(0, dtype)
    x = jax.random.normal(jax.random.PRNGKey(1), (1, 64, 64, 3)).astype(dtype)
    fused = jax.jit(functools.partial(model.apply, backend="fused"))(params, x)
    unfused = jax.jit(model.apply)(params, x)
    assert relative_error(fused, unfused) < tol
    jaxpr = str(jax.make_jaxpr(functools.partial(model.apply, backend="fused"))(params, x))
    assert jaxpr.count("jaxcnn_conv1x1_depthwise[") == 16
