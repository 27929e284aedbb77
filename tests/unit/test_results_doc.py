"""Docs that cannot drift: docs/results.md is rendered from benchmarks/results/*.json, nothing else."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def make_results(monkeypatch):
    """benchmarks/make_results.py, a script beside record.py (imported as `record`), loaded as a module."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "benchmarks" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(directory: Path, name: str, rows: list[dict], **fields) -> Path:
    doc = {"format": "shardwise.benchmark-result/v1", "benchmark": name, "title": f"Title of {name}",
           "command": f"python benchmarks/bench_{name}.py --record", "date": "2026-11-23",
           "machine": "2-core x86_64, no GPU", "rows": rows, "notes": "", **fields}
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_results_page_is_the_benchmarks_json(make_results):
    stale = "docs/results.md is stale: run python benchmarks/make_results.py"
    assert make_results.main(["--check"]) == 0, stale


def test_every_result_file_is_shown_with_its_command_and_date(make_results):
    page = (ROOT / "docs" / "results.md").read_text()
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        doc = json.loads(path.read_text())
        assert f"`benchmarks/results/{path.name}`" in page
        assert doc["command"] in page and doc["date"] in page


def test_check_fails_on_a_stale_page_and_writing_fixes_it(make_results, tmp_path):
    results, doc = tmp_path / "results", tmp_path / "results.md"
    results.mkdir()
    _result(results, "b", [{"method": "neuroshard", "ratio": 0.84}, {"method": "torchrec", "ratio": 1.0}])
    _result(results, "a", [{"what": "x|y", "value": None, "ok": True}], notes="a note")
    assert make_results.main(["--check"], results=results, doc=doc) == 1  # no page yet
    assert make_results.main([], results=results, doc=doc) == 0
    assert make_results.main(["--check"], results=results, doc=doc) == 0
    page = doc.read_text()
    assert page.index("## Title of a") < page.index("## Title of b")  # sorted by file name
    assert "| what | value | ok |" in page and "| x\\|y | - | yes |" in page
    assert "| neuroshard | 0.84 |" in page and "a note" in page

    _result(results, "b", [{"method": "neuroshard", "ratio": 0.85}])  # a new run changes a figure
    assert make_results.main(["--check"], results=results, doc=doc) == 1


def test_a_result_in_another_format_is_refused_naming_the_file(make_results, tmp_path, capsys):
    _result(tmp_path, "old", [], format="shardwise.benchmark-result/v0")
    assert make_results.main(["--check"], results=tmp_path, doc=tmp_path / "results.md") == 2
    err = capsys.readouterr().err
    assert "old.json" in err and "shardwise.benchmark-result/v1" in err
