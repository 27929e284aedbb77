"""The benchmarks' harness (benchmarks/harness.py): experiments registered by name with flags made from their
settings, suites whose runs are commands that parse, records written as new files that name their commit and cost
model, and experiments that import no other experiment."""

from __future__ import annotations

import ast
import json
import shlex
import sys
from pathlib import Path

import pytest
from pydantic import Field

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package, beside src/

from benchmarks import harness, record  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    BenchmarkError,
    Experiment,
    ExperimentSettings,
    Outcome,
    SuiteRun,
)

EXPERIMENTS = ROOT / "benchmarks" / "experiments"


class ToySettings(ExperimentSettings):
    """Settings of a toy experiment."""

    count: int = Field(default=2, ge=1, description="rows to return")
    names: tuple[str, ...] | None = Field(default=None, json_schema_extra={"sep": ","})
    broken: bool = False


def _toy_run(settings: ToySettings, context: harness.Context) -> Outcome:
    rows = [{"i": i, "name": (settings.names or ("x",))[0]} for i in range(settings.count)]
    context.name_model("toy model")  # a model the run made: named as a loaded one is
    return Outcome(rows, notes=[f"{settings.count} rows"], failed="it broke" if settings.broken else None)


@pytest.fixture
def toy(monkeypatch, tmp_path):
    """A registered toy experiment (the registry restored after)."""
    harness.load_experiments()
    monkeypatch.setattr(harness, "_EXPERIMENTS", dict(harness._EXPERIMENTS))
    experiment = harness.register(Experiment(
        name="toy", title="A toy", settings=ToySettings, run=_toy_run,
        suites={"quick": (SuiteRun({"count": 3, "names": ("a", "b")}),)}))
    return experiment


def test_an_experiment_runs_by_name_with_flags_from_its_settings_and_records_a_new_file_naming_its_makers(toy, tmp_path, monkeypatch,
                                                                                      capsys):
    written = []
    real = record.record
    monkeypatch.setattr(record, "record", lambda *a, **k: written.append(real(*a, **{**k, "directory": tmp_path})))
    assert harness.main(["toy", "--count", "3", "--names", "p,q", "--record"]) == 0
    assert harness.main(["toy", "--count", "1", "--record"]) == 0
    out = capsys.readouterr().out
    assert "| i | name |" in out and "| 2 | p |" in out and "3 rows" in out  # one renderer: the Markdown table
    assert len(written) == 2 and written[0] != written[1] and all(p.parent == tmp_path / "toy" for p in written)
    first = json.loads(written[0].read_text())
    assert first["command"] == "python -m benchmarks toy --count 3 --names p,q --record"
    assert first["format"] == record.FORMAT and first["experiment"] == "toy"
    assert first["commit"] and first["model"] == "toy model" and first["machine"]  # what made the figures
    assert record.newest_records(tmp_path) == {"toy": written[1]}


def test_a_bad_flag_value_is_one_line_naming_the_flag(toy, capsys):
    assert harness.main(["toy", "--count", "0"]) == 2
    assert "--count 0" in capsys.readouterr().err


def test_a_run_that_finds_what_it_checks_broken_exits_1(toy):
    assert harness.main(["toy", "--broken"]) == 1


def test_a_suite_runs_each_of_its_runs_as_the_command_it_records(toy, monkeypatch, capsys):
    monkeypatch.setattr(harness, "suite", lambda name: [toy])
    assert harness.run_suite("quick") == 0
    out = capsys.readouterr().out
    assert "$ python -m benchmarks toy --count 3 --names a,b" in out and "1 of 1 passed" in out


def test_an_experiment_with_a_suite_or_settings_it_does_not_have_is_refused():
    with pytest.raises(BenchmarkError, match="no suite 'nightly'"):
        Experiment(name="bad", title="t", settings=ToySettings, run=_toy_run, suites={"nightly": (SuiteRun(),)})
    with pytest.raises(BenchmarkError, match="--count"):
        Experiment(name="bad", title="t", settings=ToySettings, run=_toy_run,
                   suites={"quick": (SuiteRun({"count": 0}),)})
    with pytest.raises(BenchmarkError, match="registered twice"):
        harness.register(Experiment(name="plan_quality", title="t", settings=ToySettings, run=_toy_run))


def test_an_unknown_experiment_is_named_with_the_known_ones():
    with pytest.raises(BenchmarkError, match="plan_quality"):
        harness.get("plan_qualty")


