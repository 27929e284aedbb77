"""TorchRec's planner as a baseline on shardwise tasks, and shardwise as a drop-in TorchRec planner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import shardwise.integrations.torchrec as integration
from shardwise.integrations.torchrec import ShardwisePlanner
from shardwise.search import PlanError, TorchRecPlannerSearch, make_searcher, validate_plan
from shardwise.search import torchrec_plan as export
from shardwise.search.plan import shard_state_bytes
from shardwise.search.torchrec_plan import (
    ebc_on_meta,
    plan_from_module_sharding,
    to_module_sharding_plan,
    to_sharding_plan,
)
from shardwise.workload import ShardingTask, TableSpec

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from search_doubles import FeatureCostModel, random_task  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("method", ["torchrec", "torchrec_cw"])
def test_torchrecs_plan_is_valid_and_within_memory(method):
    task = random_task(0, 30, 4, memory_slack=2.0)
    plan = make_searcher(method).search(task, FeatureCostModel(), 0)
    validate_plan(plan, task)
    assert plan.method == method and max(plan.extra["memory_bytes"]) <= task.device_memory_bytes
    assert plan.extra["predicted"]["max_cost_ms"] > 0 and plan.extra["planning_time_s"] > 0


@pytest.fixture
def offered(monkeypatch):
    """The constraints each EmbeddingShardingPlanner was made with, in order."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    constraints = []
    real = EmbeddingShardingPlanner.__init__

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        constraints.append(kwargs["constraints"])
        real(self, *args, **kwargs)

    monkeypatch.setattr(EmbeddingShardingPlanner, "__init__", spy)
    return constraints


def test_torchrec_dp_offers_torchrecs_planner_data_parallel_and_reads_its_replicas_back(offered):
    task = random_task(2, 10, 4, memory_slack=2.0)
    searcher = make_searcher("torchrec_dp")
    plan = searcher.search(task, None, 0)
    validate_plan(plan, task)
    constraint = offered[0][task.tables[0].name]
    assert constraint.sharding_types == ["table_wise", "column_wise", "data_parallel"]
    assert constraint.compute_kernels == ["fused", "dense"]  # data-parallel runs only TorchRec's dense kernel
    assert plan.extra["provenance"]["options"]["sharding_types"] == constraint.sharding_types
    # where TorchRec replicates a table, its plan keeps it data-parallel (every type it emits has a shardwise form)
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    module_plan = to_module_sharding_plan(plan.model_copy(update={
        "shards": tuple(s for s in plan.shards if s.table != task.tables[0].name),
        "data_parallel": (task.tables[0].name,)}), task)
    assert isinstance(module_plan, EmbeddingModuleShardingPlan)
    back = plan_from_module_sharding(module_plan, task.num_devices, "torchrec_dp")
    assert back.data_parallel == (task.tables[0].name,)


def test_torchrecs_planner_replicating_a_table_leaves_the_console_quiet(caplog, capfd):
    """TorchRec's planner warns on the root logger for every data-parallel table it plans (no sharding spec, by
    design): shardwise's `torchrec_dp` plans without it, and the root logger's other warnings still pass."""
    import logging

    task = random_task(5, 10, 4, memory_slack=2.0)  # TorchRec's planner replicates one of its tables
    with caplog.at_level(logging.WARNING):
        plan = make_searcher("torchrec_dp").search(task, None, 0)
        logging.warning("Sharding spec of a later warning")
    assert plan.data_parallel
    assert [r.getMessage() for r in caplog.records] == ["Sharding spec of a later warning"]
    assert "Sharding spec not found" not in capfd.readouterr().err


