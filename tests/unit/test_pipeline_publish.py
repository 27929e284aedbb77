"""The publish step's component: objects in the object store are read from local copies, the cost model is the one
the plan step used, a task with more ranks than the step's GPUs is refused before any planning, and the job's result
lands in the step's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from shardwise.jobs import publish
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
    """The component's body with the job replaced: what the job got."""
    seen: dict[str, object] = {}

    def run(settings: publish.PublishSettings, **_: object) -> PublishResult:
        seen["settings"] = settings
        return PublishResult(tasks=[PublishedTask(
            task="ranking", registered_name="shardwise-plan-ranking", version="1", alias="champion",
            reason="no champion yet", plan_ms=1.0, torchrec_ms=1.2, champion_version=None, champion_ms=None,
            noise=None, directory=str(tmp_path / "out"))])

    monkeypatch.setattr(publish, "run", run)

    def call(tasks: str, *, device: str = "cuda", model_alias: str = "", refine_s: float = 0.0) -> dict[str, object]:
        outputs = {"published": _artifact(tmp_path / "published"), "summary": _artifact(tmp_path / "summary.md")}
        publish_plans.python_func(production_tasks=tasks, model=_artifact(tmp_path / "model"),
                                  model_alias=model_alias, hardware_kind="cuda-h100", device=device,
                                  num_devices=2, refine_s=refine_s, timing_rounds=3, seed=1, **outputs)
        return {**seen, **outputs}

    return call


def test_the_job_gets_the_tasks_the_runs_model_and_measurement(tmp_path, step):
    local = _task(tmp_path / "mine.task.json", devices=2)
    done = step(f"s3://bucket/tasks/ranking.task.json, {local}")
    settings = done["settings"]
    assert settings.task == ("s3://bucket/tasks/ranking.task.json", str(local))  # the job fetches objects
    assert settings.model == str(tmp_path / "model") and settings.out == str(tmp_path / "published")
    assert settings.refine_s == 0.0 and settings.seed == 1
    assert (settings.measurement.device, settings.measurement.timing_rounds) == ("cuda", 3)
    result = json.loads((tmp_path / "published/publish.json").read_text())
    assert result["tasks"][0]["registered_name"] == "shardwise-plan-ranking"
    assert done["published"].metadata["plans"] == "shardwise-plan-ranking/1"
    markdown = (tmp_path / "summary.md").read_text()
    # each task's plan against TorchRec's planner's leads, the table follows
    lead = markdown.index("- ranking: plan 1.000 ms vs TorchRec's planner 1.200 ms (ratio 0.833)")
    assert lead < markdown.index("| ranking | 1.000 | 1.200 | - | - | `shardwise-plan-ranking` v1 @champion |")
    assert step(str(local), model_alias="champion")["settings"].model == "models:/shardwise-cost-cuda-h100@champion"
    assert step(str(local), refine_s=600.0)["settings"].refine_s == 600.0  # the pipeline's publish_refine_s


def test_publish_refines_by_default_and_refine_s_zero_turns_it_off(tmp_path):
    task = str(_task(tmp_path / "t.json", devices=2))
    assert publish.PublishSettings(task=(task,)).refine_s > 0  # the production path refines unless told not to
    assert publish.PublishSettings(task=(task,), refine_s=0).refine_s == 0
    with pytest.raises(ValueError, match="refine_s"):
        publish.PublishSettings(task=(task,), refine_s=-1)


def test_the_job_copies_objects_and_refuses_more_ranks_than_gpus_before_planning(tmp_path, monkeypatch):
    """The job's first phase (the object store and the GPU count replaced): objects read from local copies in the
    output folder, a task with more ranks than this node's GPUs refused in one line naming it."""
    fetched: list[str] = []

    def fetch(uri: str, dest: Path, *, what: str) -> Path:
        fetched.append(f"{what}: {uri}")
        return _task(dest, devices=4)

    monkeypatch.setattr(publish, "fetch_object", fetch)
    copies = publish._local_copies(("s3://b/tasks/a.task.json", "s3://b/other/a.task.json", "x.json"), tmp_path)
    assert fetched == ["production task: s3://b/tasks/a.task.json", "production task: s3://b/other/a.task.json"]
    assert copies[2] == "x.json" and len({Path(c).parent for c in copies[:2]}) == 2
    assert all(Path(c).is_relative_to(tmp_path) for c in copies[:2])
    wide = SimpleNamespace(task=SimpleNamespace(num_devices=4))
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    with pytest.raises(publish.SettingsError, match=r"production task s3://b/t.json: 4 ranks, more than the 2 GPUs"):
        publish._check_ranks(["s3://b/t.json"], [wide], "cuda")
    publish._check_ranks(["s3://b/t.json"], [wide], "cpu")  # processes on a CPU: any count
