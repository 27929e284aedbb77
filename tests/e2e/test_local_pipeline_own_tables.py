"""The local pipeline on the user's own tables (`--workload-tables`, the `smoke` preset on 2 devices): a DLRM dataset
file goes through every step as synthetic tables do, and the workload step's tables are the file's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardwise.workload import load_tables, read_dlrm_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

HANG_GUARD_S = 1800  # the smoke run takes about 3 minutes on 2 cores; this only stops a hung run


def _shardwise(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "shardwise.cli", *argv], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env=env, cwd=cwd)


@pytest.mark.timeout(HANG_GUARD_S + 120)
def test_local_pipeline_on_a_dlrm_dataset_file(tmp_path, smoke_steps):
    # the user's file: 60 tables' index data at the smoke batch (drawn here, as any dataset file would be made)
    made = _shardwise("workload", "synth", "--num-tables", "60", "--row-scale", "0.001", "--batch-size", "512",
                      "--seed", "7", "--out", "mine", cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    result = _shardwise("pipeline", "run", "--local", "--preset", "smoke", "--num-devices", "2",
                        "--workload-tables", "mine/indices.pt", "--workdir", "runs/local", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    steps = re.findall(r"^([\w-]+)\s+success\s+[\d.]+ s$", result.stdout, re.M)
    assert set(steps) == smoke_steps, result.stdout

    (workload,) = (tmp_path / "runs/local/pipeline_root").glob("*/make-workload/workload")
    tables = load_tables(workload / "tables.json")
    given = read_dlrm_dataset(tmp_path / "mine/indices.pt").tables
    assert [(t.name, t.rows, t.pooling_factor) for t in tables.tables] == [
        (t.name, t.rows, t.pooling_factor) for t in given.tables]
    assert tables.batch_size == 512 and (workload / "indices.pt").exists()
    assert "60 tables from the DLRM dataset" in (tmp_path / "runs/local/logs/make-workload.log").read_text()
