"""scripts/make_shipped.py: each part becomes one dated export in --out that a fresh store imports,
with the commit of the code that made it; older exports of that part go, other files stay."""

import json
import sys
from pathlib import Path

import pytest

from jaxcnn.store import Store

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import make_shipped  # noqa: E402


def test_parts_are_exported_whole_and_replace_older_exports_of_the_same_part(tmp_path, capsys):
    out = tmp_path / "shipped"
    out.mkdir()
    stale = out / "h200-2000-01-01-zoo.json"
    stale.write_text("{}")
    other = out / "h200-2000-01-01-memory_planning.json"
    other.write_text("{}")
    rc = make_shipped.main(["--out", str(out), "--parts", "zoo,optimized", "--models", "lenet5",
                            "--batches", "2", "--iters", "1", "--dtype", "float32"])
    assert rc == 0, capsys.readouterr().err
    made = sorted(p.name for p in out.glob("*.json"))
    assert not stale.exists() and other.exists()
    zoo = [n for n in made if n.endswith("-zoo.json")]
    optimized = [n for n in made if n.endswith("-optimized.json")]
    assert len(zoo) == 1 and len(optimized) == 1, made
    assert not list(out.glob("*.tmp"))
    for name, backends in ((zoo[0], {"xla", "jaxcnn"}), (optimized[0], {"xla", "jaxcnn"})):
        document = json.loads((out / name).read_text())
        assert len(document["runs"]) == 1
        run = document["runs"][0]
        assert run["model"] == "lenet5" and run["batch"] == 2 and run["kind"] == "profile"
        assert run["git_commit"], "the export must say which commit made it"
        with Store(tmp_path / f"{name}.sqlite") as store:
            assert len(store.import_json(out / name)) == 1
    optimized_run = json.loads((out / optimized[0]).read_text())["runs"][0]
    assert "optimize(fn) defaults" in optimized_run["note"]


def test_a_part_with_a_failing_model_is_not_published(tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(make_shipped, "profile_model", broken)
    out = tmp_path / "shipped"
    out.mkdir()
    shipped = out / "h200-2000-01-01-zoo.json"
    shipped.write_text("{}")
    rc = make_shipped.main(["--out", str(out), "--parts", "zoo", "--models", "lenet5", "--batches", "1",
                            "--iters", "1"])
    assert rc == 1
    captured = capsys.readouterr()
    assert "FAILED lenet5 N=1: Traceback" in captured.err
    assert "zoo: not published, 1 failed" in captured.out
    assert [p.name for p in out.iterdir()] == [shipped.name]  # the shipped export stays as it was


@pytest.mark.parametrize("argv, message", [
    (["--parts", "zoo,speed"], "unknown ['speed']"),
    (["--models", "lenet6"], "unknown models ['lenet6']"),
])
def test_bad_arguments_name_what_is_wrong(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        make_shipped.parse_args(["--out", str(tmp_path), *argv])
    assert message in capsys.readouterr().err


def test_add_keeps_the_other_models_of_the_previous_export(tmp_path, capsys):
    out = tmp_path / "shipped"
    out.mkdir()
    with Store(tmp_path / "old.sqlite") as old:
        for model in ("squeezenet1_1", "lenet5"):
            old.add_run("profile", model=model, batch=2, device="gpu", note="made earlier",
                        created_at="2000-01-01T00:00:00+00:00")
        old.export_json(out / "h200-2000-01-01-zoo.json")
    rc = make_shipped.main(["--out", str(out), "--parts", "zoo", "--models", "lenet5", "--batches", "2",
                            "--iters", "1", "--dtype", "float32", "--add"])
    assert rc == 0, capsys.readouterr().err
    (export,) = out.glob("*-zoo.json")
    assert export.name != "h200-2000-01-01-zoo.json"
    runs = json.loads(export.read_text())["runs"]
    # The earlier squeezenet1_1 run stays (first, unchanged); lenet5's earlier run is replaced.
    assert [r["model"] for r in runs] == ["squeezenet1_1", "lenet5"]
    assert runs[0]["note"] == "made earlier" and runs[1]["note"] != "made earlier" and runs[1]["layers"]
