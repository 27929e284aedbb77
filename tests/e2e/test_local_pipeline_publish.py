"""The local pipeline with a production task (`--production-tasks`, the `smoke` preset on 2 devices): a TorchRec
model exported with its planner context is planned with the run's cost model, measured beside TorchRec's planner's
plan and registered as `shardwise-plan-<task>`; a second run registers a second version, and `@champion` moves to
it only where the gate measured it faster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

HANG_GUARD_S = 1800  # the smoke run takes about 3 minutes on 2 cores, the rerun less (its steps cached); a hang guard
PLAN_NAME = "shardwise-plan-ranking"


def _shardwise(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the default store, shared by both runs and the checks
    return subprocess.run([sys.executable, "-m", "shardwise.cli", *argv], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env=env, cwd=cwd)


def _production_task(path: Path) -> Path:
    """A ranking model's 6 tables on a 2-rank CPU topology, as a user exports it."""
    import torch
    from torch import nn
    from torchrec.distributed.planner.types import Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardwise.integrations.torchrec.context import export_task, save_production_task

    model = nn.Module()
    model.sparse = nn.Module()
    model.sparse.ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=32, num_embeddings=5000 * (i + 1), feature_names=[f"f{i}"])
        for i in range(6)], device=torch.device("meta"))
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=2**30)
    return save_production_task(export_task(model, topology, name="ranking", batch_size=256), path)


def _versions(tmp_path: Path) -> tuple[dict[str, dict[str, str]], str]:
    """Each registered version's tags by version, and the version @champion names."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    versions = {str(v.version): dict(v.tags) for v in client.search_model_versions(f"name='{PLAN_NAME}'")}
    return versions, str(client.get_model_version_by_alias(PLAN_NAME, "champion").version)


@pytest.mark.timeout(2 * HANG_GUARD_S + 120)
def test_local_pipeline_publishes_a_production_task_and_gates_its_champion(tmp_path, smoke_steps):
    _production_task(tmp_path / "ranking.task.json")
    run = ("pipeline", "run", "--local", "--preset", "smoke", "--num-devices", "2",
           "--production-tasks", "ranking.task.json", "--workdir", "runs/local")
    first = _shardwise(*run, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    steps = re.findall(r"^([\w-]+)\s+success\s+[\d.]+ s$", first.stdout, re.M)
    assert set(steps) >= smoke_steps | {"publish-plans"}, first.stdout
    # the local run's summary ends with the publish step's table
    assert "production tasks planned, measured and registered (publish step):" in first.stdout
    assert re.search(rf"^ranking\s+[\d.]+\s+[\d.]+\s+-\s+-\s+{PLAN_NAME} v1 @champion$", first.stdout, re.M), \
        first.stdout[-3000:]
    versions, champion = _versions(tmp_path)
    assert set(versions) == {"1"} and champion == "1"
    assert versions["1"]["gate.decision"] == "champion" and versions["1"]["gate.reason"] == "no champion yet"

    # the same run again (its profile and model from the step cache): the plan measured beside the champion
    second = _shardwise(*run, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    versions, champion = _versions(tmp_path)
    assert set(versions) == {"1", "2"}
    gate = versions["2"]
    assert gate["gate.champion_version"] == "1" and gate["gate.decision"] in ("champion", "challenger")
    faster = float(gate["gate.value"]) < float(gate["gate.champion_value"])
    # @champion moved only to a version the gate measured faster than the champion (beyond the noise it names)
    assert champion == ("2" if gate["gate.decision"] == "champion" else "1")
    assert faster or gate["gate.decision"] == "challenger", gate
    assert (" < " if gate["gate.decision"] == "champion" else " >= ") in gate["gate.reason"], gate
    assert re.search(rf"{PLAN_NAME} v2 @{gate['gate.decision']}$", second.stdout, re.M), second.stdout[-3000:]
