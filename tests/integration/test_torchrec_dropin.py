"""`ShardwisePlanner` as a TorchRec user meets it: a `Topology` (several hosts), TorchRec's storage reservation, the
champion cost model found by default, constraints honoured (TorchRec's enumerator decides the plan space; what
shardwise does not search keeps TorchRec's option), TorchRec's refusals, and the stats."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from shardwise.integrations.mlflow import MlflowService
from shardwise.integrations.torchrec import PlannerError, ShardwisePlanner
from shardwise.profiling import hardware_kind
from shardwise.search import validate_plan

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from search_doubles import FeatureCostModel  # noqa: E402

pytestmark = pytest.mark.integration

GIB = 2**30


def _model(tables: list[tuple[int, int]], *, with_sequence: bool = False) -> torch.nn.Module:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    configs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
               for i, (rows, dim) in enumerate(tables)]
    model = torch.nn.Module()
    model.sparse = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    if with_sequence:
        model.sequence = EmbeddingCollection(
            tables=[EmbeddingConfig(name="s0", embedding_dim=16, num_embeddings=100, feature_names=["s"])],
            device=torch.device("meta"))
    return model


TABLES = [(5000, 64), (200, 16), (80000, 128), (3000, 32), (100, 8), (40000, 64), (900, 32), (7000, 16)]


def _topology(world_size: int, local_world_size: int, hbm: int = GIB):
    from torchrec.distributed.planner.types import Topology

    return Topology(world_size=world_size, compute_device="cuda", local_world_size=local_world_size, hbm_cap=hbm)


def _placements(sharding_plan) -> set[tuple[int, str]]:
    """(rank, device) of every shard of the plan (data-parallel tables have no shards to place)."""
    found = set()
    for param in sharding_plan.plan["sparse"].values():
        for meta in param.sharding_spec.shards if param.sharding_spec is not None else ():
            found.add((meta.placement.rank(), str(meta.placement.device())))
    return found


def test_a_topology_of_two_hosts_places_each_rank_on_its_hosts_gpu():
    planner = ShardwisePlanner(_topology(4, 2), batch_size=1024, method="size_greedy")
    placements = _placements(planner.plan(_model(TABLES)))
    assert {rank for rank, _ in placements} == {0, 1, 2, 3}
    assert all(device == f"cuda:{rank % 2}" for rank, device in placements), placements  # rank 3 on cuda:1
    assert planner.last_task.num_devices == 4


def test_without_a_topology_the_keywords_make_one_with_its_hosts():
    planner = ShardwisePlanner(world_size=4, local_world_size=2, device_memory_bytes=GIB, batch_size=1024,
                               cost_model=FeatureCostModel(), device_type="cuda")
    assert all(device == f"cuda:{rank % 2}" for rank, device in _placements(planner.plan(_model(TABLES))))
    assert "on 4 ranks (2 per host)" in planner.last_stats


def test_local_world_size_comes_from_torchrun_when_the_topology_has_none(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    planner = ShardwisePlanner(world_size=4, device_memory_bytes=GIB, batch_size=1024, method="size_greedy",
                               device_type="cuda")
    assert all(device == f"cuda:{rank % 2}" for rank, device in _placements(planner.plan(_model(TABLES))))


def test_the_storage_reservation_keeps_part_of_each_device_free():
    """TorchRec's HeuristicalStorageReservation(0.15) by default (15% of HBM, and the dense and input buffers); a
    share becomes TorchRec's FixedPercentageStorageReservation; any TorchRec StorageReservation is taken as it is."""
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import PlannerErrorType

    planner = ShardwisePlanner(_topology(2, 2, hbm=GIB), batch_size=512, method="size_greedy")
    planner.plan(_model(TABLES))
    assert planner.last_task.device_memory_bytes <= int(GIB * 0.85)
    for reservation, left in ((0.0, GIB), (0.25, int(GIB * 0.75)), (FixedPercentageStorageReservation(0.5), GIB // 2)):
        fixed = ShardwisePlanner(_topology(2, 2, hbm=GIB), batch_size=512, method="size_greedy",
                                 storage_reservation=reservation)
        fixed.plan(_model(TABLES))
        assert fixed.last_task.device_memory_bytes == left, reservation
    with pytest.raises(PlannerError, match="storage_reservation 1.5") as refused:
        ShardwisePlanner(_topology(2, 2), batch_size=512, storage_reservation=1.5)
    assert refused.value.error_type == PlannerErrorType.INPUT_VALIDATION


def test_a_cpu_topology_plans_in_its_ddr_as_torchrecs_planner_does():
    """TorchRec gives a CPU topology no HBM (hbm 0): its tables live in DDR, and so does the plan's budget."""
    from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError
    from torchrec.distributed.planner.types import PlannerErrorType, Topology

    cpu = Topology(world_size=2, compute_device="cpu", hbm_cap=4 * GIB, ddr_cap=2 * GIB)
    planner = ShardwisePlanner(cpu, batch_size=512, method="size_greedy", storage_reservation=0.0)
    sharding_plan = planner.plan(_model(TABLES))
    assert planner.last_task.device_memory_bytes == 2 * GIB
    assert {device for _, device in _placements(sharding_plan)} == {"cpu"}

    nothing = ShardwisePlanner(_topology(2, 2, hbm=0), batch_size=512, method="size_greedy")
    with pytest.raises(TorchRecPlannerError) as refused:
        nothing.plan(_model(TABLES))
    assert refused.value.error_type == PlannerErrorType.INSUFFICIENT_STORAGE


def test_a_shardwise_task_gives_its_budget_skew_and_precision():
    from shardwise.integrations.torchrec import ebc_on_meta
    from shardwise.workload import ShardingTask, TableSpec

    task = ShardingTask(num_devices=2, device_memory_bytes=GIB, batch_size=512, weights_precision="fp16",
                        tables=tuple(TableSpec(name=f"t{i}", rows=rows, dim=dim, pooling_factor=2.0, zipf_alpha=1.1)
                                     for i, (rows, dim) in enumerate(TABLES)))
    module = torch.nn.Module()
    module.sparse = ebc_on_meta(task)
    planner = ShardwisePlanner(task=task, cost_model=FeatureCostModel(), device_type="cpu")
    planner.plan(module)
    # nothing of the task lost on the way through the module; its tables gain the plan space the sharders allow
    searched = planner.last_task
    assert searched.model_copy(update={"tables": task.tables}) == task
    assert [t.model_copy(update={"sharding_types": None, "min_partition": None}) for t in searched.tables] == list(
        task.tables)
    assert all({"table_wise", "column_wise"} <= set(t.sharding_types or ()) for t in searched.tables)
    validate_plan(planner.last_plan, searched)


def test_pooling_of_a_table_serving_several_features_adds_up():
    from torchrec.distributed.planner import ParameterConstraints

    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, method="size_greedy",
                               constraints={"t0": ParameterConstraints(pooling_factors=[2.0, 3.5])})
    planner.plan(_model(TABLES))
    assert planner.last_task.table("t0").pooling_factor == 5.5
    assert planner.last_task.table("t1").pooling_factor == 1.0  # TorchRec's default


@pytest.mark.parametrize("constraint", [
    {"compute_kernels": ["dense"]},
    {"sharding_types": ["table_row_wise"]},
    {"sharding_types": ["grid_shard"]},
])
def test_constraints_outside_shardwises_search_keep_torchrecs_option_and_the_stats_say_so(constraint):
    """A table whose constraints allow no table-wise or column-wise option on the fused kernel keeps one of TorchRec's
    own options, within its constraints; the search places the others."""
    from torchrec.distributed.planner import ParameterConstraints

    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, cost_model=FeatureCostModel(),
                               constraints={"t2": ParameterConstraints(**constraint)})
    kept = planner.plan(_model(TABLES)).plan["sparse"]["t2"]
    assert kept.sharding_type in constraint.get("sharding_types", [kept.sharding_type])
    assert kept.compute_kernel in constraint.get("compute_kernels", [kept.compute_kernel])
    assert "t2" not in {t.name for t in planner.last_task.tables}
    assert "not searched by shardwise, their own option kept: t2 (no table-wise or column-wise option on the fused " \
        "kernel)" in planner.last_stats
    assert f"t2 ({kept.sharding_type}, {kept.compute_kernel})" in planner.last_stats  # priced by TorchRec's estimator


