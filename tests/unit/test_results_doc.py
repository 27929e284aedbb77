"""Docs that cannot drift: docs/results.md, docs/results-archive.md and README.md's Results bullets are rendered from
the newest record of each name in benchmarks/results/<name>/, nothing else, and every name is placed on exactly one
of the two pages."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE, ARCHIVE = ROOT / "docs" / "results.md", ROOT / "docs" / "results-archive.md"
README = ROOT / "README.md"


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


def _paths(tmp_path, make_results):
    """A results folder and the three pages in `tmp_path`, the README with its markers between two lines of prose."""
    results = tmp_path / "results"
    results.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("# title\n\nprose before\n\n" + "\n".join(make_results.README_MARKERS) + "\n\nprose after\n")
    return results, {"doc": tmp_path / "results.md", "archive": tmp_path / "results-archive.md", "readme": readme}


def test_results_pages_are_the_benchmarks_json(make_results):
    stale = "docs/results.md, docs/results-archive.md or README.md is stale: run python benchmarks/make_results.py"
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
    headlines = _shown(make_results).headlines
    assert 6 <= len(headlines) <= 10
    lines = page.splitlines()
    for headline in headlines:  # each claim links to its records' sections: on this page, or archived as it yields
        row = next(line for line in lines if line.startswith(f"| {headline.claim} |"))
        for name in headline.records:
            on_page = any(line.startswith(f"`benchmarks/results/{name}/") for line in lines)
            assert on_page or headline.yields_to, f"{name}: a standing headline's record is on results.md"
            link = _section_link(make_results, lines if on_page else ARCHIVE.read_text().splitlines(), name)
            assert f"[{name}]({'' if on_page else ARCHIVE.name}#{link})" in row


def _section_link(make_results, lines: list[str], name: str) -> str:
    """The anchor of record `name`'s section on a page of `lines`."""
    headings = [i for i, line in enumerate(lines) if line.startswith(("## ", "### "))]
    anchors = dict(zip(headings, make_results._anchors([lines[i].split(" ", 1)[1] for i in headings])))
    at = lines.index(next(line for line in lines if line.startswith(f"`benchmarks/results/{name}/")))
    return anchors[max(i for i in headings if i < at)]


def _shown(make_results):
    """The placement as the pages show it today: pending records without a record left out."""
    return make_results.recorded(make_results.PLACEMENT, list(make_results.newest_records()))


def _block(make_results, readme: str) -> str:
    begin, end = make_results.README_MARKERS
    return readme[readme.index(begin) + len(begin):readme.index(end)]


def test_readme_bullets_are_the_headlines_each_naming_its_records_commit_and_date(make_results):
    headlines, newest = _shown(make_results).headlines, make_results.newest_records()
    bullets = [" ".join(b.split()) for b in _block(make_results, README.read_text()).strip().split("\n- ")]
    assert len(bullets) == len(headlines)
    for bullet, headline in zip(bullets, headlines):  # one claim each, in the placement's order
        assert f"**{headline.claim}**: " in bullet
        for name in headline.records:
            doc = json.loads(newest[name].read_text())
            when = f"commit {doc['commit']}" if doc["commit"] else f"added in {doc['recorded_in']}"
            assert f"`{name}`" in bullet and f"{when}, {doc['date']})" in bullet or f"{when}, {doc['date']};" in bullet
    assert "not recorded" not in _block(make_results, README.read_text())  # every figure names a commit


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _rows_at(commit: str, name: str) -> list[list[dict]]:
    """The rows of every record of `name` in git's tree at `commit` (a record then was results/<name>.json or a file
    in results/<name>/)."""
    paths = _git("ls-tree", "-r", "--name-only", commit, "--", "benchmarks/results").split()
    found = [path for path in paths if path in (f"benchmarks/results/{name}.json",)
             or path.startswith(f"benchmarks/results/{name}/") and path.endswith(".json")]
    return [json.loads(_git("show", f"{commit}:{path}")).get("rows") for path in found]


