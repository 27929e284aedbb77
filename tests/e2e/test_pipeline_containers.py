"""The pipeline with every step in a container of the project's image (`shardwise pipeline run --local
--containers`), a production task among its inputs, as a cluster runs it: the image's code, a read-only root, no
network, only the run's folders and the MLflow store mounted, in $SHARDWISE_IMAGE, else the CPU image. Skipped where
no Docker engine answers or that image is not built (`make image-cpu`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardwise.pipelines.containers import CPU_IMAGE

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

#: the image every step runs in (`--image`), as tests/integration/test_image.py picks its image
IMAGE = os.environ.get("SHARDWISE_IMAGE", CPU_IMAGE)
HANG_GUARD_S = 1800  # the smoke run takes about 4 minutes in containers on 2 cores; this only stops a hung run


def _why_not() -> str | None:
    try:
        found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "no Docker engine answers"
    how = " (make image-cpu)" if IMAGE == CPU_IMAGE else ""
    return None if found.returncode == 0 else f"no Docker engine, or {IMAGE} not built{how}"


SKIP = _why_not()


def _shardwise(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the default store, shared by the run and the next command
    return subprocess.run([sys.executable, "-m", "shardwise.cli", *argv], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env=env, cwd=cwd)


def _production_task(path: Path) -> Path:
    """A ranking model's 4 tables exported on a 2-rank CPU topology, as a user exports it."""
    import torch
    from torch import nn
    from torchrec.distributed.planner.types import Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardwise.integrations.torchrec import export_task, save_production_task

    model = nn.Module()
    model.sparse = nn.Module()
    model.sparse.ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=32, num_embeddings=4000 * (i + 1), feature_names=[f"f{i}"])
        for i in range(4)], device=torch.device("meta"))
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_production_task(export_task(model, Topology(world_size=2, compute_device="cpu", ddr_cap=2**30),
                                            name="ranking", batch_size=256), path)


@pytest.mark.skipif(SKIP is not None, reason=str(SKIP))
@pytest.mark.timeout(HANG_GUARD_S + 120)
def test_every_step_runs_in_the_image_and_the_next_command_finds_the_model(tmp_path, smoke_steps):
    production = _production_task(tmp_path / "runs" / "ranking.task.json")  # a step sees only the work directory
    result = _shardwise("pipeline", "run", "--local", "--containers", "--preset", "smoke", "--num-devices", "2",
                        "--production-tasks", str(production), "--workdir", "runs", "--image", IMAGE, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    steps = re.findall(r"^([\w-]+)\s+success\s+[\d.]+ s$", result.stdout, re.M)
    assert set(steps) == smoke_steps | {"publish-plans"}, result.stdout
    # the publish step, in the image, planned the production task and registered its plan in the store
    assert re.search(r"^ranking\s+[\d.]+\s+[\d.]+\s+-\s+-\s+shardwise-plan-ranking v1 @champion$", result.stdout,
                     re.M), result.stdout[-3000:]
    log = (tmp_path / "runs/pipeline.log").read_text()
    # kfp.local's Docker runner found the image for every step (one line per container started)
    assert log.count(f"Found image '{IMAGE}'") >= len(set(steps)), log[-3000:]
    # nothing outside the folders mounted: the run's workdir and the store's folder (here the same place)
    assert {p.name for p in tmp_path.iterdir()} == {"runs", "mlflow.db"}
    # the steps ran as the caller: the files they left are the caller's
    made = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert made and {p.stat().st_uid for p in made} == {os.getuid()}

    task = next((tmp_path / "runs/pipeline_root").glob("*/make-task/task"))
    planned = _shardwise("plan", "--task", str(task), "--out", "plan.json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert "models:/shardwise-cost-" in (tmp_path / "plan.json").read_text()
