"""`shardwise benchmark` end to end on real kernels: a method registered once is benchmarked by name next to a
baseline, and the run is logged to MLflow (a metric per task set x method x figure, the report as artifacts)."""

from __future__ import annotations

import json

import pytest
from comm_doubles import fixed_all_to_all
from timing_settings import FLUSH_MIB

from shardwise.cli import main
from shardwise.integrations.mlflow import MlflowService
from shardwise.workload import TableSpec, save_tables
from shardwise.workload.tableset import TableSet

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = ["--warmup-iters", "1", "--timing-iters", "2", "--timing-rounds", "1", "--flush-mib", str(FLUSH_MIB), "--comm-iters", "2",
        "--comm-rounds", "1", "--device", "cpu"]


def test_a_registered_method_is_benchmarked_and_the_run_logged(round_robin, tmp_path, monkeypatch, capsys):
    pool = TableSet(batch_size=256, tables=tuple(
        TableSpec(name=f"t{i}", rows=500 * (1 + i % 3), dim=(8, 16)[i % 2], pooling_factor=1.0 + i % 4,
                  zipf_alpha=1.05)
        for i in range(30)
    ))
    tables = save_tables(pool, tmp_path / "holdout.json")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    # what is checked is the method by name and the run's log: the all-to-all at fixed figures (comm_doubles;
    # 8 gloo ranks for the 8-device set took most of this test's 42 s)
    monkeypatch.setattr("shardwise.evaluation.measured.measure_all_to_all_many", fixed_all_to_all)
    status = main(["benchmark", "--tables", str(tables), "--methods", "round_robin,size_greedy", "--task-sets",
                   "small", "--num-tasks", "1", "--out", str(tmp_path / "bench"), "--tracking-uri", store, *FAST])
    out = capsys.readouterr().out
    assert status == 0, out
    summary = json.loads((tmp_path / "bench" / "results.json").read_text())["summary"]
    assert {(r["task_set"], r["method"]) for r in summary} == {
        (s, m) for s in ("4dev-6to10", "8dev-16to24") for m in ("round_robin", "size_greedy")
    }
    run_id = out.strip().splitlines()[-1].split()[-1]
    # the store is named by its run id only: a tracking URI (credentials and all, elsewhere) is never printed
    assert out.strip().splitlines()[-1] == f"mlflow run {run_id}" and str(tmp_path / "mlflow.db") not in out
    run = MlflowService(store)._client().get_run(run_id)
    assert run.data.metrics["4dev-6to10.round_robin.mean_cost_ms"] > 0
    assert run.data.params["methods"] == "round_robin,size_greedy"
