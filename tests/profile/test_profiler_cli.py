"""Profiler end to end on the CPU (reference path) into a temp store, and the CLI."""


import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import profile_fn_models
from jaxcnn import cli
from jaxcnn.dashboard import data
from jaxcnn.models import get_model, list_models
from jaxcnn.optimize.rewrite import find_matches
from jaxcnn.memory import Buffer, jaxpr_buffers, live_bytes_lower_bound
from jaxcnn.profile.device_time import TimingStats, stats_fields
from jaxcnn.profile.environment import git_state
from jaxcnn.profile.function_profile import profile_function, site_inputs
from jaxcnn.profile.model_profile import LayerProfile, ModelProfile
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


def test_cli_plan(capsys, tmp_path):
    assert cli.main(["plan", "squeezenet1_1", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "lower bound" in out and "XLA temp" in out
    assert cli.main(["plan", "lenet5", "--batch", "1", "--db", str(tmp_path / "plans.sqlite")]) == 0
    with Store(tmp_path / "plans.sqlite") as store:
        run = store.runs().iloc[0]
        # The run records where and at which commit it was planned, like a profile run.
        assert run["git_commit"] == (git_state() or {}).get("commit") and run["jax_version"] == jax.__version__


def test_cli_profile_and_compare(tmp_path, capsys):
    db = str(tmp_path / "cli.sqlite")
    for _ in range(2):
        assert cli.main(["profile", "lenet5", "--batch", "1", "--dtype", "fp32", "--iters", "2",
                         "--warmup", "1", "--db", db, "--quiet"]) == 0
    assert "recorded in" in capsys.readouterr().out
    assert cli.main(["compare", "1", "2", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "conv1" in out
    if jax.default_backend() == "cpu":  # two reference-path runs: their times, no ratio
        header = next(line for line in out.splitlines() if line.split()[:1] == ["layer"])
        assert "no ratio" in out and "ratio" not in header.split() and "median_b" in header
    assert cli.main(["profile", "lenet5", "--backend", "cudnn", "--db", db, "--quiet"]) == 2


def test_cli_csv_export(tmp_path):
    path = tmp_path / "layers.csv"
    assert cli.main(["layers", "resnet50", "--csv", str(path)]) == 0
    text = path.read_text()
    assert text.count("conv2d") == 53 and "layer1" in text.replace(".", "")


# -- profile any function (--fn) ------------------------------------------------------------------


def test_cli_profile_help_lists_the_zoo_and_the_fn_contract(capsys):
    assert cli.main(["profile", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in list_models())
    assert "--fn MODULE:CALLABLE" in out and "must return (fn, example_args)" in out
    assert "passed to it as batch=N and dtype=NAME when given" in out


@pytest.mark.slow
def test_cli_profile_fn_flax_cnn_on_cpu(tmp_path, capsys):
    pytest.importorskip("flax")
    db = tmp_path / "fn.sqlite"
    assert cli.main(["profile", "--fn", "profile_fn_flax:flax_cnn", "--batch", "2", "--dtype", "fp32", "--iters",
                     "2", "--warmup", "1", "--db", str(db), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("profile_fn_flax:flax_cnn batch=2 float32") and "recorded in" in out
    on_gpu = jax.default_backend() == "gpu"
    # Without a GPU the reference path ran on both backends: no ratio is printed.
    assert on_gpu or ("no XLA/jaxcnn ratio" in out and "XLA/jaxcnn =" not in out)
    with Store(db) as store:
        run = store.runs().iloc[0]
        assert (run["model"], run["batch"], run["dtype"], run["kind"]) == ("profile_fn_flax:flax_cnn", 2, "float32",
                                                                           "profile")
        assert run["device"] == ("gpu" if on_gpu else "cpu")
        assert run["git_commit"] == (git_state() or {}).get("commit")  # every run records its commit
        assert run["extra"]["fn"] == "profile_fn_flax:flax_cnn" and run["extra"]["conv_sites"] == 3
        layers = store.layers(int(run["id"]))
        assert list(layers["name"]) == ["conv0", "conv1", "conv2"]
        conv1 = layers.iloc[1]
        # The strided conv after a 2x2 max pool: input 2x8x8x8, output 2x4x4x16, BatchNorm folded.
        assert conv1["input_shapes"] == [[2, 8, 8, 8]] and conv1["output_shape"] == [2, 4, 4, 16]
        assert conv1["weight_shape"] == [3, 3, 8, 16] and conv1["flops"] == 2 * 2 * 4 * 4 * 16 * 3 * 3 * 8
        assert conv1["params"]["folded"] and conv1["params"]["stride"] == [2, 2]
        assert layers.iloc[2]["params"]["residual"] and layers.iloc[2]["params"]["activation"] == "relu"
        assert all(p["optimize"] for p in layers["params"])
        metric = "device_time_ms" if on_gpu else "wall_time_ms"
        timed = store.measurements(int(run["id"]), metric=metric)
        per_layer = timed[timed["layer_id"].notna()]
        assert sorted(zip(per_layer["layer"], per_layer["backend"])) == sorted(
            (f"conv{i}", b) for i in range(3) for b in ("xla", "jaxcnn"))
        assert set(timed.loc[timed["layer_id"].isna(), "backend"]) == {"xla", "jaxcnn"}
        sparsity = store.sparsity(int(run["id"]))
        # conv2 reads the ReLU of conv1: about half zeros; conv0 reads the image: none.
        zero = dict(zip(sparsity["layer"], sparsity["zero_fraction"]))
        assert zero["conv0"] == 0.0 and 0.2 < zero["conv2"] < 0.8
    # The dashboard reads it like a zoo profile.
    long, metric = data.layer_times(Store(db, read_only=True), 1)
    assert set(long["layer"]) == {"conv0", "conv1", "conv2"} and long["time_ms"].gt(0).all()


def test_cli_profile_fn_from_a_file_path_with_a_name(tmp_path, capsys):
    db = tmp_path / "fn.sqlite"
    path = Path(profile_fn_models.__file__)
    assert cli.main(["profile", "--fn", f"{path}:lax_nchw_cnn", "--batch", "3", "--name", "raw_lax", "--iters", "1",
                     "--warmup", "0", "--no-sparsity", "--backend", "xla", "--db", str(db), "--quiet"]) == 0
    with Store(db) as store:
        run = store.runs().iloc[0]
        assert (run["model"], run["batch"]) == ("raw_lax", 3)
        layers = store.layers(int(run["id"]))
        # NCHW activations and OIHW weights, recorded as NHWC and HWIO like every layer row.
        assert layers.iloc[0]["input_shapes"] == [[3, 12, 12, 3]] and layers.iloc[0]["weight_shape"] == [3, 3, 3, 8]
        assert layers.iloc[1]["params"]["layout"] == "NCHW" and layers.iloc[1]["output_shape"] == [3, 12, 12, 4]
        assert set(store.measurements(int(run["id"]))["backend"]) == {"xla"}
        assert store.sparsity(int(run["id"])).empty


@pytest.mark.parametrize("argv, status, message", [
    (["--fn", "profile_fn_models:no_conv"], 1, "finds no conv site in fn"),
    (["--fn", "profile_fn_models:not_a_pair"], 1, "must return (fn, example_args), got a ArrayImpl"),
    (["--fn", "profile_fn_models:lax_nchw_cnn", "--dtype", "fp32"], 1, "--dtype: profile_fn_models:lax_nchw_cnn "
                                                                        "takes no 'dtype' keyword"),
    (["--fn", "no_such_module_here:f"], 1, "no module named 'no_such_module_here'"),
    (["--fn", "profile_fn_models:nothing"], 1, "profile_fn_models has no attribute 'nothing'"),
    (["--fn", "profile_fn_models"], 1, "expected MODULE:CALLABLE"),
    (["--fn", "profile_fn_models:lax_nchw_cnn", "lenet5"], 2, "give a zoo MODEL or --fn MODULE:CALLABLE"),
    ([], 2, "give a zoo MODEL or --fn MODULE:CALLABLE"),
    (["lenet5", "--name", "x"], 2, "--name names a --fn profile"),
])
def test_cli_profile_fn_errors_are_one_line(tmp_path, capsys, argv, status, message):
    assert cli.main(["profile", *argv, "--db", str(tmp_path / "x.sqlite"), "--quiet", "--iters", "1"]) == status
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    with Store(tmp_path / "x.sqlite") as store:
        assert store.runs().empty  # nothing half-recorded


def test_profile_function_times_each_site_on_the_inputs_fn_computes():
    fn, ((w1, w2), x) = profile_fn_models.lax_nchw_cnn(batch=2)
    closed = jax.make_jaxpr(fn)((w1, w2), x)
    found = find_matches(closed.jaxpr)
    matches = [m for _, _, m in found.all_matches() if m.op == "conv2d"]
    inputs = site_inputs(closed, found, matches, jax.tree.leaves(((w1, w2), x)))
    dims = ("NCHW", "OIHW", "NCHW")
    hidden = jax.nn.relu(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dims))
    (x0, w0), out0 = inputs[id(matches[0])]
    (x1, _), out1 = inputs[id(matches[1])]
    np.testing.assert_array_equal(x0, x) and np.testing.assert_array_equal(w0, w1)
    np.testing.assert_allclose(out0, hidden, rtol=1e-6)
    np.testing.assert_allclose(x1, hidden, rtol=1e-6)  # the second site reads the first one's output
    np.testing.assert_allclose(out1, fn((w1, w2), x), rtol=1e-6)
    profile = profile_function(fn, ((w1, w2), x), iters=1, warmup=0)
    assert profile.model == "forward" and profile.batch == 2 and [l.info.name for l in profile.layers] == [
        "conv0", "conv1"]
    assert profile.layers[1].input_zero_fraction == pytest.approx(float(np.mean(np.asarray(hidden) == 0)))
    lines = summarize(profile)
    assert profile.is_device_time or not any("XLA/jaxcnn =" in line for line in lines)


def test_profile_function_checks_its_arguments_before_any_work():
    fn, args = profile_fn_models.lax_nchw_cnn()
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        profile_function(3, args)
    with pytest.raises(TypeError, match="example_args must be a tuple"):
        profile_function(fn, {"x": 1})
    with pytest.raises(ValueError, match="iters must be >= 1"):
        profile_function(fn, args, iters=0)
    with pytest.raises(ValueError, match=r"backends must be some of \('xla', 'jaxcnn'\)"):
        profile_function(fn, args, backends=("cudnn",))
    with pytest.raises(TypeError, match="store must be a jaxcnn.store.Store, a path or None"):
        profile_function(fn, args, store=3)


def test_cli_compare_refuses_a_cpu_run_against_a_gpu_run(tmp_path, capsys):
    db = tmp_path / "both.sqlite"
    with Store(db) as store:  # the shipped H200 zoo profiles (runs 1-18), then a CPU run (19)
        store.import_json(next(f for f in data.shipped_files() if f.name.endswith("-zoo.json")))
    profile_model("lenet5", batch=1, dtype="float32", iters=1, warmup=0, sparsity=False, store=str(db))
    if jax.default_backend() != "cpu":
        pytest.skip("the second run was timed on this GPU")
    assert cli.main(["compare", "18", "19", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "run #19 was timed on a CPU" in err and "not comparable" in err


def test_a_given_commit_names_a_copy_s_commit(monkeypatch):
    """A tree copied from a commit (git archive) inside another repository records the commit
    it was copied from, not the enclosing repository's."""
    monkeypatch.setenv("JAXCNN_GIT_COMMIT", "1041c42ec9d7d0f96b085b08e6be308ac49d45bc")
    assert git_state() == dict(commit="1041c42ec9d7d0f96b085b08e6be308ac49d45bc", dirty=None)
