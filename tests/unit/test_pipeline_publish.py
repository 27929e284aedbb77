"""The publish step's component: objects in the object store are read from local copies, the cost model is the one
the plan step used, a task with more ranks than the step's GPUs is refused before any planning, and the job's result
lands in the step's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from shardwise.jobs import publish, workload
from shardwise.jobs.publish import PublishedTask, PublishResult
from shardwise.pipelines.components import publish_plans
from shardwise.workload import ShardingTask, TableSpec, save_task


def _task(path: Path, devices: int) -> Path:
    table = TableSpec(name="t0", rows=1000, dim=16, pooling_factor=2.0)
    return save_task(ShardingTask(num_devices=devices, device_memory_bytes=2**30, batch_size=512, tables=(table,)),
                     path)


def _artifact(path: Path) -> SimpleNamespace:
    return SimpleNamespace(path=str(path), metadata={})


@pytest.fixture
def step(tmp_path, monkeypatch):
    """The component's body with the object store and the job replaced: what it fetched and what the job got."""
    seen: dict[str, object] = {"fetched": []}

    def fetch(uri: str, dest: Path) -> Path:
        seen["fetched"].append(uri)  # type: ignore[union-attr]
        return _task(dest, devices=2)

    def run(settings: publish.PublishSettings, **_: object) -> PublishResult:
        seen["settings"] = settings
        seen["readable"] = [Path(t).is_file() for t in settings.task]  # the copies live while the job runs
        return PublishResult(tasks=[PublishedTask(
            task="ranking", registered_name="shardwise-plan-ranking", version="1", alias="champion",
            reason="no champion yet", plan_ms=1.0, torchrec_ms=1.2, champion_version=None, champion_ms=None,
            noise=None, directory=str(tmp_path / "out"))])

    monkeypatch.setattr(workload, "_fetch", fetch)
    monkeypatch.setattr(publish, "run", run)

    def call(tasks: str, *, device: str = "cuda", num_devices: int = 2, model_alias: str = "") -> dict[str, object]:
        outputs = {"published": _artifact(tmp_path / "published"), "summary": _artifact(tmp_path / "summary.md")}
        publish_plans.python_func(production_tasks=tasks, model=_artifact(tmp_path / "model"),
                                  model_alias=model_alias, hardware_kind="cuda-h100", device=device,
                                  num_devices=num_devices, refine_rounds=0, timing_rounds=3, seed=1, **outputs)
        return {**seen, **outputs}

    return call


def test_objects_are_fetched_and_the_job_gets_the_runs_model_and_measurement(tmp_path, step):
    local = _task(tmp_path / "mine.task.json", devices=2)
    done = step(f"s3://bucket/tasks/ranking.task.json,{local}")
    settings = done["settings"]
    assert done["fetched"] == ["s3://bucket/tasks/ranking.task.json"] and done["readable"] == [True, True]
    assert Path(settings.task[0]).name == "ranking.task.json" and settings.task[1] == str(local)
    assert settings.model == str(tmp_path / "model") and settings.out == str(tmp_path / "published")
    assert settings.refine_s == 0.0 and settings.seed == 1  # refine_rounds 0: no refinement
    assert (settings.measurement.device, settings.measurement.timing_rounds) == ("cuda", 3)
    result = json.loads((tmp_path / "published/publish.json").read_text())
    assert result["tasks"][0]["registered_name"] == "shardwise-plan-ranking"
    assert done["published"].metadata["plans"] == "shardwise-plan-ranking/1"
    assert "shardwise-plan-ranking v1 @champion" in (tmp_path / "summary.md").read_text()
    assert step(str(local), model_alias="champion")["settings"].model == "models:/shardwise-cost-cuda-h100@champion"


def test_a_task_with_more_ranks_than_the_steps_gpus_is_refused_before_planning(tmp_path, step):
    wide = _task(tmp_path / "wide.task.json", devices=4)
    with pytest.raises(ValueError, match=r"production task .*wide.task.json: 4 ranks, more than the 2 GPUs"):
        step(str(wide))
    assert step(str(wide), device="cpu")["settings"].task == (str(wide),)  # processes on a CPU: any count