def test_a_constraint_no_option_satisfies_is_refused_naming_the_table():
    from torchrec.distributed.planner import ParameterConstraints

    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, method="size_greedy", constraints={
        "t2": ParameterConstraints(sharding_types=["data_parallel"], compute_kernels=["fused"])})
    with pytest.raises(PlannerError, match="t2"):
        planner.plan(_model(TABLES))


def test_tables_restricted_to_row_wise_or_data_parallel_keep_them_and_their_memory_is_left_out_of_the_search():
    """TorchRec executes row-wise and data-parallel shardings: the plan lays them out as TorchRec does, the search
    places the rest in what they leave of each rank's memory, and the stats say TorchRec's estimator priced them."""
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError
    from torchrec.distributed.planner.types import PlannerErrorType

    constraints = {"t2": ParameterConstraints(sharding_types=["row_wise"]),
                   "t5": ParameterConstraints(sharding_types=["data_parallel"])}
    planner = ShardwisePlanner(_topology(4, 2), batch_size=512, cost_model=FeatureCostModel(), constraints=constraints,
                               storage_reservation=0.0)
    sharding_plan = planner.plan(_model(TABLES))
    params = sharding_plan.plan["sparse"]
    assert set(params) == {f"t{i}" for i in range(len(TABLES))}
    row_wise = params["t2"]
    assert (row_wise.sharding_type, row_wise.compute_kernel, row_wise.ranks) == ("row_wise", "fused", [0, 1, 2, 3])
    blocks = [(m.shard_offsets, m.shard_sizes, str(m.placement)) for m in row_wise.sharding_spec.shards]
    assert blocks == [([0, 0], [20000, 128], "rank:0/cuda:0"), ([20000, 0], [20000, 128], "rank:1/cuda:1"),
                      ([40000, 0], [20000, 128], "rank:2/cuda:0"), ([60000, 0], [20000, 128], "rank:3/cuda:1")]
    replicated = params["t5"]
    assert (replicated.sharding_type, replicated.compute_kernel, replicated.ranks) == ("data_parallel", "dense",
                                                                                       [0, 1, 2, 3])
    assert "the plan: shardwise's neuroshard search" in planner.last_stats
    assert {s.table for s in planner.last_plan.shards} == {f"t{i}" for i in (0, 1, 3, 4, 6, 7)}
    # every rank keeps a row-wise block of t2 and a replica of t5: at least their weights are not the search's
    assert planner.last_task.device_memory_bytes <= GIB - (20000 * 128 + 40000 * 64) * 4
    assert "not searched by shardwise, their own option kept: t2 (" in planner.last_stats and "; t5 (" \
        in planner.last_stats
    assert "priced by TorchRec's estimator (the cost model has not measured them): t2 (row_wise, fused), " \
        "t5 (data_parallel, dense)" in planner.last_stats

    too_big = ShardwisePlanner(_topology(4, 2, hbm=2**20), batch_size=512, method="size_greedy",
                               constraints=constraints)
    with pytest.raises(TorchRecPlannerError) as refused:
        too_big.plan(_model(TABLES))
    assert refused.value.error_type == PlannerErrorType.INSUFFICIENT_STORAGE
    # nothing for shardwise to search: TorchRec's own plan, and the stats say why
    only = ShardwisePlanner(_topology(4, 2), batch_size=512, cost_model=FeatureCostModel(), constraints={
        f"t{i}": ParameterConstraints(sharding_types=["row_wise"]) for i in range(len(TABLES))})
    assert {p.sharding_type for p in only.plan(_model(TABLES)).plan["sparse"].values()} == {"row_wise"}
    assert only.last_plan is None and "shardwise's search found no plan: no table to search" in only.last_stats


