"""scripts/refresh_predictions.py: the traffic model's rows of profile runs in a store export are
recomputed with today's model; everything measured stays as it was."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from jaxcnn.costmodel.model import model_rows, stored_layer_info
from jaxcnn.store import Store

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("refresh_predictions", ROOT / "scripts" / "refresh_predictions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAYERS = [
    dict(idx=0, name="dw", op="conv2d", input_shapes=[[8, 28, 28, 64]], weight_shape=[3, 3, 1, 64],
         params=dict(stride=[1, 1], padding="SAME", dilation=[1, 1], groups=64, dtype="bfloat16")),
    dict(idx=1, name="dense", op="conv2d", input_shapes=[[8, 28, 28, 64]], weight_shape=[1, 1, 64, 128],
         params=dict(stride=[1, 1], padding="VALID", dilation=[1, 1], groups=1, dtype="bfloat16")),
    dict(idx=2, name="pool", op="max_pool", input_shapes=[[8, 28, 28, 128]], params={}),
]


def export_with_stale_predictions(tmp_path) -> tuple[Path, list]:
    with Store(tmp_path / "s.sqlite") as store:
        run = store.add_run("profile", model="m", device="gpu", environment={"gpu_name": "H200"})
        ids = store.add_layers(run, LAYERS)
        store.add_measurements(run, [dict(layer_id=i, backend="xla", metric="device_time_ms", median=0.01 * (i + 1))
                                     for i in ids])
        store.add_predictions(run, [dict(layer_id=ids[0], model="roofline", time_ms=0.001),
                                    dict(layer_id=ids[0], model="delta", time_ms=123.0, extra={"impl": "xla"}),
                                    dict(layer_id=ids[1], model="delta", time_ms=456.0, extra={"impl": "xla"})])
        other = store.add_run("plan", model="m", device="gpu")
        path = store.export_json(tmp_path / "export.json")
        return path, [run, other]


def test_refresh_replaces_model_rows_and_keeps_the_measurements(tmp_path, capsys):
    path, _ = export_with_stale_predictions(tmp_path)
    before = json.loads(path.read_text())
    assert load_script().main([str(path)]) == 0
    after = json.loads(path.read_text())
    run, plan = after["runs"]
    assert plan == before["runs"][1]
    assert run["measurements"] == before["runs"][0]["measurements"] and run["layers"] == before["runs"][0]["layers"]
    roofline = [r for r in run["predictions"] if r["model"] == "roofline"]
    delta = [r for r in run["predictions"] if r["model"] == "delta"]
    assert [r["time_ms"] for r in roofline] == [0.001]
    want = [(layer["name"], row["time_ms"]) for layer in LAYERS[:2] for row in model_rows(stored_layer_info(layer), "H200")]
    assert [(r["layer"], r["time_ms"]) for r in delta] == want
    assert {r["extra"]["impl"] for r in delta if r["layer"] == "dw"} == {"depthwise", "jaxcnn_depthwise"}
    assert {r["extra"]["impl"] for r in delta if r["layer"] == "dense"} == {"xla", "jaxcnn_direct"}
    assert "{'depthwise': 1, 'jaxcnn_depthwise': 1, 'jaxcnn_direct': 1, 'xla': 1}" in capsys.readouterr().out
    with Store(tmp_path / "again.sqlite") as store:  # still an export the store reads
        (run_id, _) = store.import_json(path)
        assert len(store.predictions(run_id)) == 5


def test_refresh_refuses_a_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_script().main([str(tmp_path / "nope.json")])
    assert "no such file" in capsys.readouterr().err
