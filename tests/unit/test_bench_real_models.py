"""The real_models experiment (benchmarks/experiments/real_models.py): its registration and settings, the user's
export it makes, the pipeline command it runs, the record a smoke run writes, and (slow) one set end to end on the
smoke preset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package, beside src/

from benchmarks import harness  # noqa: E402
from benchmarks.experiments import real_models  # noqa: E402


def _settings(**values) -> real_models.RealModelsSettings:  # noqa: ANN003 - settings fields
    return real_models.RealModelsSettings(**values)


def test_real_models_is_registered_with_both_sets_the_local_preset_and_a_claims_run(capsys):
    experiment = harness.get("real_models")
    settings = experiment.settings()
    assert (settings.sets, settings.preset, settings.devices, settings.row_scale) == (
        ("dcnv2", "criteo_kaggle"), "local", 4, 0.001)
    assert settings.publish_refine_s is None and settings.timing_rounds is None  # the preset's and measurement's own
    assert "claims" in experiment.suites and "quick" not in experiment.suites  # a pipeline run per set: not minutes
    assert harness.main(["real_models", "--sets", "dcnv2,criteo", "--workdir", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --sets criteo:") and "dcnv2|criteo_kaggle" in err and err.count("\n") == 1


@pytest.mark.parametrize("name", ["dcnv2", "criteo_kaggle"])
def test_each_set_exports_a_production_task_torchrecs_planner_finds_a_plan_for(name, tmp_path):
    from shardwise.integrations.torchrec import load_production_task
    from shardwise.integrations.torchrec.production import torchrec_planner_plan
    from shardwise.search import validate_plan
    from shardwise.workload import criteo_kaggle_tables, load_tables, mlperf_dcnv2_tables, shard_memory_bytes

    _, _, production, path = real_models.export(name, _settings(), tmp_path)
    task = load_production_task(path).task
    expected = mlperf_dcnv2_tables(0.001) if name == "dcnv2" else criteo_kaggle_tables(0.001, 128)
    assert [(t.name, t.rows, t.dim, t.pooling_factor) for t in task.tables] == [
        (t.name, t.rows, t.dim, t.pooling_factor) for t in expected]
    assert (task.num_devices, task.batch_size) == (4, 4 * 512)
    assert task.device_memory_bytes == int(2.0 * shard_memory_bytes(expected, 2048) / 4)
    assert [t.rows for t in load_tables(tmp_path / "tables.json").tables] == [t.rows for t in expected]
    # with no storage reservation TorchRec's planner places every table (with its default 15% it found no DCNv2 plan
    # at 1.5x), within the memory shardwise counts, so that the publish step and the sessions measure its plan
    plan = torchrec_planner_plan(production)
    assert {s.table for s in plan.shards} | set(plan.row_wise) | set(plan.data_parallel) == {t.name for t in expected}
    validate_plan(plan, task)


def test_the_pipeline_runs_on_the_exported_files_in_the_sets_own_store_and_fails_in_one_line(tmp_path, monkeypatch):
    calls = []

    def fake_run(argv, stdout, **kwargs):  # noqa: ANN001, ANN003, ANN202 - subprocess.run's
        calls.append((argv, kwargs["env"]))
        stdout.write("step log\nerror: production_tasks 'x': the publish step did not run\n")
        return subprocess.CompletedProcess(argv, 1 if len(calls) == 2 else 0)

    monkeypatch.setattr(real_models.subprocess, "run", fake_run)
    store, task = "sqlite:///s/mlflow.db", tmp_path / "m.task.json"
    assert real_models.pipeline("m", _settings(preset="smoke"), tmp_path, store, task) >= 0
    argv, env = calls[0]
    assert argv[0].endswith("shardwise") and argv[1:4] == ["pipeline", "run", "--local"]
    flags = dict(zip(argv[4::2], argv[5::2]))
    assert flags == {"--workdir": str(tmp_path / "pipeline"), "--tracking-uri": store, "--preset": "smoke",
                     "--workload-tables": str(tmp_path / "tables.json"), "--production-tasks": str(task),
                     "--task-num-tables": "4", "--num-devices": "4"}
    assert env["MLFLOW_TRACKING_URI"] == store  # never the user's ./mlflow.db
    with pytest.raises(harness.BenchmarkError) as raised:
        real_models.pipeline("m", _settings(publish_refine_s=30.0), tmp_path, store, task)
    assert calls[1][0][-2:] == ["--publish-refine-s", "30"]
    message = str(raised.value)
    assert message.startswith("m: the pipeline failed: error: production_tasks 'x'") and "\n" not in message
    assert str(tmp_path / "pipeline-run.log") in message


def test_a_smoke_run_records_under_its_own_name_and_a_local_run_under_the_experiments(monkeypatch):
    monkeypatch.setattr(real_models, "one_set", lambda name, settings, context: (
        [{"set": name, "plan": "torchrec", "ratio_to_torchrec": 1.0}], f"{name}: note"))
    smoke = real_models.run(_settings(preset="smoke"), harness.Context())
    assert smoke.record_name == "real_models_smoke" and "smoke" in (smoke.title or "")
    assert [r["set"] for r in smoke.rows] == ["dcnv2", "criteo_kaggle"] and smoke.notes[:2] == ["dcnv2: note",
                                                                                                 "criteo_kaggle: note"]
    local = real_models.run(_settings(sets=("criteo_kaggle",)), harness.Context())
    assert local.record_name is None and local.title is None and len(local.rows) == 1


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_one_set_through_the_smoke_pipeline_is_registered_planned_and_measured_twice(tmp_path):
    experiment = harness.get("real_models")
    outcome = harness.run(experiment, _settings(sets=("criteo_kaggle",), preset="smoke", timing_rounds=1,
                                                workdir=str(tmp_path)))
    rows = {row["plan"]: row for row in outcome.rows}
    assert list(rows) == ["champion", "dropin", "torchrec"]
    assert rows["torchrec"]["ratio_to_torchrec"] == 1.0 and rows["torchrec"]["ratio_moved"] == 0.0
    for row in rows.values():
        assert row["session_1_ms"] > 0 and row["session_2_ms"] > 0 and row["ratio_to_torchrec"] > 0
    assert rows["champion"]["planning_s"] is None and rows["dropin"]["planning_s"] > 0
    assert rows["torchrec"]["planning_s"] > 0
    note = outcome.notes[0]
    assert "shardwise-plan-criteo_kaggle v1 registered, champion v1" in note, note
    assert "neural_heldout_tables_total_mape_pct" in note and "--preset smoke" in note and "fwd" not in note
    assert outcome.record_name == "real_models_smoke"
    assert (tmp_path / "smoke" / "criteo_kaggle" / "mlflow.db").is_file()  # the experiment's own store