def test_sequence_tables_are_planned_and_shared_names_kept_apart():
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, cost_model=FeatureCostModel(),
                               constraints={"s0": ParameterConstraints(pooling_factors=[5.0])})
    model = _model(TABLES, with_sequence=True)
    sharding_plan = planner.plan(model)
    assert set(sharding_plan.plan) == {"sparse", "sequence"}
    assert sharding_plan.plan["sequence"]["s0"].sharding_type == "table_wise"
    assert planner.last_task.table("s0").pooling_factor == 5.0
    assert "sequence tables (EmbeddingCollection), costed as pooled lookups: s0" in planner.last_stats

    model.more = EmbeddingCollection(  # a second collection naming its table like one of the first's
        tables=[EmbeddingConfig(name="t0", embedding_dim=8, num_embeddings=10, feature_names=["g"])],
        device=torch.device("meta"))
    both = ShardwisePlanner(_topology(2, 2), batch_size=512, cost_model=FeatureCostModel())
    sharding_plan = both.plan(model)
    assert set(sharding_plan.plan["more"]) == {"t0"} and "t0" in sharding_plan.plan["sparse"]
    assert {"more.t0", "sparse.t0"} <= {t.name for t in both.last_task.tables}
    validate_plan(both.last_plan, both.last_task)


