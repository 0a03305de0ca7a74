"""Profiler end to end on the CPU (reference path) into a temp store, and the CLI."""


import argparse

import jax
import jax.numpy as jnp
import pytest

from jaxcnn import cli
from jaxcnn.models import get_model, list_models
from jaxcnn.planner import Buffer, jaxpr_buffers, live_bytes_lower_bound
from jaxcnn.profile.device_time import TimingStats, stats_fields
from jaxcnn.profile.profiler import (
    LayerProfile,
    ModelProfile,
    activation_sparsity,
    profile_model,
    summarize,
)
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


def test_profile_arguments_are_checked_before_any_work():
    for kwargs, message in [(dict(iters=0), "iters must be >= 1, got 0"), (dict(warmup=-1), "warmup must be >= 0"),
                            (dict(batch=0), "batch must be >= 1")]:
        with pytest.raises(ValueError, match=message):
            profile_model("lenet5", **kwargs)
    with pytest.raises(TypeError, match="iters must be an integer, got float"):
        profile_model("lenet5", iters=2.0)
    with pytest.raises(TypeError, match="store must be a jaxcnn.store.Store, a path or None, got int"):
        profile_model("lenet5", store=3)


def made_up_profile(layer_times: dict[str, dict[str, float]]) -> ModelProfile:
    """A profile of conv layers with the given {layer: {backend: median ms}}; nothing is run."""
    from jaxcnn.models.layers import LayerInfo

    def timing(ms):
        return TimingStats(**stats_fields([ms]))

    layers = [LayerProfile(LayerInfo(name, "conv2d", "float32", ((1, 4, 4, 1),), (1, 4, 4, 1)),
                           {b: timing(ms) for b, ms in times.items()})
              for name, times in layer_times.items()]
    whole = {"xla": timing(3.0), "jaxcnn": timing(2.0)}
    return ModelProfile("made_up", 1, "float32", ("xla", "jaxcnn"), True, layers, whole, dict(whole), {}, {})


def test_summary_says_which_backend_is_faster_per_layer():
    lines = summarize(made_up_profile({"big_fast": {"xla": 2.0, "jaxcnn": 1.0},
                                       "small_slow": {"xla": 0.5, "jaxcnn": 1.0},
                                       "tiny_tie": {"xla": 0.1, "jaxcnn": 0.1}}))
    by_layer = {line.split()[0]: line for line in lines if line.startswith("    ")}
    assert "XLA/jaxcnn = 2.00 (jaxcnn faster)" in by_layer["big_fast"]
    assert "XLA/jaxcnn = 0.50 (jaxcnn slower)" in by_layer["small_slow"]
    assert "(jaxcnn as fast)" in by_layer["tiny_tie"]
    assert not any("slow:" in line for line in lines)  # no blanket "slow" label
    assert lines[-1] == "  jaxcnn slower than XLA on 1 of 3 layers: small_slow"
    assert "XLA/jaxcnn = 1.50" in next(line for line in lines if "jaxcnn   end-to-end" in line)


def test_cli_options_all_have_help_and_the_model_help_lists_the_zoo():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == {"profile", "layers", "plan", "maxbatch", "layouts", "fuse", "compare", "dashboard"}
    for name, command in commands.items():
        for action in command._actions:
            assert action.help, f"jaxcnn {name} {action.option_strings or action.dest} has no help text"
        model = [a for a in command._actions if a.dest == "model"]
        if model:
            assert model[0].help == "zoo model: " + ", ".join(list_models())


def test_cli_layers_and_errors(capsys):
    assert cli.main(["layers", "vgg16", "--batch", "1", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "conv1_1" in out and "total:" in out
    pool = next(line for line in out.splitlines() if " pool1 " in line).split()
    assert pool[4] == "-" and "nan" not in out.lower()  # a pool has no weight shape (index, name, op, input, weight)
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
