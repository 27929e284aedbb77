"""`MlflowPlanLoader` against a real `mlflow server` (conftest's `mlflow_registry`) when the plan cannot be had: the
registry down, a version that is not there, a version registered without torchrec_plan.json, and one whose
torchrec_plan.json is not JSON or not the format. Each reaches TorchRec's planner as one line, a `PlannerError` of
type `PLAN_LOADING_FAILED` naming the URI, within seconds; a whole version of the same task loads (the control)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from service_processes import free_port
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shardwise.integrations.mlflow import MlflowService
from shardwise.integrations.plan_registry import plan_name, register_plan, write_plan_files
from shardwise.integrations.torchrec import MlflowPlanLoader, ShardwiseEnumerator
from shardwise.integrations.torchrec.context import export_task, load_production_task, save_production_task
from shardwise.integrations.torchrec.production import plan_production_task

pytestmark = pytest.mark.integration

CPU = Topology(world_size=2, compute_device="cpu", ddr_cap=2**30)
BATCH = 256
#: what each broken version's torchrec_plan.json holds (None: the file left out)
BROKEN = {"none": None, "not-json": "{'format': 'shardwise.torchrec-plan/v1',", "not-the-format": json.dumps(
    {"format": "shardwise.torchrec-plan/v1", "context_hash": "x", "fingerprint": {}, "options": [{"fqn": 3}]})}


def _model() -> nn.Module:
    model = nn.Module()
    model.sparse = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=1000 * (i + 1), feature_names=[f"f{i}"])
        for i in range(3)], device=torch.device("meta"))
    return model


def _constraints() -> dict[str, ParameterConstraints]:
    return {f"t{i}": ParameterConstraints(pooling_factors=[1.0 + i]) for i in range(3)}


@pytest.fixture(scope="module")
def registered(mlflow_registry, tiny_cost_model, tmp_path_factory):
    """(server URL, task name, version by label): a whole version of a production task's plan, then one per BROKEN
    case, registered on the shared server under a task name of this module's own."""
    if mlflow_registry.proc is None:  # a fault test left it down
        mlflow_registry.start()
    root = tmp_path_factory.mktemp("loader-failures")
    task = f"loader-failures-{root.name.lower().replace('_', '-')}"
    path = save_production_task(export_task(_model(), CPU, name=task, constraints=_constraints(), batch_size=BATCH),
                                root / "task.json")
    planned = plan_production_task(load_production_task(path), tiny_cost_model[0], refine_s=0)
    whole = write_plan_files(root / "whole", planned.plan, path, {"plan_ms": 1.0},
                             planned.torchrec.model_dump(mode="json"))
    service = MlflowService(mlflow_registry.url)
    versions = {}
    for label, content in {"whole": "", **BROKEN}.items():
        files = whole
        if label != "whole":
            files = root / label
            shutil.copytree(whole, files)
            (files / "torchrec_plan.json").unlink()
            if content is not None:
                (files / "torchrec_plan.json").write_text(content)
        versions[label] = register_plan(service, task, files, measured_ms=1.0, champion_ms=lambda _: None,
                                        min_gain=0.0, tags={}, params={}, metrics={}).version
    return mlflow_registry.url, task, versions


def _plan(uri: str, tracking_uri: str):  # noqa: ANN202 - TorchRec's ShardingPlan
    enumerator = ShardwiseEnumerator(topology=CPU, batch_size=BATCH, constraints=_constraints())
    planner = EmbeddingShardingPlanner(topology=CPU, batch_size=BATCH, constraints=_constraints(),
                                       enumerator=enumerator,
                                       plan_loader=MlflowPlanLoader(uri, tracking_uri=tracking_uri,
                                                                    enumerator=enumerator))
    return planner.plan(_model(), [EmbeddingBagCollectionSharder()])


def _refused(uri: str, tracking_uri: str) -> str:
    """The one line TorchRec's planner raises for `uri`, checked to be the loader's PLAN_LOADING_FAILED, in seconds."""
    started = time.monotonic()
    with pytest.raises(PlannerError) as raised:
        _plan(uri, tracking_uri)
    seconds = time.monotonic() - started
    message = str(raised.value)
    assert raised.value.error_type == PlannerErrorType.PLAN_LOADING_FAILED, message
    assert message.startswith(f"{uri}: ") and message.count(uri) == 1, message
    assert "\n" not in message and "Traceback" not in message, message
    assert seconds < 30, seconds
    return message


def test_a_whole_registered_version_loads_as_registered(registered):
    url, task, versions = registered
    loaded = _plan(f"models:/{plan_name(task)}/{versions['whole']}", url)
    doc = json.loads((Path(MlflowPlanLoader(f"models:/{plan_name(task)}/{versions['whole']}",
                                            tracking_uri=url).registered.directory) / "torchrec_plan.json").read_text())
    assert {t: list(p.ranks) for t, p in loaded.plan["sparse"].items()} == {
        o["name"]: [s["rank"] for s in o["shards"]] for o in doc["options"]}


def test_a_registry_that_is_down_is_one_line(registered):
    _, task, _ = registered
    down = f"http://127.0.0.1:{free_port()}"
    message = _refused(f"models:/{plan_name(task)}@champion", down)
    assert "127.0.0.1" in message


def test_a_version_that_is_not_there_is_one_line(registered):
    url, task, versions = registered
    missing = str(max(int(v) for v in versions.values()) + 5)
    message = _refused(f"models:/{plan_name(task)}/{missing}", url)
    assert missing in message and "not found" in message and "shardwise publish --task" in message, message


def test_a_version_without_torchrecs_plan_is_one_line_naming_the_file(registered):
    url, task, versions = registered
    message = _refused(f"models:/{plan_name(task)}/{versions['none']}", url)
    assert "has no torchrec_plan.json" in message and "shardwise publish" in message


@pytest.mark.parametrize("label, words", [("not-json", "a file of the registered plan is not JSON"),
                                          ("not-the-format", "torchrec_plan.json: options.0.fqn: Input should be a valid string")])
def test_a_malformed_torchrec_plan_is_one_line_saying_what_is_wrong(registered, label, words):
    url, task, versions = registered
    message = _refused(f"models:/{plan_name(task)}/{versions[label]}", url)
    assert words in message and "shardwise" in message, message