def test_the_sharders_decide_which_modules_are_planned_as_in_torchrecs_planner():
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
    from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

    def model() -> torch.nn.Module:
        module = _model(TABLES, with_sequence=True)
        inner = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name="w0", embedding_dim=8, num_embeddings=100, feature_names=["f0"])],
            is_weighted=True, device=torch.device("meta"))
        module.weighted = FeatureProcessedEmbeddingBagCollection(
            inner, PositionWeightedModuleCollection({"f0": 10}, device=torch.device("meta")))
        return module

    def planned(sharding_plan) -> dict[str, set[str]]:
        return {path: set(params) for path, params in sharding_plan.plan.items()}

    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, cost_model=FeatureCostModel())
    for sharders in ([EmbeddingBagCollectionSharder()],
                     [EmbeddingBagCollectionSharder(), FeatureProcessedEmbeddingBagCollectionSharder()]):
        theirs = EmbeddingShardingPlanner(topology=_topology(2, 2), batch_size=512).plan(model(), sharders)
        ours = planner.plan(model(), sharders)
        assert planned(ours) == planned(theirs), sharders  # no sharder for the sequence collection: not planned
        assert "sequence" not in planned(ours)
    assert planned(ours)["weighted"] == {"w0"} and "w0" in {t.name for t in planner.last_task.tables}
    assert planner.plan(model(), []).plan == {}  # no sharders: nothing to shard


def test_a_column_split_is_planned_where_allowed_and_the_plan_respects_the_constraints_otherwise():
    """A table too large for one device is split where its constraints allow; table-wise only, it stays whole (on a
    kernel TorchRec offers for it); with min_partition, no slice is narrower."""
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError

    big = [(400_000, 128), (1000, 16), (2000, 32)]  # t0: 400k x 128 fp32: about 0.19 GiB
    topology = _topology(4, 4, hbm=int(0.12 * GIB))

    def t0_of(constraint: dict | None):  # noqa: ANN202 - the planner and its ParameterSharding of t0
        planner = ShardwisePlanner(topology, batch_size=256, cost_model=FeatureCostModel(), storage_reservation=0.0,
                                   constraints={"t0": ParameterConstraints(**constraint)} if constraint else None)
        return planner, planner.plan(_model(big)).plan["sparse"]["t0"]

    allowed, split = t0_of(None)
    assert split.sharding_type == "column_wise" and len(split.sharding_spec.shards) > 1
    assert len([s for s in allowed.last_plan.shards if s.table == "t0"]) > 1
    _, whole = t0_of({"sharding_types": ["table_wise"]})
    assert whole.sharding_type == "table_wise" and len(whole.sharding_spec.shards) == 1
    assert whole.sharding_spec.shards[0].shard_sizes == [400_000, 128]
    wide, halves = t0_of({"min_partition": 64})
    assert halves.sharding_type == "column_wise" and len(halves.sharding_spec.shards) > 1
    assert all(m.shard_sizes[1] >= 64 for m in halves.sharding_spec.shards)
    assert all(s.dim >= 64 for s in wide.last_plan.shards if s.table == "t0")
    # table-wise on the fused kernel only: it fits no rank, and TorchRec's planner says so
    with pytest.raises(TorchRecPlannerError, match="Unable to find a plan"):
        t0_of({"sharding_types": ["table_wise"], "compute_kernels": ["fused"]})


