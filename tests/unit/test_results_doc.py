"""Docs that cannot drift: docs/results.md and docs/results-archive.md are rendered from the newest record of each
name in benchmarks/results/<name>/, nothing else, and every name is placed on exactly one of them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE, ARCHIVE = ROOT / "docs" / "results.md", ROOT / "docs" / "results-archive.md"


@pytest.fixture
def make_results(monkeypatch):
    """benchmarks/make_results.py, a script beside record.py (imported as `record`), loaded as a module."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "benchmarks" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_results", module)  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _result(directory: Path, name: str, rows: list[dict], stamp: str = "2026-11-23T100000Z-abc1234",
            **fields) -> Path:
    doc = {"format": "shardwise.benchmark-result/v2", "benchmark": name, "experiment": name,
           "title": f"Title of {name}", "command": f"python -m benchmarks {name} --record", "date": stamp[:10],
           "commit": stamp.rsplit("-", 1)[-1], "model": None, "machine": "2-core x86_64, no GPU", "rows": rows,
           "notes": "", **fields}
    path = directory / name / f"{stamp}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _placement(make_results, current=("a", "b"), archived=("c",)):
    """A small placement: a headline read from b's rows, records a and b current, c archived."""
    ratio = make_results.Headline("b", "NeuroShard against TorchRec",
                                  lambda doc: f"ratio {make_results.value(doc, 'ratio', method='neuroshard')}")
    return make_results.Placement(headlines=(ratio,) if "b" in current else (),
                                  current={"Family one": tuple((n, f"what {n} shows") for n in current)},
                                  archived={"Older": tuple((n, f"what superseded {n}") for n in archived)})


def _paths(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    return results, {"doc": tmp_path / "results.md", "archive": tmp_path / "results-archive.md"}


def test_results_pages_are_the_benchmarks_json(make_results):
    stale = "docs/results.md or docs/results-archive.md is stale: run python benchmarks/make_results.py"
    assert make_results.main(["--check"]) == 0, stale


def test_every_result_file_is_shown_on_exactly_one_page_with_its_command_and_date(make_results):
    pages = {PAGE: PAGE.read_text(), ARCHIVE: ARCHIVE.read_text()}
    newest = make_results.newest_records()
    assert len(newest) > 40
    for name, path in newest.items():
        doc = json.loads(path.read_text())
        on = [page for page, text in pages.items() if f"`benchmarks/results/{name}/{path.name}`" in text]
        assert len(on) == 1, f"{name}/{path.name} is on {len(on)} pages"
        assert doc["command"] in pages[on[0]] and doc["date"] in pages[on[0]]


def test_results_page_opens_with_the_headline_table_within_its_line_budget(make_results):
    page = PAGE.read_text()
    assert page.count("\n") <= make_results.MAX_LINES == 500
    first_table = next(i for i, line in enumerate(page.splitlines()) if line.startswith("|"))
    assert page.splitlines()[first_table] == "| claim | figures | record |"
    assert page.index("## Headline claims") < page.index("\n## ", page.index("## Headline claims") + 1)
    assert page.index("| claim | figures | record |") < page.index("\n### ")
    assert 6 <= len(make_results.PLACEMENT.headlines) <= 10
    lines = page.splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith(("## ", "### "))]
    anchors = dict(zip(headings, make_results._anchors([lines[i].split(" ", 1)[1] for i in headings])))
    for headline in make_results.PLACEMENT.headlines:  # each claim links to its record's section on this page
        at = lines.index(next(line for line in lines if line.startswith(f"`benchmarks/results/{headline.record}/")))
        anchor = anchors[max(i for i in headings if i < at)]
        assert f"[{headline.record}](#{anchor}) |" in page

