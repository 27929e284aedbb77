"""Production tasks and the plan registry: a model's TorchRec planner context exported and rebuilt (the context hash
survives the trip), the plan the drop-in makes of it loaded back through TorchRec's `PlanLoader` by TorchRec's
planner and by the drop-in, a changed model refused in one line naming the change, and `shardwise publish`'s gate
on scripted measurements against a real MLflow store."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, PlannerErrorType, Topology
from torchrec.distributed.types import CacheParams
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.optim import RowWiseAdagrad

from shardwise.evaluation import MeasuredPlanCost
from shardwise.evaluation.measured_records import DeviceCost
from shardwise.integrations.plan_registry import write_plan_files
from shardwise.integrations.torchrec import ShardwiseEnumerator, ShardwisePlanner
from shardwise.integrations.torchrec.context import (
    ContextError,
    export_task,
    load_production_task,
    save_production_task,
)
from shardwise.integrations.torchrec.plan_loader import MlflowPlanLoader
from shardwise.integrations.torchrec.production import plan_production_task

pytestmark = pytest.mark.integration

CPU = Topology(world_size=2, compute_device="cpu", ddr_cap=2**30)
BATCH = 256


def _model(rows0: int = 20_000, tables: int = 8, with_ec: bool = False) -> nn.Module:
    model = nn.Module()
    model.sparse = nn.Module()
    model.sparse.ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=[32, 64, 128, 16][i % 4],
                           num_embeddings=rows0 if i == 0 else 5000 * (i + 1), feature_names=[f"f{i}"])
        for i in range(tables)], device=torch.device("meta"))
    for weight in model.sparse.ebc.parameters():
        weight._optimizer_classes = [RowWiseAdagrad]  # as apply_optimizer_in_backward leaves it
    if with_ec:
        model.ec = EmbeddingCollection(tables=[EmbeddingConfig(name="s0", embedding_dim=32, num_embeddings=500,
                                                               feature_names=["g0"])], device=torch.device("meta"))
    return model


def _constraints(tables: int = 8) -> dict[str, ParameterConstraints]:
    return {f"t{i}": ParameterConstraints(pooling_factors=[float(1 + i)]) for i in range(tables)}


def _sharders() -> list:
    return [EmbeddingBagCollectionSharder()]


def test_rebuilt_context_hashes_as_the_model(tmp_path):
    model = _model(with_ec=True)
    topology = Topology(world_size=2, compute_device="cuda", hbm_cap=2**30)
    constraints = {
        "t0": ParameterConstraints(sharding_types=["table_wise", "column_wise"], min_partition=16,
                                   pooling_factors=[3.0, 2.0], bounds_check_mode=BoundsCheckMode.WARNING),
        "t1": ParameterConstraints(cache_params=CacheParams(load_factor=0.2)),
    }
    sharders = [EmbeddingBagCollectionSharder(fused_params={"stochastic_rounding": False}),
                EmbeddingCollectionSharder()]
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=constraints)
    planner.plan(model, sharders)

    path = save_production_task(export_task(model, topology, name="ranking", constraints=constraints,
                                            sharders=sharders, batch_size=BATCH), tmp_path / "ranking.task.json")
    production = load_production_task(path)
    context = production.context
    rebuilt = EmbeddingShardingPlanner(topology=context.torchrec_topology(), batch_size=context.batch_size,
                                       constraints=context.torchrec_constraints(),
                                       storage_reservation=context.torchrec_storage_reservation())
    rebuilt.plan(context.module(), context.torchrec_sharders())
    assert rebuilt.hash_planner_context_inputs_str() == planner.hash_planner_context_inputs_str()
    # the shardwise task: every table, pooling factors summed over a table's features, the plan space kept
    assert [t.name for t in production.task.tables] == [f"t{i}" for i in range(8)] + ["s0"]
    t0 = production.task.table("t0")
    assert (t0.pooling_factor, t0.min_partition, t0.sharding_types) == (5.0, 16, ("table_wise", "column_wise"))
    assert production.task.num_devices == 2 and production.task.batch_size == 2 * BATCH


@pytest.mark.parametrize("what, make, words", [
    ("a model that is a collection", lambda: (_model().sparse.ebc, CPU, None), "wrap it in a module"),
    ("a constraint that cannot travel", lambda: (_model(), CPU, {"t0": ParameterConstraints(
        device_group="cpu", feature_names=["f0"], key_value_params=object())}), "key_value_params"),
    ("names repeated across collections", lambda: (_twice_named(), CPU, None), "repeat"),
])
def test_export_refuses_what_cannot_travel_naming_it(what, make, words):
    model, topology, constraints = make()
    with pytest.raises(ContextError, match=words) as err:
        export_task(model, topology, name="m", constraints=constraints)
    assert "\n" not in str(err.value)


def _twice_named() -> nn.Module:
    model = _model(tables=2)
    model.other = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=10,
                                                                    feature_names=["x"])], device=torch.device("meta"))
    return model


def test_a_task_file_without_a_context_is_refused_in_one_line(tmp_path):
    from shardwise.workload import ShardingTask, TableSpec, save_task

    path = save_task(ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=512,
                                  tables=(TableSpec(name="a", rows=10, dim=8, pooling_factor=1.0),)), tmp_path / "t.json")
    with pytest.raises(ContextError, match="not a production task"):
        load_production_task(path)


@pytest.fixture(scope="module")
def registered(tmp_path_factory, tiny_cost_model):
    """The drop-in's plan of a production task, as a registered version's files."""
    root = tmp_path_factory.mktemp("registered")
    task_path = save_production_task(export_task(_model(), CPU, name="ranking", constraints=_constraints(),
                                                 batch_size=BATCH), root / "ranking.task.json")
    planned = plan_production_task(load_production_task(task_path), tiny_cost_model[0], refine_s=0)
    files = write_plan_files(root / "files", planned.plan, task_path, {"plan_ms": 1.0},
                             planned.torchrec.model_dump(mode="json"))
    return planned, files


def _ranks(sharding_plan) -> dict[str, list[int]]:
    return {table: list(p.ranks) for table, p in sharding_plan.plan["sparse.ebc"].items()}


@pytest.fixture(scope="module")
def moved(registered, tmp_path_factory):
    """(the registered version's files with every shard moved to the next rank, in plan.json and torchrec_plan.json:
    a valid plan that no planner here makes, each table's ranks as the loaded plan must give them)."""
    _, files = registered
    out = tmp_path_factory.mktemp("moved") / "files"
    shutil.copytree(files, out)
    doc = json.loads((out / "torchrec_plan.json").read_text())
    for option in doc["options"]:
        for shard in option["shards"]:
            shard["rank"] = (shard["rank"] + 1) % CPU.world_size
    (out / "torchrec_plan.json").write_text(json.dumps(doc))
    plan = json.loads((out / "plan.json").read_text())
    for shard in plan["shards"]:
        shard["device"] = (shard["device"] + 1) % CPU.world_size
    (out / "plan.json").write_text(json.dumps(plan))
    return out, {o["name"]: [s["rank"] for s in o["shards"]] for o in doc["options"]}


def test_torchrecs_planner_loads_the_registered_plan_through_the_loader(moved):
    files, ranks = moved
    enumerator = ShardwiseEnumerator(topology=CPU, batch_size=BATCH, constraints=_constraints())
    planner = EmbeddingShardingPlanner(topology=CPU, batch_size=BATCH, constraints=_constraints(), enumerator=enumerator,
                                       plan_loader=MlflowPlanLoader(files, enumerator=enumerator))
    loaded = _ranks(planner.plan(_model(), _sharders()))
    assert loaded == ranks
    # the control: TorchRec's planner without the loader plans otherwise, so the placement came from the files
    own = _ranks(EmbeddingShardingPlanner(topology=CPU, batch_size=BATCH, constraints=_constraints()).plan(
        _model(), _sharders()))
    assert set(own) == set(loaded) and own != loaded


def test_the_drop_in_loads_the_registered_plan_without_a_cost_model(moved, tmp_path, monkeypatch):
    files, ranks = moved
    monkeypatch.chdir(tmp_path)  # no ./mlflow.db: no champion to find, and a training job loading its plan needs none
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    planner = ShardwisePlanner(CPU, batch_size=BATCH, constraints=_constraints(), plan_loader=MlflowPlanLoader(files))
    assert _ranks(planner.plan(_model(), _sharders())) == ranks
    assert f"the plan: loaded by the plan loader ({files})" in planner.last_stats


def test_load_plan_in_plain_python_reads_a_registered_plan_by_its_models_uri(registered, tmp_path, new_store):
    """`from shardwise.search import load_plan` alone reads a models:/ URI (the top package registers its reader),
    the plan registry loaded only for it."""
    from shardwise.integrations.mlflow import MlflowService
    from shardwise.integrations.plan_registry import register_plan
    from shardwise.search.plan import plan_from_json

    planned, files = registered
    service = MlflowService(new_store(tmp_path / "mlflow.db"))
    register_plan(service, "ranking", files, measured_ms=1.0, champion_ms=lambda uri: None, min_gain=0.0, tags={},
                  params={}, metrics={})
    code = ("import json, sys\n"
            "from shardwise.search import load_plan\n"
            "before = 'shardwise.integrations.plan_registry' in sys.modules\n"
            "plan = load_plan(sys.argv[1], tracking_uri=sys.argv[2])\n"
            "print(json.dumps({'registry_before': before, 'plan': plan.to_json()}))\n")
    done = subprocess.run([sys.executable, "-c", code, "models:/shardwise-plan-ranking@champion", service.tracking_uri],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["registry_before"] is False
    assert plan_from_json(out["plan"]) == planned.plan


def test_the_drop_in_names_what_changed_without_being_given_its_enumerator(registered):
    _, files = registered
    planner = ShardwisePlanner(CPU, batch_size=BATCH, constraints=_constraints(), plan_loader=MlflowPlanLoader(files))
    with pytest.raises(PlannerError, match="rows 20000 -> 20001"):
        planner.plan(_model(rows0=20_001), _sharders())


@pytest.mark.parametrize("model, topology, words", [
    (lambda: _model(rows0=40_000), CPU, "table 'sparse.ebc.t0' rows 20000 -> 40000"),
    (lambda: _model(tables=9), CPU, "new table 'sparse.ebc.t8'"),
    (lambda: _model(), Topology(world_size=4, compute_device="cpu", ddr_cap=2**30), "world size 2 -> 4"),
])
def test_a_changed_model_is_refused_naming_what_changed(registered, model, topology, words):
    _, files = registered
    constraints = _constraints(9)
    enumerator = ShardwiseEnumerator(topology=topology, batch_size=BATCH, constraints=constraints)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=constraints,
                                       enumerator=enumerator, plan_loader=MlflowPlanLoader(files, enumerator=enumerator))
    with pytest.raises(PlannerError) as err:
        planner.plan(model(), _sharders())
    assert err.value.error_type == PlannerErrorType.PLANNER_INPUT_CONTEXT_MISMATCH
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_changed_constraint_is_named_with_its_table_and_field(registered):
    _, files = registered
    constraints = {**_constraints(), "t2": ParameterConstraints(pooling_factors=[7.5])}
    planner = ShardwisePlanner(CPU, batch_size=BATCH, constraints=constraints, plan_loader=MlflowPlanLoader(files))
    with pytest.raises(PlannerError, match=r"table 't2''s constraints \(pooling_factors\)"):
        planner.plan(_model(), _sharders())


# -- the gate, on scripted measurements -----------------------------------------------------------------------------
class _Scripted:
    """Measurements as scripted: each session's plans cost what `figures` says by name (the measuring is not under
    test here; the gate is)."""

    def __init__(self) -> None:
        self.figures: list[dict[str, float]] = []
        self.sessions: list[list[str]] = []

    def __call__(self, task, named, out_dir, **_):
        figures = self.figures.pop(0)
        self.sessions.append([name for name, _ in named])
        return [_measured(figures[name], plan.num_devices) for name, plan in named], None, []


def _measured(ms: float, devices: int) -> MeasuredPlanCost:
    return MeasuredPlanCost(method="x", batch_size=BATCH, device_kind="cpu", hardware_kind="cpu", device_memory_bytes=1,
                            devices=tuple(DeviceCost(device=d, shards=(), width=0, fwd_ms=ms / (1 + d), bwd_ms=0.0,
                                                     comm_fwd_ms=0.0, comm_bwd_ms=0.0, memory_bytes=0,
                                                     comm_fwd_measured_ms=0.0, comm_bwd_measured_ms=0.0)
                                          for d in range(devices)))


@pytest.mark.slow
def test_publish_moves_champion_only_on_a_plan_measured_faster_beyond_the_noise(tmp_path, tiny_cost_model,
                                                                                 monkeypatch):
    from shardwise.integrations.mlflow import MlflowService
    from shardwise.jobs import publish

    monkeypatch.setenv("SHARDWISE_CACHE", str(tmp_path / "cache"))
    model_dir = tiny_cost_model[0].save(tmp_path / "model")
    task = save_production_task(export_task(_model(), CPU, name="ranking", constraints=_constraints(),
                                            batch_size=BATCH), tmp_path / "ranking.task.json")
    service = MlflowService(f"sqlite:///{tmp_path / 'mlflow.db'}")
    measure = _Scripted()
    settings = publish.PublishSettings(task=(str(task),), model=str(model_dir), out=str(tmp_path / "out"), refine_s=0)

    def run(*sessions: dict[str, float]) -> publish.PublishedTask:
        measure.figures = list(sessions)
        (done,) = publish.run(settings, mlflow=service, measure=measure, progress=False).tasks
        return done

    first = run({"plan": 10.0, "torchrec": 12.0})
    assert (first.version, first.alias, first.reason) == ("1", "champion", "no champion yet")
    # faster by 20%, the ratio moving 1% between sessions: champion
    second = run({"plan": 8.0, "torchrec": 12.0, "champion": 10.0}, {"plan": 8.1, "champion": 10.0})
    assert (second.version, second.alias) == ("2", "champion"), second.reason
    assert measure.sessions[-2:] == [["plan", "torchrec", "champion"], ["plan", "champion"]]
    # faster by 5%, but the ratio moved 10% between the two sessions: within the noise, challenger
    third = run({"plan": 7.6, "torchrec": 12.0, "champion": 8.0}, {"plan": 8.4, "champion": 8.0})
    assert (third.version, third.alias) == ("3", "challenger")
    assert "less" in third.reason and "champion v2" in third.reason
    # slower: challenger, and the version's tags say why
    fourth = run({"plan": 9.0, "torchrec": 12.0, "champion": 8.0}, {"plan": 9.0, "champion": 8.0})
    assert fourth.alias == "challenger"
    from mlflow import MlflowClient

    client = MlflowClient(service.tracking_uri)
    tags = client.get_model_version("shardwise-plan-ranking", "4").tags
    assert tags["gate.decision"] == "challenger" and ">=" in tags["gate.reason"]
    assert float(tags["figures.plan_ms"]) == 9.0 and tags["cost_model"] == str(model_dir)
    assert str(client.get_model_version_by_alias("shardwise-plan-ranking", "champion").version) == "2"
    from shardwise.integrations.plan_registry import load_registered_plan
    from shardwise.search import load_plan

    champion_plan = load_plan("models:/shardwise-plan-ranking@champion", tracking_uri=service.tracking_uri)
    assert champion_plan == load_registered_plan("models:/shardwise-plan-ranking/2", service=service).plan
    shown = publish.show("models:/shardwise-plan-ranking@champion", tracking_uri=service.tracking_uri)
    assert shown.startswith("shardwise-plan-ranking v2: 8 tables on 2 devices, planned by ShardwisePlanner")
    assert "device 1:" in shown
    figures = json.loads((Path(fourth.directory) / "files" / "figures.json").read_text())  # the last run's
    assert figures["plan_ms"] == 9.0 and figures["ratio_to_torchrec"] == pytest.approx(9 / 12)
    # TorchRec's plan's devices: 12 and 6 ms (the slowest, then half): balanced, 9 ms, said beside the ratio
    assert figures["torchrec_balanced_ms"] == pytest.approx(9.0)
    assert fourth.headline().endswith("(ratio 0.750; its work balanced over the devices 0.750)")
    assert "  TorchRec's plan's mean device, ms (what balancing its work would reach): 9" in shown


class _PublishRecorded:
    """`shardwise publish` (dry run, scripted measurements) of a 4-table production task, the `refine=` each
    ShardwisePlanner got recorded and held to `cap_s` seconds (the job's budget is minutes)."""

    def __init__(self, tmp_path: Path, model, monkeypatch, cap_s: float) -> None:
        from shardwise.integrations.mlflow import MlflowService
        from shardwise.integrations.torchrec import production

        self.given: list[float | None] = []
        given = self.given

        class Recorded(ShardwisePlanner):
            def __init__(self, *args, refine=None, **kwargs):
                given.append(refine)
                super().__init__(*args, refine=min(refine, cap_s) if refine is not None else None, **kwargs)

        monkeypatch.setattr(production, "ShardwisePlanner", Recorded)
        self.model_dir = model.save(tmp_path / "model")
        self.task = save_production_task(export_task(_model(tables=4), CPU, name="ranking",
                                                     constraints=_constraints(4), batch_size=BATCH),
                                         tmp_path / "ranking.task.json")
        self.service = MlflowService(f"sqlite:///{tmp_path / 'mlflow.db'}")
        self.out = tmp_path / "out"

    def __call__(self, **settings: object):
        from shardwise.jobs import publish

        measure = _Scripted()
        measure.figures = [{"plan": 9.0, "torchrec": 10.0}]
        (done,) = publish.run(publish.PublishSettings(task=(str(self.task),), model=str(self.model_dir),
                                                      out=str(self.out), dry_run=True,
                                                      measurement={"device": "cpu"}, **settings),
                              mlflow=self.service, measure=measure, progress=False).tasks
        return done, json.loads((Path(done.directory) / "files" / "figures.json").read_text())


def test_publishs_default_refinement_budget_reaches_the_drop_in_and_zero_turns_it_off(tmp_path, tiny_cost_model,
                                                                                       monkeypatch):
    """The default budget is passed to the drop-in as `refine=` (its own default does not refine a plan whose cost
    model needed no adaptation, as one trained on the user's tables); 0 is passed as 0."""
    from shardwise.jobs import publish

    run = _PublishRecorded(tmp_path, tiny_cost_model[0], monkeypatch, cap_s=0.0)  # the value, not the minutes
    _, figures = run()
    default = publish.PublishSettings.model_fields["refine_s"].default
    assert run.given == [default] and default > 0 and figures["refine_s"] == default
    done, figures = run(refine_s=0)
    assert run.given[-1] == 0 and figures["refine_s"] == 0 and "refinement_s" not in figures
    assert done.refinement_s is None and done.refinement() == "not refined (refine_s 0)"


@pytest.mark.slow
def test_publish_refines_on_this_machine_and_records_what_refinement_did(tmp_path, tiny_cost_model, monkeypatch):
    """`refine=` given explicitly refines a plan the model needed no adaptation for; its outcome lands in the
    plan's figures (the registered version's tags, `plan show`)."""
    run = _PublishRecorded(tmp_path, tiny_cost_model[0], monkeypatch, cap_s=2.0)
    done, figures = run()
    assert "refinement_s" in figures, (done.refinement(), figures)
    assert figures["refinement_s"] > 0 and done.refinement_s == figures["refinement_s"]
    assert isinstance(figures["refinement_changed"], bool) and figures["refinement_after_ms"] > 0
    assert figures["unrefined_predicted_ms"] > 0 and figures["predicted_ms"] > 0 and figures["refinement_start"]
    assert figures["refinement_after_ms"] <= figures["refinement_before_ms"]
    assert done.refinement().startswith("refined here for ")
    from shardwise.jobs import publish

    shown = publish.show(str(Path(done.directory) / "files"))  # what `plan show` says of the version
    assert re.search(r"refinement changed the searched plan: (yes|no)\n", shown), shown
    assert "refinement's budget here, s (0: off): 120" in shown and "refinement went on from the plan of: " in shown


def test_publish_refuses_to_refine_with_a_cost_model_for_other_hardware_before_planning(tmp_path, tiny_cost_model):
    from shardwise.jobs import publish

    model = tiny_cost_model[0]
    other = model.__class__.load(model.save(tmp_path / "model"))
    other.hardware_kind = "cuda-some-other-gpu"
    with pytest.raises(publish.SettingsError, match=r"refine_s 120: .*cuda-some-other-gpu.*--refine-s 0"):
        publish._check_refinement(120.0, other, "cpu")
    publish._check_refinement(0.0, other, "cpu")  # not refined: any model
    publish._check_refinement(120.0, model, "cpu")  # this machine's
