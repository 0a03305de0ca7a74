"""Profiler end to end on the CPU (reference path) into a temp store, and the CLI."""


import jax
import jax.numpy as jnp
import pytest

from jaxcnn import cli
from jaxcnn.models import get_model
from jaxcnn.planner import Buffer, jaxpr_buffers, live_bytes_lower_bound
from jaxcnn.profile.profiler import activation_sparsity, profile_model, summarize
from jaxcnn.store import Store


@pytest.fixture(scope="module")
def lenet_profile(tmp_path_factory):
    db = tmp_path_factory.mktemp("store") / "profiles.sqlite"
    profile = profile_model("lenet5", batch=2, dtype="float32", iters=3, warmup=1, store=str(db))
    return profile, db


def test_profile_covers_every_layer_and_backend(lenet_profile):
    profile, _ = lenet_profile
    spec = get_model("lenet5")
    assert [l.info.name for l in profile.layers] == [i.name for i in spec.layers(2, jnp.float32)]
    for layer in profile.layers:
        assert set(layer.times) == {"xla", "jaxcnn"}
        assert all(t.median_ms > 0 and t.p10_ms <= t.median_ms <= t.p90_ms for t in layer.times.values())
    assert set(profile.end_to_end) == set(profile.wall) == {"xla", "jaxcnn"}
    on_gpu = jax.default_backend() == "gpu"
    assert profile.is_device_time == on_gpu
    assert on_gpu or "CPU reference path" in profile.note
    assert profile.memory["xla"]["argument_size_in_bytes"] > 0
    assert any("lenet5 batch=2" in line for line in summarize(profile))


def test_profile_is_recorded_in_store(lenet_profile):
    profile, db = lenet_profile
    with Store(db) as store:
        runs = store.runs()
        device = "gpu" if profile.is_device_time else "cpu"
        assert len(runs) == 1 and runs.iloc[0]["model"] == "lenet5" and runs.iloc[0]["device"] == device
        run_id = int(runs.iloc[0]["id"])
        layers = store.layers(run_id)
        assert list(layers["name"]) == [l.info.name for l in profile.layers]
        conv1 = layers[layers["name"] == "conv1"].iloc[0]
        assert conv1["flops"] == profile.layers[0].info.flops
        metric = "device_time_ms" if profile.is_device_time else "wall_time_ms"
        timings = store.measurements(run_id, metric=metric)
        per_layer = timings[timings["layer_id"].notna()]
        assert len(per_layer) == 2 * len(profile.layers)
        whole = timings[timings["layer_id"].isna()]
        assert set(whole["backend"]) == {"xla", "jaxcnn"}
        assert len(store.sparsity(run_id)) == len(profile.layers)


def test_sparsity_follows_relu():
    """A ReLU'd conv output feeds the next layer: its input zero fraction is clearly > 0."""
    spec = get_model("lenet5")
    params = spec.init(0, jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(1), spec.input_shape(4))
    record = activation_sparsity(spec, params, x)
    assert len(record) == len(spec.layers(4, jnp.float32))
    assert record[0][0] == 0.0  # the image has no exact zeros
    assert 0.2 < record[0][1] < 0.8  # conv1 + ReLU zeroes about half


def test_live_bytes_lower_bound_hand_case():
    bufs = [Buffer("a", 100, 0, 1), Buffer("b", 50, 1, 2), Buffer("c", 70, 2, 3)]
    assert live_bytes_lower_bound(bufs) == 150
    assert live_bytes_lower_bound([]) == 0


def test_jaxpr_buffers_inline_calls():
    def f(x):
        y = jax.jit(lambda v: jnp.sin(v) * 2)(x)
        return jnp.cos(y) + 1

    bufs = jaxpr_buffers(f, jnp.ones((256,), jnp.float32))
    assert [b.size_bytes for b in bufs] == [1024, 1024, 1024]  # sin, mul, cos (add is the output)
    assert live_bytes_lower_bound(bufs) == 2048  # an op's input and output are live together


def test_cli_layers_and_errors(capsys):
    assert cli.main(["layers", "vgg16", "--batch", "1", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "conv1_1" in out and "total:" in out
    assert cli.main(["layers", "vgg99"]) == 2
    assert "unknown model 'vgg99'" in capsys.readouterr().err
    assert cli.main(["layers", "lenet5", "--dtype", "int8"]) == 2
    assert "unknown dtype" in capsys.readouterr().err


def test_cli_plan(capsys):
    assert cli.main(["plan", "squeezenet1_1", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "lower bound" in out and "XLA temp" in out


def test_cli_profile_and_compare(tmp_path, capsys):
    db = str(tmp_path / "cli.sqlite")
    for _ in range(2):
        assert cli.main(["profile", "lenet5", "--batch", "1", "--dtype", "fp32", "--iters", "2",
                         "--warmup", "1", "--db", db, "--quiet"]) == 0
    assert "recorded in" in capsys.readouterr().out
    assert cli.main(["compare", "1", "2", "--db", db]) == 0
    assert "conv1" in capsys.readouterr().out
    assert cli.main(["profile", "lenet5", "--backend", "cudnn", "--db", db, "--quiet"]) == 2


def test_cli_csv_export(tmp_path):
    path = tmp_path / "layers.csv"
    assert cli.main(["layers", "resnet50", "--csv", str(path)]) == 0
    text = path.read_text()
    assert text.count("conv2d") == 53 and "layer1" in text.replace(".", "")
