"""The local pipeline on the user's own tables and models (`--workload-tables`, `--production-tasks`, the `smoke`
preset on 2 devices): the cost model learns from tables exported from a TorchRec model, and two TorchRec models
exported with their planner context are each planned with the run's cost model, measured beside TorchRec's planner's
plan and registered as `shardwise-plan-<task>`; a second run registers a second version of each, and `@champion`
moves to it only where the gate measured it faster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

HANG_GUARD_S = 1800  # the smoke run takes about 3 minutes on 2 cores, the rerun less (its steps cached); a hang guard
TASKS = ("ranking", "ads")


def _shardwise(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the default store, shared by both runs and the checks
    return subprocess.run([sys.executable, "-m", "shardwise.cli", *argv], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env=env, cwd=cwd)


def _ebc(tables: int, rows: int, dims: tuple[int, ...], seed: int):  # noqa: ANN202 - (model, its constraints)
    """A model holding one EmbeddingBagCollection at `sparse.ebc`, with each table's pooling factor constrained."""
    import torch
    from torch import nn
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    g = torch.Generator().manual_seed(seed)
    model = nn.Module()
    model.sparse = nn.Module()
    model.sparse.ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dims[i % len(dims)],
                           num_embeddings=int(rows * (1 + torch.rand(1, generator=g).item() * 9)), feature_names=[f"f{i}"])
        for i in range(tables)], device=torch.device("meta"))
    constraints = {f"t{i}": ParameterConstraints(pooling_factors=[float(1 + int(torch.randint(1, 20, (1,), generator=g)))])
                   for i in range(tables)}
    return model, constraints


def _user_files(tmp: Path) -> None:
    """What a user exports: a catalogue model's 60 tables as the workload, two models as production tasks (a
    2-rank CPU topology each)."""
    from torchrec.distributed.planner.types import Topology

    from shardwise.integrations.torchrec import export_tables, export_task, save_production_task
    from shardwise.workload import save_tables

    catalogue, constraints = _ebc(60, 500, (16, 32, 64), seed=1)
    save_tables(export_tables(catalogue, constraints, batch_size=512, zipf_alpha={f"t{i}": 1.05 for i in range(60)}),
                tmp / "tables.json")
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=2**30)
    for name, tables, seed in (("ranking", 6, 2), ("ads", 4, 3)):
        model, constraints = _ebc(tables, 3000, (32, 64), seed)
        save_production_task(export_task(model, topology, constraints=constraints, name=name, batch_size=256),
                             tmp / f"{name}.task.json")


def _versions(tmp_path: Path, task: str) -> tuple[dict[str, dict[str, str]], str]:
    """Each registered version's tags by version, and the version @champion names, of `task`'s plans."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    name = f"shardwise-plan-{task}"
    versions = {str(v.version): dict(v.tags) for v in client.search_model_versions(f"name='{name}'")}
    return versions, str(client.get_model_version_by_alias(name, "champion").version)


@pytest.mark.timeout(2 * HANG_GUARD_S + 120)
def test_local_pipeline_learns_from_and_publishes_the_users_models(tmp_path, smoke_steps):
    _user_files(tmp_path)
    run = ("pipeline", "run", "--local", "--preset", "smoke", "--num-devices", "2", "--workload-tables", "tables.json",
           "--production-tasks", "ranking.task.json,ads.task.json", "--workdir", "runs/local")
    first = _shardwise(*run, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    steps = re.findall(r"^([\w-]+)\s+success\s+[\d.]+ s$", first.stdout, re.M)
    assert set(steps) >= smoke_steps | {"publish-plans"}, first.stdout
    assert "60 tables" in (tmp_path / "runs/local/logs/make-workload.log").read_text()
    # the local run's summary ends with the publish step's table: a version of each task, champion
    assert "production tasks planned, measured and registered (publish step):" in first.stdout
    for task in TASKS:
        assert re.search(rf"^{task}\s+[\d.]+\s+[\d.]+\s+-\s+-\s+shardwise-plan-{task} v1 @champion$", first.stdout,
                         re.M), first.stdout[-3000:]
        versions, champion = _versions(tmp_path, task)
        assert set(versions) == {"1"} and champion == "1"
        assert versions["1"]["gate.decision"] == "champion" and versions["1"]["gate.reason"] == "no champion yet"

    # the same run again (its profile and model from the step cache): each plan measured beside its champion
    second = _shardwise(*run, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    for task in TASKS:
        versions, champion = _versions(tmp_path, task)
        assert set(versions) == {"1", "2"}
        gate = versions["2"]
        assert gate["gate.champion_version"] == "1" and gate["gate.decision"] in ("champion", "challenger")
        faster = float(gate["gate.value"]) < float(gate["gate.champion_value"])
        # @champion moved only to a version the gate measured faster than the champion (beyond the noise it names)
        assert champion == ("2" if gate["gate.decision"] == "champion" else "1")
        assert faster or gate["gate.decision"] == "challenger", gate
        assert (" < " if gate["gate.decision"] == "champion" else " >= ") in gate["gate.reason"], gate
        assert re.search(rf"shardwise-plan-{task} v2 @{gate['gate.decision']}$", second.stdout, re.M), \
            second.stdout[-3000:]