@pytest.mark.parametrize("name", harness.names())
def test_every_suite_run_of_every_experiment_is_a_command_that_parses_to_its_settings(name):
    experiment = harness.get(name)
    parser = harness.build_parser()
    for suite, runs in experiment.suites.items():
        for one in runs:
            words = shlex.split(harness.suite_command(experiment, one, record=True))[3:]
            args = parser.parse_args(words)
            settings = harness.build_settings(experiment.settings, args)
            assert settings == experiment.settings.model_validate(dict(one.settings)), (suite, words)
            assert args.record and args.record_name == one.record_name


def test_the_quick_suite_needs_no_cost_model():
    for experiment in harness.suite("quick"):
        for one in experiment.suites["quick"]:
            assert not one.settings.get("model"), f"{experiment.name}: the quick suite runs on a fresh clone"


def test_no_experiment_imports_another():
    modules = {p.stem for p in EXPERIMENTS.glob("*.py") if p.stem != "__init__"}
    for path in sorted(EXPERIMENTS.glob("*.py")):
        if path.stem == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for imported in names:
                parts = imported.split(".")
                assert not (parts[:2] == ["benchmarks", "experiments"] or (node.level if isinstance(
                    node, ast.ImportFrom) else 0) or parts[0] in modules or parts[0].startswith("bench_")), \
                    f"{path.name} imports {imported}: experiments share code through the harness or shardwise"


def test_records_of_one_second_keep_their_order(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    for stem in ("2026-11-29T100000Z-abc1234-2", "2026-11-29T100000Z-abc1234", "2026-11-28-no-commit",
                 "2026-11-29T100000Z-abc1234-10"):
        (folder / f"{stem}.json").write_text("{}")
    (folder / "tasks-00000-00249.json").write_text("{}")  # a study's piece, not a record
    assert [p.stem for p in record.record_files(folder)] == [
        "2026-11-28-no-commit", "2026-11-29T100000Z-abc1234", "2026-11-29T100000Z-abc1234-2",
        "2026-11-29T100000Z-abc1234-10"]


def test_a_record_of_another_checkout_names_that_checkouts_commit(tmp_path):
    """scripts/newcomer.py times a clone while this repository may move on: the record names the clone's commit."""
    import subprocess

    clone = tmp_path / "clone"
    clone.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(clone)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                         text=True).stdout.strip()
    path = record.record("x", "t", [{"a": 1}], command="c", directory=tmp_path / "results", code=clone)
    assert json.loads(path.read_text())["commit"] == sha and path.stem.endswith(sha)


def test_the_faults_experiment_runs_every_scenario_fault_injection_defines(monkeypatch):
    """A scenario added to tests/unit/fault_injection.py is run and recorded without editing the experiment."""
    import types

    from benchmarks.experiments import faults

    found = faults.scenarios()
    assert {"profile_store_stopped", "registration_server_killed", "concurrent_registration",
            "pipeline_killed"} <= set(found)
    assert list(found) == sorted(found, key=lambda name: found[name].__code__.co_firstlineno)  # the module's order
    added = types.ModuleType("fault_injection")
    exec("from __future__ import annotations\n"
         "class FaultOutcome:\n    pass\n"
         "def _helper(tmp) -> FaultOutcome: ...\n"
         "def not_a_scenario(path) -> FaultOutcome: ...\n"
         "def new_fault(tmp, *, delay_s: float = 0.5) -> FaultOutcome:\n    return FaultOutcome()\n",
         added.__dict__)
    monkeypatch.setattr(faults.harness, "test_helpers", lambda name: added)
    assert list(faults.scenarios()) == ["new_fault"]
    assert isinstance(faults.one_try("new_fault", added.new_fault, ROOT, 0), added.FaultOutcome)  # its defaults


def test_plan_quality_and_shardwise_benchmark_plan_with_one_default_method_list():
    import inspect

    from benchmarks.experiments import plan_quality

    source = inspect.getsource(plan_quality)
    assert "from shardwise.jobs.benchmark import default_methods" in source
    assert "def default_methods" not in source


def test_an_experiment_refusing_its_input_says_so_in_one_line_naming_the_flag(capsys):
    assert harness.main(["planning_time", "--sizes", "100by8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --sizes 100by8: ") and "TABLESxDEVICES" in err and len(err.strip().splitlines()) == 1


def test_benchmarks_stay_within_their_line_budget():
    """An experiment whose question is answered retires to the archive with its decision instead of piling up."""
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "benchmarks").rglob("*.py"))
    assert lines <= 3500, f"benchmarks/ has {lines} lines of Python, over 3,500: retire an answered experiment"
