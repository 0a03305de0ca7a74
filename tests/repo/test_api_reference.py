"""Every public name is documented once: docs/api.md, written from the docstrings by
scripts/write_api_reference.py, is up to date, lists each public object once and leaves none
undocumented."""

import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import write_api_reference as api  # noqa: E402


def test_every_public_name_has_a_docstring():
    missing = [f"{module}.{name}" for module, rows in api.entries() for name, _, text, _ in rows if not text]
    assert not missing, f"public names without a docstring: {missing}"


def test_each_public_object_is_listed_once():
    names = [f"{module}.{name}" for module, rows in api.entries() for name, *_ in rows]
    assert len(names) > 100
    repeated = [n for n, count in collections.Counter(names).items() if count > 1]
    assert not repeated


def test_api_reference_is_up_to_date():
    assert (ROOT / "docs" / "api.md").read_text() == api.render(), \
        "docs/api.md is behind the code: run python scripts/write_api_reference.py"
