"""The local pipeline end to end (`shardwise pipeline run --local`, what `make run` does), on CPU, < 10 min."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardwise.cli import build_parser
from shardwise.pipelines.params import preset

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

# every verb a pipeline step calls (see src/shardwise/pipelines/components.py)
STEP_VERBS = ("workload", "augment", "profile", "pretrain", "plan", "evaluate")
BUDGET_S = 600.0


def _missing_verbs() -> list[str]:
    parser = build_parser("all")
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [verb for verb in STEP_VERBS if verb not in subparsers.choices]


@pytest.mark.skipif(bool(_missing_verbs()), reason=f"pipeline steps not implemented yet: {_missing_verbs()}")
@pytest.mark.timeout(BUDGET_S + 60)
def test_local_pipeline_end_to_end(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the run's own sqlite store under the workdir
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "shardwise.cli", "pipeline", "run", "--local", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=BUDGET_S + 30, env=env, cwd=tmp_path,
    )
    elapsed_s = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert elapsed_s < BUDGET_S, f"local pipeline took {elapsed_s:.0f} s (budget {BUDGET_S:.0f} s)"

    out = result.stdout
    plan_path = Path(re.search(r"^plan \((.+)\):$", out, re.M).group(1))
    plan = json.loads(plan_path.read_text())
    assert plan["format"] == "shardwise.plan/v1" and plan["num_devices"] == preset("local")["num_devices"]
    report = Path(re.search(r"^report: (.+)$", out, re.M).group(1))
    assert report.is_file() and "TorchRec" in report.read_text()
    match = re.search(r"measured vs TorchRec's planner: ([\d.]+) ms vs ([\d.]+) ms .*ratio ([\d.]+)", out)
    assert match, out[-2000:]
    method_ms, torchrec_ms, ratio = map(float, match.groups())
    assert method_ms > 0 and torchrec_ms > 0
    assert ratio == pytest.approx(method_ms / torchrec_ms, rel=1e-2)
    # both plans were measured in one `shardwise evaluate` session: one comparison document holds both
    comparison = json.loads((report.parent / "evaluation" / "comparison.json").read_text())
    assert comparison["format"] == "shardwise.comparison/v1"
    assert [p["name"] for p in comparison["plans"]] == [plan["method"], "torchrec"]
    assert comparison["plans"][0]["max_cost_ms"] == pytest.approx(method_ms, rel=1e-3)
    # end-to-end DLRM training under both plans, in the same run
    match = re.search(r"DLRM training throughput vs TorchRec's planner: ([\d,]+) vs ([\d,]+) samples/s .*ratio ([\d.]+)", out)
    assert match, out[-2000:]
    method_sps, torchrec_sps, thru_ratio = (float(g.replace(",", "")) for g in match.groups())
    assert method_sps > 0 and torchrec_sps > 0
    assert thru_ratio == pytest.approx(method_sps / torchrec_sps, rel=1e-2)
    # the embedded MLflow store holds the registered cost model
    assert (tmp_path / "mlflow.db").is_file()