def test_torchrec_rw_offers_torchrecs_planner_row_wise_and_reads_its_blocks_back(offered):
    from shardwise.costmodel.data_parallel import AllReduceCost

    # one table that alone would set the slowest device: TorchRec's planner splits it by rows
    hot = TableSpec(name="hot", rows=400_000, dim=64, pooling_factor=200.0)
    rest = tuple(TableSpec(name=f"t{i}", rows=20_000, dim=32, pooling_factor=5.0) for i in range(8))
    task = ShardingTask(num_devices=4, device_memory_bytes=2**30, batch_size=4096, tables=(hot, *rest))
    model = FeatureCostModel()
    plan = make_searcher("torchrec_rw").search(task, model, 0)
    validate_plan(plan, task)
    assert offered[0]["hot"].sharding_types == ["table_wise", "column_wise", "data_parallel", "row_wise"]
    # a plan with row-wise tables the model cannot price goes out unpriced; one with a reduce-scatter line is priced
    assert plan.row_wise == ("hot",) and "predicted" not in plan.extra
    model.reduce_scatter = AllReduceCost(0.01, 0.0, 0.05, collective="reduce_scatter")  # type: ignore[attr-defined]
    assert "predicted" in make_searcher("torchrec_rw").search(task, model, 0).extra
    # a row-wise table TorchRec lays out reads back as the plan's row_wise, and a layout that is not is refused
    module_plan = to_module_sharding_plan(plan.model_copy(update={
        "shards": tuple(s for s in plan.shards if s.table != "hot"), "data_parallel": (), "row_wise": ("hot",)}), task)
    assert plan_from_module_sharding(module_plan, 4, "torchrec_rw").row_wise == ("hot",)
    assert [m.shard_sizes[0] for m in module_plan["hot"].sharding_spec.shards] == [100_000] * 4
    module_plan["hot"].sharding_spec.shards[0].shard_sizes[0] = 99_999
    with pytest.raises(PlanError, match="row-wise blocks .* are not ceil"):
        plan_from_module_sharding(module_plan, 4, "torchrec_rw")


def test_torchrec_column_wise_splits_a_table_too_big_for_one_device():
    big = TableSpec(name="big", rows=200_000, dim=128, pooling_factor=5.0)
    tables = (big, *[TableSpec(name=f"s{i}", rows=1000, dim=16, pooling_factor=2.0) for i in range(6)])
    probe = ShardingTask(num_devices=4, device_memory_bytes=1, batch_size=512, tables=tables)
    task = probe.model_copy(update={"device_memory_bytes": int(shard_state_bytes(big, probe) * 0.6)})
    with pytest.raises(PlanError, match="table 'big': the table alone needs"):
        TorchRecPlannerSearch().search(task, None, 0)
    plan = TorchRecPlannerSearch(column_wise=True, min_partition=32).search(task, None, 0)
    validate_plan(plan, task)
    widths = sorted(s.dim for s in plan.shards if s.table == "big")
    assert len(widths) >= 2 and all(w >= 32 for w in widths)


def test_export_and_import_of_module_sharding_plans_round_trip():
    task = random_task(1, 12, 4)
    plan = make_searcher("neuroshard").search(task, FeatureCostModel(), 0)
    module_plan = to_module_sharding_plan(plan, task, device_type="cuda")
    for sharding in module_plan.values():
        assert sharding.compute_kernel == "fused"
        assert sharding.sharding_type in ("table_wise", "column_wise")
        assert all(m.placement.device().type == "cuda" for m in sharding.sharding_spec.shards)
    back = plan_from_module_sharding(module_plan, task.num_devices, plan.method)
    key = lambda s: (s.table, s.col_offset)  # noqa: E731
    assert sorted(back.shards, key=key) == sorted(plan.shards, key=key)
    with pytest.raises(PlanError, match="covered more than once"):
        to_sharding_plan(plan.model_copy(update={"shards": plan.shards + plan.shards[:1]}), task)


def test_the_torchrec_integration_re_exports_the_plan_export():
    for name in ("parameter_sharding", "to_module_sharding_plan", "to_sharding_plan", "plan_from_module_sharding",
                 "ebc_on_meta"):
        assert getattr(integration, name) is getattr(export, name)