def test_a_record_marked_recorded_in_names_the_commit_that_added_its_figures(make_results):
    marked = {name: json.loads(path.read_text()) for name, path in make_results.newest_records().items()}
    marked = {name: doc for name, doc in marked.items() if doc.get("recorded_in")}
    headlines = {record for h in _shown(make_results).headlines for record in h.records}
    assert headlines & set(marked), "no headline record is marked: this test would check nothing"
    for name, doc in marked.items():
        assert doc["rows"] in _rows_at(doc["recorded_in"], name), f"{name}: {doc['recorded_in']} lacks its rows"
        assert doc["rows"] not in _rows_at(doc["recorded_in"] + "^", name), f"{name}: its rows are older than " \
            f"{doc['recorded_in']}"


def test_a_readme_figure_edited_by_hand_fails_the_check_and_writing_restores_only_the_bullets(make_results,
                                                                                                tmp_path, capsys):
    readme, pages = tmp_path / "README.md", {"doc": tmp_path / "results.md", "archive": tmp_path / "archive.md"}
    text = README.read_text()
    begin = text.index(make_results.README_MARKERS[0])
    figure = re.compile(r"\d\.\d+").search(text, begin)  # the first decimal figure among the bullets
    edited = text[:figure.end() - 1] + str((int(text[figure.end() - 1]) + 1) % 10) + text[figure.end():]
    readme.write_text(edited.replace("## Results", "## Results\n\nA line another engineer added."))
    assert make_results.main(["--check"], readme=readme) == 1
    assert f"{readme} is stale" in capsys.readouterr().err
    assert make_results.main([], readme=readme, **pages) == 0
    assert readme.read_text() == text.replace("## Results", "## Results\n\nA line another engineer added.")
    assert make_results.main(["--check"], readme=readme) == 0


def test_a_readme_without_its_markers_is_refused_naming_them(make_results, tmp_path, capsys):
    results, pages = _paths(tmp_path, make_results)
    for name in ("a", "b", "c"):
        _result(results, name, [{"method": "neuroshard", "ratio": 0.84}])
    pages["readme"].write_text("# title\n\n## Results\n\n- a hand-typed figure: 0.84\n")
    assert make_results.main([], results=results, placement=_placement(make_results), **pages) == 2
    assert make_results.README_MARKERS[0] in capsys.readouterr().err
    assert pages["readme"].read_text().endswith("0.84\n") and not pages["doc"].exists()


def test_a_pending_headline_is_left_out_until_its_record_exists_then_leads(make_results, tmp_path, capsys):
    results, pages = _paths(tmp_path, make_results)
    base = _placement(make_results)
    new = make_results.Headline("p", "The new claim", lambda doc: f"new {make_results.value(doc, 'ratio', plan='x')}")
    placement = make_results.Placement(
        headlines=(new, replace(base.headlines[0], yields_to="p")), archived=base.archived,
        current={"Family one": (("p", "what p shows"), *base.current["Family one"])}, pending=frozenset({"p"}))
    for name in ("a", "b", "c"):
        _result(results, name, [{"method": "neuroshard", "ratio": 0.84}])
    assert make_results.main([], results=results, placement=placement, **pages) == 0
    readme, page = pages["readme"].read_text(), pages["doc"].read_text()
    assert "The new claim" not in readme + page and "Title of p" not in page
    assert "- **NeuroShard against TorchRec**: ratio 0.84 (`b`, commit abc1234, 2026-11-23)" in readme

    _result(results, "p", [{"plan": "x", "ratio": 0.91}], stamp="2026-12-02T100000Z-def5678")
    assert make_results.main(["--check"], results=results, placement=placement, **pages) == 1
    assert make_results.main([], results=results, placement=placement, **pages) == 0
    readme, page = pages["readme"].read_text(), pages["doc"].read_text()
    assert _block(make_results, readme).strip() == "- **The new claim**: new 0.91 (`p`, commit def5678, 2026-12-02)"
    assert "NeuroShard against TorchRec" not in page and "| The new claim | new 0.91 | [p](#title-of-p), " in page
    assert readme.startswith("# title\n\nprose before\n\n") and readme.endswith("\n\nprose after\n")

    absent = replace(placement, pending=frozenset())  # only a pending record may be absent
    (results / "p").rename(tmp_path / "p-moved")
    assert make_results.main(["--check"], results=results, placement=absent, **pages) == 2
    assert "placed but no record in benchmarks/results/<name>/: p" in capsys.readouterr().err