def test_the_stats_are_logged_per_plan(caplog):
    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, cost_model=FeatureCostModel())
    # TorchRec's logger at INFO whatever an earlier test (the CLI's quiet libraries) set it to
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="torchrec"):
        planner.plan(_model(TABLES))
    stats = planner.last_stats
    assert stats is not None and stats in caplog.text
    assert "--- Planner Statistics ---" in caplog.text  # TorchRec's own table first
    assert stats.startswith("ShardwisePlanner: 8 tables on 2 ranks (2 per host), batch 512 per rank")
    assert "the plan: shardwise's neuroshard search" in stats
    assert "HBM GiB" in stats and "predicted ms" in stats and "sharding: 8 table_wise (fused)" in stats


def test_the_champion_cost_model_is_found_by_default(tmp_path, monkeypatch, tiny_cost_model, new_store):
    monkeypatch.chdir(tmp_path)
    uri = new_store(tmp_path / "mlflow.db")
    model, report = tiny_cost_model  # labelled with this machine's CPU: the champion the planner looks up
    assert model.hardware_kind == hardware_kind("cpu")
    MlflowService(uri).log_cost_model(model, report)
    planner = ShardwisePlanner(world_size=2, device_memory_bytes=GIB, batch_size=512, device_type="cpu",
                               tracking_uri=uri, adapt=0)  # these tables are new to it: adaptation has its own tests
    planner.plan(_model(TABLES))
    assert "predicted" in planner.last_plan.extra  # planned with the registered model
    assert planner.resolved_cost_model() is not None


def test_a_missing_champion_is_refused_with_what_to_do(tmp_path):
    empty = ShardwisePlanner(world_size=2, device_memory_bytes=GIB, batch_size=512, device_type="cpu",
                             tracking_uri=f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(PlannerError, match="no cost model at models:/shardwise-cost-.*@champion.*make run"):
        empty.plan(_model(TABLES))


def test_a_missing_champion_is_refused_before_any_proposal_as_itself(tmp_path):
    from torchrec.distributed.planner.types import PlannerErrorType

    empty = ShardwisePlanner(world_size=2, device_memory_bytes=GIB, batch_size=512, device_type="cpu",
                             tracking_uri=f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(PlannerError, match="^ShardwisePlanner: no cost model at ") as refused:
        empty.plan(_model(TABLES))
    assert refused.value.error_type == PlannerErrorType.OTHER


def test_the_stats_say_each_table_in_host_memory_its_kernel_and_cache():
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    constraints = {"t2": ParameterConstraints(compute_kernels=["fused_uvm_caching"],
                                              cache_params=CacheParams(load_factor=0.3)),
                   "t5": ParameterConstraints(compute_kernels=["fused_uvm"])}
    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, cost_model=FeatureCostModel(), constraints=constraints)
    plan = planner.plan(_model(TABLES)).plan["sparse"]
    assert (plan["t2"].compute_kernel, plan["t5"].compute_kernel) == ("fused_uvm_caching", "fused_uvm")
    assert "in host memory: " in planner.last_stats
    assert "t2 fused_uvm_caching (cache_load_factor 0.3: 24000 of 80000 rows cached in HBM)" in planner.last_stats
    assert "t5 fused_uvm (no cache)" in planner.last_stats


# -- tables the cost model has not learned: TorchRec's planner's plan, in its time ---------------------------------
def _dcnv2_topology():  # noqa: ANN202 - a TorchRec Topology: 2 CPU ranks, as the brief's DLRM_DCN is planned
    from torchrec.distributed.planner.types import Topology

    return Topology(world_size=2, compute_device="cpu", ddr_cap=4 * GIB)


def _shardwise_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "shardwise.torchrec" and r.levelno >= logging.WARNING]