def test_shardwise_planner_has_torchrecs_call_shape():
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, (rows, dim) in enumerate([(5000, 64), (200, 16), (80000, 128), (3000, 32), (100, 8)])
    ]
    model = torch.nn.Sequential()
    model.add_module("sparse", EmbeddingBagCollection(tables=configs, device=torch.device("meta")))
    constraints = {"t2": ParameterConstraints(pooling_factors=[40.0])}
    planner = ShardwisePlanner(
        world_size=4, device_memory_bytes=2**30, batch_size=1024, method="neuroshard",
        cost_model=FeatureCostModel(), constraints=constraints, device_type="cpu",
    )
    sharding_plan = planner.collective_plan(model, [EmbeddingBagCollectionSharder()])
    assert set(sharding_plan.plan) == {"sparse"}
    assert set(sharding_plan.plan["sparse"]) == {c.name for c in configs}
    assert planner.last_task.table("t2").pooling_factor == 40.0
    assert planner.last_task.table("t0").pooling_factor == 1.0  # TorchRec's default
    ranks = {r for s in sharding_plan.plan["sparse"].values() for r in s.ranks}
    assert ranks <= {0, 1, 2, 3}
    validate_plan(planner.last_plan, planner.last_task)


def test_a_planner_with_no_ranks_to_plan_for_is_refused_saying_what_to_pass():
    with pytest.raises(PlanError, match="world_size"):
        ShardwisePlanner(device_memory_bytes=2**30, batch_size=8, method="size_greedy")


def test_torchrecs_planner_is_given_the_tasks_batch_per_rank(monkeypatch):
    """A task's batch is the step's, over every rank; TorchRec's planners take samples per rank (a table-wise
    shard's inputs are its batch x world size), so the baseline plans the task's batch, not world-size times it."""
    import torchrec.distributed.planner as torchrec_planner

    seen = []
    real = torchrec_planner.EmbeddingShardingPlanner

    def recording(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - TorchRec's signature, passed through
        seen.append(kwargs["batch_size"])
        return real(*args, **kwargs)

    monkeypatch.setattr(torchrec_planner, "EmbeddingShardingPlanner", recording)
    task = random_task(3, 12, 4, memory_slack=4.0)
    TorchRecPlannerSearch().search(task, None, 0)
    assert seen == [-(-task.batch_size // 4)]


def test_the_drop_in_takes_torchrecs_batch_per_rank_and_plans_the_steps_batch():
    tables = [TableSpec(name=f"t{i}", rows=1000 + 100 * i, dim=16, pooling_factor=2.0) for i in range(6)]
    module = ebc_on_meta(ShardingTask(num_devices=4, device_memory_bytes=2**30, batch_size=64, tables=tuple(tables)))
    per_rank = ShardwisePlanner(world_size=4, device_memory_bytes=2**30, batch_size=64, method="size_greedy",
                                device_type="cpu", storage_reservation=0.0)
    per_rank.plan(module)
    assert per_rank.last_task.batch_size == 64 * 4
    # a shardwise task keeps its own (global) batch
    task = per_rank.last_task
    given = ShardwisePlanner(task=task, method="size_greedy", device_type="cpu")
    given.plan(module)
    assert given.last_task.batch_size == task.batch_size and "batch 64 per rank" in given.last_stats


def test_a_torchrec_plan_over_shardwises_memory_accounting_is_planned_again_with_less(monkeypatch):
    """TorchRec estimates a shard's buffers its own way; where its plan is over shardwise's accounting (which every
    method's plan must fit), it plans again with the overshoot taken off its memory, and the plan fits."""
    from shardwise.search import torchrec_planner

    caps = []
    real = torchrec_planner._torchrec_planner

    def recording(task, hbm_cap, constraints, timeout_s):  # noqa: ANN001, ANN202 - the module's signature
        caps.append(hbm_cap)
        # the first time, TorchRec is told of twice the memory the task has: its plan does not fit the task
        return real(task, 2 * hbm_cap if len(caps) == 1 else hbm_cap, constraints, timeout_s)

    monkeypatch.setattr(torchrec_planner, "_torchrec_planner", recording)
    task = random_task(5, 16, 4, memory_slack=1.3)
    plan = TorchRecPlannerSearch().search(task, None, 0)
    validate_plan(plan, task)
    assert caps[0] == task.device_memory_bytes and len(caps) >= 2, caps  # planned again below the task's cap
    assert caps[-1] < task.device_memory_bytes and plan.extra["provenance"]["torchrec_hbm_cap"] == caps[-1]