def test_a_headline_reads_an_archived_record_only_while_it_yields_and_links_it_on_the_archive(make_results, tmp_path,
                                                                                              capsys):
    results, pages = _paths(tmp_path, make_results)
    base = _placement(make_results, current=("a",), archived=("b", "c"))
    headline = make_results.Headline("b", "NeuroShard against TorchRec",
                                     lambda doc: f"ratio {make_results.value(doc, 'ratio', method='neuroshard')}")
    for name in ("a", "b", "c"):
        _result(results, name, [{"method": "neuroshard", "ratio": 0.84}])
    assert make_results.main([], results=results, placement=replace(base, headlines=(headline,)), **pages) == 2
    assert "headline record 'b' is not current" in capsys.readouterr().err
    yielding = replace(base, headlines=(replace(headline, yields_to="p"),))  # retired, its claim standing until p
    assert make_results.main([], results=results, placement=yielding, **pages) == 0
    assert ("| NeuroShard against TorchRec | ratio 0.84 | [b](results-archive.md#title-of-b), commit abc1234, "
            "2026-11-23 |") in pages["doc"].read_text()
    assert "Title of b" not in pages["doc"].read_text() and "### Title of b" in pages["archive"].read_text()

def test_check_fails_on_a_headline_record_naming_no_commit_and_passes_once_it_names_the_one_that_added_it(
        make_results, tmp_path, capsys):
    results, pages = _paths(tmp_path, make_results)
    both = make_results.Headline("b", "Two runs", lambda b, a: f"{len(b['rows'])} and {len(a['rows'])}", also=("a",))
    placement = replace(_placement(make_results), headlines=(both,))
    _result(results, "b", [{"ratio": 1.0}], commit=None)
    _result(results, "a", [{"ratio": 1.0}], stamp="2026-11-24T100000Z-abc1234-dirty", commit="abc1234-dirty")
    _result(results, "c", [{"ratio": 1.0}], commit=None)  # archived: no headline reads it
    assert make_results.main([], results=results, placement=placement, **pages) == 0
    assert "(`b`, commit not recorded, 2026-11-23; `a`, commit abc1234-dirty, 2026-11-24)" in pages["readme"].read_text()
    capsys.readouterr()
    assert make_results.main(["--check"], results=results, placement=placement, **pages) == 1
    err = capsys.readouterr().err
    assert "headline records that name no commit, 2" in err
    assert "b/2026-11-23T100000Z-abc1234.json: commit not recorded, 2026-11-23" in err
    assert "a/2026-11-24T100000Z-abc1234-dirty.json: commit abc1234-dirty, 2026-11-24 (src/ or benchmarks/" in err
    assert "results/c/" not in err and len(err.splitlines()) == 3

    _result(results, "b", [{"ratio": 1.0}], commit=None, recorded_in="def5678")  # the same file, marked
    _result(results, "a", [{"ratio": 1.0}], stamp="2026-11-25T100000Z-abc1234")  # run again at a clean commit
    assert make_results.main([], results=results, placement=placement, **pages) == 0
    assert "(`b`, added in def5678, 2026-11-23; `a`, commit abc1234, 2026-11-25)" in pages["readme"].read_text()
    assert "2026-11-23; 2-core x86_64, no GPU; figures added to git in commit def5678" in pages["doc"].read_text()
    capsys.readouterr()
    assert make_results.main(["--check"], results=results, placement=placement, **pages) == 0
    assert "name no commit" not in capsys.readouterr().err


@pytest.mark.parametrize("fields", [{"commit": "abc1234", "recorded_in": "def5678"},
                                    {"commit": None, "recorded_in": "2026-11-28"}])
def test_recorded_in_beside_a_commit_or_not_a_commit_is_refused_naming_the_file(make_results, tmp_path, capsys,
                                                                                fields):
    results, pages = _paths(tmp_path, make_results)
    for name in ("a", "c"):
        _result(results, name, [{"method": "neuroshard", "ratio": 0.84}])
    _result(results, "b", [{"method": "neuroshard", "ratio": 0.84}], **fields)
    assert make_results.main(["--check"], results=results, placement=_placement(make_results), **pages) == 2
    err = capsys.readouterr().err
    assert "b/2026-11-23T100000Z-abc1234.json: recorded_in" in err and "whose commit is null" in err


