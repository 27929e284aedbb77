"""The local pipeline end to end (`shardwise pipeline run --local`, what `make run` does) with the `smoke`
preset: every step, fewer tables and shards, on 2 devices. Then what a user does next: plan their own task
with the model the run registered (no --model), read the report, plug the plan into TorchRec. The full
`make run` is timed by scripts/newcomer.py, not here: no test fails a correct run because the machine
is slow."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardwise.pipelines.params import preset
from shardwise.profiling import load_costs

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

HANG_GUARD_S = 1800  # the smoke run takes about 3 minutes on 2 cores; this only stops a hung run
#: smoke's devices halved: every gloo group (the all-to-all profile's, the evaluate step's session, DLRM's ranks) is
#: 2 processes, each importing torch, instead of 4; the steps and what they write are the same
NUM_DEVICES = 2


def _shardwise(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the default store, shared by the run and the next command
    return subprocess.run([sys.executable, "-m", "shardwise.cli", *argv], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env=env, cwd=cwd)


@pytest.mark.timeout(HANG_GUARD_S + 120)
def test_local_pipeline_then_the_next_commands(tmp_path, smoke_steps):
    result = _shardwise("pipeline", "run", "--local", "--preset", "smoke", "--num-devices", str(NUM_DEVICES),
                        "--workdir", "runs/local", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    out = result.stdout
    # a quiet console: one line per step with its time, then the summary; the libraries' logs are in the file
    steps = re.findall(r"^([\w-]+)\s+success\s+[\d.]+ s$", out, re.M)
    assert set(steps) == smoke_steps, out
    # the kernel profile fanned out over the preset's workers, each its slice, and pretrain read them all
    slices = sorted((tmp_path / "runs/local/pipeline_root").glob("*/for-loop-*-iteration-*/profile-costs/costs"))
    assert len(slices) == preset("smoke")["profile_workers"] == 2
    profiled = [load_costs(path)["config_id"] for path in slices]
    assert not set(profiled[0]) & set(profiled[1])  # no shard measured by both
    assert len(out.splitlines()) < 60 and "INFO" not in out
    assert (tmp_path / "runs/local/pipeline.log").stat().st_size > 10_000
    assert {p.stem for p in (tmp_path / "runs/local/logs").glob("*.log")} == set(steps)  # a log per step

    plan_path = Path(re.search(r"^plan \((.+)\):$", out, re.M).group(1))
    plan = json.loads(plan_path.read_text())
    assert plan["format"] == "shardwise.plan/v1" and plan["num_devices"] == NUM_DEVICES
    match = re.search(r"measured vs TorchRec's planner: ([\d.]+) ms vs ([\d.]+) ms .*ratio ([\d.]+)", out)
    assert match, out[-2000:]
    method_ms, torchrec_ms, ratio = map(float, match.groups())
    assert method_ms > 0 and torchrec_ms > 0 and ratio == pytest.approx(method_ms / torchrec_ms, rel=1e-2)
    # held-out tables profiled apart with their row blocks and dense kernels: the cost model's error on each
    assert re.search(r"^cost model on shards of held-out tables: MAPE [\d.]+%.*\n  their kernels as other sharding "
                     r"types, MAPE: row-wise \(row blocks\) [\d.]+%, data-parallel \(dense kernel line\) [\d.]+%"
                     r"( \(noise floor [\d.]+%\))?$",
                     out, re.M), out[-2000:]
    match = re.search(r"DLRM training throughput vs TorchRec's planner: ([\d,]+) vs ([\d,]+) samples/s", out)
    assert match, out[-2000:]

    # the report: self-contained (plots as data URIs, no local paths), both plans measured in one session
    report = Path(re.search(r"^report: (.+)$", out, re.M).group(1))
    page = report.read_text()
    assert "TorchRec" in page and "data:image/png;base64," in page and str(tmp_path) not in page
    assert report == tmp_path / "runs/local/report.html"
    (comparison_path,) = (tmp_path / "runs/local/pipeline_root").glob("*/evaluate-plans/evaluation/comparison.json")
    comparison = json.loads(comparison_path.read_text())
    assert comparison["format"] == "shardwise.comparison/v1"
    # refined on the evaluate step's machine (the preset's refine_rounds), measured in the same session
    assert [p["name"] for p in comparison["plans"]] == [plan["method"], "torchrec", f"{plan['method']}-refined"]
    assert re.search(r"^refined on this machine \(evaluate step\): [\d.]+ ms per iteration", out, re.M), out[-2000:]
    assert comparison["plans"][0]["max_cost_ms"] == pytest.approx(method_ms, rel=1e-3)

    # what the Kubeflow UI shows as Markdown: the plan's per-device table and the run's comparison
    run_dir = plan_path.parents[1]
    assert "device" in (run_dir / "search-plan/plan_table").read_text()
    summary = (run_dir / "evaluate-plans/summary").read_text()
    assert f"| ratio to TorchRec's planner (below 1 is better) | {ratio:.3f} |" in summary

    # the model artifact names the version the run registered; its MLflow run names no KFP run (a local run's id is
    # kfp.local's own, new with every rerun: in pre-training's cache key it would train and register again what a
    # killed run finished; the compiled pipeline passes Kubeflow's run id, test_pipeline_compile's golden file)
    (executor,) = (tmp_path / "runs/local/pipeline_root").glob("*/pretrain-cost-model/executor_output.json")
    (model,) = json.loads(executor.read_text())["artifacts"]["model"]["artifacts"]
    assert re.fullmatch(r"models:/shardwise-cost-[\w-]+/\d+", model["metadata"]["registered_model_uri"])
    from mlflow import MlflowClient

    tags = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(model["metadata"]["mlflow_run_id"]).data.tags
    assert "kfp.run_id" not in tags and tags  # tagged, but not with a run id

    # next: plan a task of one's own; `plan` without --model finds the model the run registered
    task = tmp_path / "my_task.json"
    made = _shardwise("workload", "task", "--tables", str(next((tmp_path / "runs/local").rglob("holdout_tables"))),
                      "--num-tables", "8", "--num-devices", "2", "--seed", "3", "--out", str(task), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    planned = _shardwise("plan", "--task", str(task), "--method", "neuroshard", "--out", "plan.json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["provenance"]["cost_model_uri"].startswith("models:/shardwise-cost-")
    assert (tmp_path / "mlflow.db").is_file()
    # README's next line: the same plan refined on this machine with the run's model, never measured slower
    refined = _shardwise("plan", "--task", str(task), "--method", "neuroshard", "--refine", "1", "--out",
                         "refined.json", cwd=tmp_path)
    assert refined.returncode == 0, refined.stderr
    record = json.loads((tmp_path / "refined.json").read_text())["refinement"]
    assert record["after_ms"] <= record["before_ms"] and set(record["starts"]) >= {"neuroshard", "measured_greedy"}

    # the run trained and registered both placement policies: they plan with no further step, and the summary
    # gave their plans' predicted cost beside the searched plan's
    match = re.search(r"^predicted plan cost on the task \(the cost model's ms per iteration\): (.+)$", out, re.M)
    assert match, out[-2000:]
    predicted = dict(item.split() for item in match.group(1).split(", "))
    assert list(predicted) == [plan["method"], "dreamshard", "autoshard"] and all(float(v) > 0 for v in predicted.values())
    for method in ("dreamshard", "autoshard"):
        planned = _shardwise("plan", "--task", str(task), "--method", method, "--out", f"{method}.json", cwd=tmp_path)
        assert planned.returncode == 0, planned.stderr
        assert json.loads((tmp_path / f"{method}.json").read_text())["method"] == method

    # next: the plan as TorchRec's ShardingPlan, ready for DistributedModelParallel
    from shardwise.integrations.torchrec import to_sharding_plan
    from shardwise.search import load_plan
    from shardwise.workload import load_task

    sharding = to_sharding_plan(load_plan(tmp_path / "plan.json"), load_task(task))
    (module_plan,) = sharding.plan.values()
    assert set(module_plan) == {t.name for t in load_task(task).tables}