def test_check_fails_on_a_stale_page_and_writing_fixes_it(make_results, tmp_path):
    results, pages = _paths(tmp_path)
    placement = _placement(make_results)
    _result(results, "b", [{"method": "neuroshard", "ratio": 0.84}, {"method": "torchrec", "ratio": 1.0}])
    _result(results, "a", [{"what": "x|y", "value": None, "ok": True}], notes="a note")
    _result(results, "c", [{"method": "old", "ratio": 0.9}])
    assert make_results.main(["--check"], results=results, placement=placement, **pages) == 1  # no pages yet
    assert make_results.main([], results=results, placement=placement, **pages) == 0
    assert make_results.main(["--check"], results=results, placement=placement, **pages) == 0
    page, archive = pages["doc"].read_text(), pages["archive"].read_text()
    assert page.index("## Title of a") < page.index("## Title of b")  # in the placement's order
    assert "| what | value | ok |" in page and "| x\\|y | - | yes |" in page
    assert "| neuroshard | 0.84 |" in page and "a note" in page
    assert "| NeuroShard against TorchRec | ratio 0.84 | [b](#title-of-b) |" in page  # the figure read from b
    assert "Title of c" not in page and "`benchmarks/results/c/2026-11-23T100000Z-abc1234.json`: what superseded c" in archive
    assert "```bash\npython -m benchmarks b --record" in page  # a current command is checked as one to run
    assert "```text\npython -m benchmarks c --record" in archive  # an archived one is history
    assert "commit abc1234" in page

    _result(results, "b", [{"method": "neuroshard", "ratio": 0.85}], stamp="2026-11-24T090000Z-def5678")
    assert make_results.main(["--check"], results=results, placement=placement, **pages) == 1  # a newer run
    make_results.main([], results=results, placement=placement, **pages)
    page = pages["doc"].read_text()
    assert "| neuroshard | 0.85 |" in page and "0.84" not in page and "commit def5678" in page
    _result(results, "c", [{"method": "old", "ratio": 0.95}], stamp="2026-11-25T000000Z-def5678")
    assert make_results.main(["--check"], results=results, placement=placement, **pages) == 1  # the archive alone


def test_a_record_in_no_group_is_refused_naming_it(make_results, tmp_path, capsys):
    results, pages = _paths(tmp_path)
    for name in ("a", "b", "c", "new_study"):
        _result(results, name, [{"method": "neuroshard", "ratio": 0.84}])
    assert make_results.main([], results=results, placement=_placement(make_results), **pages) == 2
    assert "new_study" in capsys.readouterr().err and not pages["doc"].exists()


def test_a_record_placed_twice_or_a_headline_key_missing_is_refused(make_results, tmp_path, capsys):
    results, pages = _paths(tmp_path)
    for name in ("a", "b", "c"):
        _result(results, name, [{"method": "neuroshard", "speedup": 2.0}])
    twice = _placement(make_results, current=("a", "b", "c"))
    assert make_results.main([], results=results, placement=twice, **pages) == 2
    assert "placed more than once" in capsys.readouterr().err
    assert make_results.main([], results=results, placement=_placement(make_results), **pages) == 2
    assert "'b'" in (err := capsys.readouterr().err) and "'ratio'" in err  # the headline's key, named


def test_results_page_over_its_line_budget_is_refused(make_results, tmp_path, capsys, monkeypatch):
    results, pages = _paths(tmp_path)
    for name in ("a", "b", "c"):
        _result(results, name, [{"method": "neuroshard", "ratio": 0.84}])
    monkeypatch.setattr(make_results, "MAX_LINES", 10)
    assert make_results.main([], results=results, placement=_placement(make_results), **pages) == 2
    assert "over 10" in capsys.readouterr().err


def test_a_result_in_another_format_is_refused_naming_the_file(make_results, tmp_path, capsys):
    _result(tmp_path, "old", [], format="shardwise.benchmark-result/v1")
    assert make_results.main(["--check"], results=tmp_path, doc=tmp_path / "results.md",
                             archive=tmp_path / "results-archive.md") == 2
    err = capsys.readouterr().err
    assert "old/2026-11-23T100000Z-abc1234.json" in err and "shardwise.benchmark-result/v2" in err


def test_a_record_is_written_as_a_new_file_never_over_an_earlier_one(make_results, tmp_path):
    import record

    first = record.record("x", "Title", [{"a": 1}], model="models:/m/3", experiment="x", directory=tmp_path)
    second = record.record("x", "Title", [{"a": 2}], experiment="x", directory=tmp_path)
    assert first != second and json.loads(first.read_text())["rows"] == [{"a": 1}]
    assert record.newest_records(tmp_path) == {"x": second}
    doc = make_results.load_result(first)
    assert doc["model"] == "models:/m/3" and doc["commit"] and doc["command"].startswith("python ")