def test_tables_the_cost_model_has_not_learned_get_torchrecs_plan_and_one_line_saying_how_to_learn_them(
        tiny_cost_model, caplog):
    """TorchRec's DLRM_DCN over the DCNv2 tables, which the model never saw: by default the plan is the one TorchRec's
    planner makes from the same arguments (its proposers, partitioner and estimates), no search runs, and one
    warning names the way to a learned plan; the stats say which plan was returned and why."""
    from dcnv2_model import BATCH, dcnv2, dcnv2_constraints, dcnv2_tables
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.sharding_plan import get_default_sharders

    model = tiny_cost_model[0]
    assert model.outside_training(dcnv2_tables(), model.batch_size) is not None  # the premise
    theirs = EmbeddingShardingPlanner(_dcnv2_topology(), batch_size=BATCH, constraints=dcnv2_constraints())
    expected = theirs.plan(dcnv2(torch.device("meta")), get_default_sharders())
    planner = ShardwisePlanner(_dcnv2_topology(), batch_size=BATCH, constraints=dcnv2_constraints(), cost_model=model)
    with caplog.at_level(logging.INFO, logger="shardwise.torchrec"):
        planned = planner.plan(dcnv2(torch.device("meta")))
    assert planned == expected
    assert planner.last_plan is None and planner.search.last_seconds == {}  # no shardwise search ran
    (line,) = _shardwise_warnings(caplog)
    assert line.startswith("ShardwisePlanner: the plan is TorchRec's planner's own, the cost model has not learned "
                           "these tables (outside what the cost model was trained on")
    assert "shardwise pipeline run --local --workload-tables TABLES --production-tasks TASK" in line
    assert "adapt=SECONDS or refine=SECONDS" in line
    assert "the plan: TorchRec's planner's own (its proposers and estimates: the cost model has not learned these " \
           "tables)" in planner.last_stats
    # asked to measure them here (adapt= given, 0 s), the search plans them as before: another plan, and no line
    caplog.clear()
    searched = ShardwisePlanner(_dcnv2_topology(), batch_size=BATCH, constraints=dcnv2_constraints(),
                                cost_model=model, adapt=0)
    with caplog.at_level(logging.INFO, logger="shardwise.torchrec"):
        assert searched.plan(dcnv2(torch.device("meta"))) != expected
    assert searched.last_plan is not None and "shardwise's neuroshard search" in searched.last_stats
    assert not any("TorchRec's planner's own" in m for m in _shardwise_warnings(caplog))


def test_tables_the_cost_model_has_learned_get_its_searched_plan(tiny_cost_model, caplog):
    from costmodel_synthetic import synthetic_tables

    from shardwise.integrations.torchrec import ebc_on_meta
    from shardwise.workload import ShardingTask

    model = tiny_cost_model[0]
    learned = tuple(t for t in synthetic_tables("a", 12, 0) if model.outside_training([t], model.batch_size) is None)
    task = ShardingTask(num_devices=2, device_memory_bytes=GIB, batch_size=model.batch_size, tables=learned)
    assert len(learned) >= 8 and model.outside_training(task.tables, model.batch_size) is None
    planner = ShardwisePlanner(task=task, cost_model=model, device_type="cpu")
    with caplog.at_level(logging.INFO, logger="shardwise.torchrec"):
        planner.plan(ebc_on_meta(task))
    assert planner.last_plan is not None and "search" in planner.search.last_seconds
    assert "the plan: shardwise's neuroshard search" in planner.last_stats
    assert _shardwise_warnings(caplog) == []