#: a real_models record's rows as benchmarks/experiments/real_models.py writes them (two sets, three plans each)
_REAL_MODELS_ROWS = [{"set": name, "plan": plan, "session_1_ms": 1.0, "session_2_ms": 1.0, "ratio_to_torchrec": ratio,
                      "ratio_moved": moved, "mean_device_ratio": mean, "planning_s": seconds}
                     for name in ("dcnv2", "criteo_kaggle")
                     for plan, ratio, moved, mean, seconds in (("champion", 0.962, 0.012, 0.95, None),
                                                               ("dropin", 1.013, 0.008, 0.93, 12.31),
                                                               ("torchrec", 1.0, 0.0, 0.921, 1.12))]


def test_the_real_models_headline_reads_the_rows_its_experiment_writes_and_leads_readme_in_its_budget(make_results,
                                                                                                      tmp_path):
    source = (ROOT / "benchmarks" / "experiments" / "real_models.py").read_text()
    assert all(f'"{key}":' in source for key in _REAL_MODELS_ROWS[0]), "real_models.py's row keys changed"
    docs = {name: make_results.load_result(path) for name, path in make_results.newest_records().items()}
    docs["real_models"] = make_results.load_result(_result(tmp_path, "real_models", _REAL_MODELS_ROWS))
    headlines = make_results.recorded(make_results.PLACEMENT, list(docs)).headlines
    bullets = make_results.readme_bullets(headlines, docs)
    assert " ".join(bullets.split("\n- ")[0].split()) == (
        "- **Real models, slowest device / TorchRec's planner's**: DLRM-DCNv2 0.962x registered, 1.013x unrefined "
        "drop-in (12.31 s to plan, TorchRec 1.12 s; sessions moved 0.012, balanced 0.921x); Criteo Kaggle "
        "DLRM 0.962x registered, 1.013x unrefined drop-in (12.31 s to plan, TorchRec 1.12 s; sessions moved "
        "0.012, balanced 0.921x) (`real_models`, commit abc1234, 2026-11-23)")
    assert "torchrec_dropin" not in bullets  # its DCNv2 claim yields to the real models'
    assert len(make_results.with_bullets(README.read_text(), bullets).splitlines()) < 120  # test_docs' page budget

def test_check_fails_on_a_stale_page_and_writing_fixes_it(make_results, tmp_path):
    results, pages = _paths(tmp_path, make_results)
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
    assert "| NeuroShard against TorchRec | ratio 0.84 | [b](#title-of-b), commit abc1234, 2026-11-23 |" in page
    assert "- **NeuroShard against TorchRec**: ratio 0.84 (`b`, commit abc1234, 2026-11-23)" in pages["readme"].read_text()
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
    results, pages = _paths(tmp_path, make_results)
    for name in ("a", "b", "c", "new_study"):
        _result(results, name, [{"method": "neuroshard", "ratio": 0.84}])
    assert make_results.main([], results=results, placement=_placement(make_results), **pages) == 2
    assert "new_study" in capsys.readouterr().err and not pages["doc"].exists()


def test_a_record_placed_twice_or_a_headline_key_missing_is_refused(make_results, tmp_path, capsys):
    results, pages = _paths(tmp_path, make_results)
    for name in ("a", "b", "c"):
        _result(results, name, [{"method": "neuroshard", "speedup": 2.0}])
    twice = _placement(make_results, current=("a", "b", "c"))
    assert make_results.main([], results=results, placement=twice, **pages) == 2
    assert "placed more than once" in capsys.readouterr().err
    assert make_results.main([], results=results, placement=_placement(make_results), **pages) == 2
    assert "'b'" in (err := capsys.readouterr().err) and "'ratio'" in err  # the headline's key, named


def test_results_page_over_its_line_budget_is_refused(make_results, tmp_path, capsys, monkeypatch):
    results, pages = _paths(tmp_path, make_results)
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
