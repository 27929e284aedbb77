"""`ShardwisePlanner` as a TorchRec user meets it: a `Topology` (several hosts), the storage reservation, the
champion cost model found by default, constraints honoured or refused by table name, and the stats table."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from shardwise.integrations.mlflow import MlflowService
from shardwise.integrations.torchrec import DEFAULT_STORAGE_RESERVATION, PlannerError, ShardwisePlanner
from shardwise.profiling import hardware_kind

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
    """(rank, device) of every shard of the plan."""
    found = set()
    for param in sharding_plan.plan["sparse"].values():
        for meta in param.sharding_spec.shards:
            found.add((meta.placement.rank(), str(meta.placement.device())))
    return found


def test_a_topology_of_two_hosts_places_each_rank_on_its_hosts_gpu():
    planner = ShardwisePlanner(_topology(4, 2), batch_size=1024, method="size_greedy")
    placements = _placements(planner.plan(_model(TABLES)))
    assert {rank for rank, _ in placements} == {0, 1, 2, 3}
    assert all(device == f"cuda:{rank % 2}" for rank, device in placements), placements  # rank 3 on cuda:1
    assert planner.last_task.num_devices == 4


def test_local_world_size_comes_from_torchrun_when_the_topology_has_none(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    planner = ShardwisePlanner(world_size=4, device_memory_bytes=GIB, batch_size=1024, method="size_greedy",
                               device_type="cuda")
    assert all(device == f"cuda:{rank % 2}" for rank, device in _placements(planner.plan(_model(TABLES))))


def test_the_storage_reservation_keeps_part_of_each_device_free():
    planner = ShardwisePlanner(_topology(2, 2, hbm=GIB), batch_size=512, method="size_greedy")
    planner.plan(_model(TABLES))
    assert planner.last_task.device_memory_bytes == int(GIB * (1 - DEFAULT_STORAGE_RESERVATION))
    none = ShardwisePlanner(_topology(2, 2, hbm=GIB), batch_size=512, method="size_greedy", storage_reservation=0.0)
    none.plan(_model(TABLES))
    assert none.last_task.device_memory_bytes == GIB
    with pytest.raises(PlannerError, match="storage_reservation 1.5"):
        ShardwisePlanner(_topology(2, 2), batch_size=512, storage_reservation=1.5)


def test_a_cpu_topology_plans_in_its_ddr_as_torchrecs_planner_does():
    """TorchRec gives a CPU topology no HBM (hbm 0): its tables live in DDR, and so does the plan's budget."""
    from torchrec.distributed.planner.types import Topology

    cpu = Topology(world_size=2, compute_device="cpu", hbm_cap=4 * GIB, ddr_cap=2 * GIB)
    planner = ShardwisePlanner(cpu, batch_size=512, method="size_greedy")
    sharding_plan = planner.plan(_model(TABLES))
    assert planner.last_task.device_memory_bytes == int(2 * GIB * (1 - DEFAULT_STORAGE_RESERVATION))
    assert {device for _, device in _placements(sharding_plan)} == {"cpu"}

    nothing = ShardwisePlanner(_topology(2, 2, hbm=0), batch_size=512, method="size_greedy")
    with pytest.raises(PlannerError, match="^each rank's memory is 0 bytes .*: nothing to place tables in; give a "
                                           "Topology's hbm_cap .* or ddr_cap") as refused:
        nothing.plan(_model(TABLES))
    assert "GiB" not in str(refused.value)  # no budget figures for tables the model does not have


def test_a_shardwise_task_gives_its_budget_skew_and_precision():
    from shardwise.integrations.torchrec import ebc_on_meta
    from shardwise.workload import ShardingTask, TableSpec

    task = ShardingTask(num_devices=2, device_memory_bytes=GIB, batch_size=512, weights_precision="fp16",
                        tables=tuple(TableSpec(name=f"t{i}", rows=rows, dim=dim, pooling_factor=2.0, zipf_alpha=1.1)
                                     for i, (rows, dim) in enumerate(TABLES)))
    module = torch.nn.Module()
    module.sparse = ebc_on_meta(task)
    planner = ShardwisePlanner(task=task, method="size_greedy", device_type="cpu")
    planner.plan(module)
    assert planner.last_task == task  # nothing of the task lost on the way through the module


def test_pooling_of_a_table_serving_several_features_adds_up():
    from torchrec.distributed.planner import ParameterConstraints

    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, method="size_greedy",
                               constraints={"t0": ParameterConstraints(pooling_factors=[2.0, 3.5])})
    planner.plan(_model(TABLES))
    assert planner.last_task.table("t0").pooling_factor == 5.5
    assert planner.last_task.table("t1").pooling_factor == 1.0  # TorchRec's default


@pytest.mark.parametrize("constraint, expected", [
    ({"compute_kernels": ["dense"]}, "table 't2': compute_kernels \\['dense'\\] exclude 'fused'"),
    ({"sharding_types": ["table_row_wise"]}, "table 't2': sharding_types \\['table_row_wise'\\]: shardwise plans"),
    ({"sharding_types": ["grid_shard"]}, "table 't2'.*emits row_wise and data_parallel"),
    ({"sharding_types": ["data_parallel"], "compute_kernels": ["fused"]},
     "table 't2': compute_kernels \\['fused'\\] exclude 'dense': TorchRec's data-parallel sharding runs 'dense'"),
])
def test_constraints_shardwise_cannot_honour_are_refused_naming_the_table(constraint, expected):
    from torchrec.distributed.planner import ParameterConstraints

    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, method="size_greedy",
                               constraints={"t2": ParameterConstraints(**constraint)})
    with pytest.raises(PlannerError, match=expected):
        planner.plan(_model(TABLES))


def test_tables_restricted_to_row_wise_or_data_parallel_are_emitted_so_and_their_memory_reserved():
    """TorchRec executes row-wise and data-parallel shardings: the plan says them as TorchRec lays them out, the
    search places the rest in what they leave of each rank's memory, and the stats say the model did not cost them."""
    from torchrec.distributed.planner import ParameterConstraints

    from shardwise.workload.memory import activation_buffer_bytes, table_memory_bytes

    constraints = {"t2": ParameterConstraints(sharding_types=["row_wise", "table_row_wise"]),
                   "t5": ParameterConstraints(sharding_types=["data_parallel"])}
    planner = ShardwisePlanner(_topology(4, 2), batch_size=512, method="size_greedy", constraints=constraints)
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
    assert {s.table for s in planner.last_plan.shards} == {f"t{i}" for i in (0, 1, 3, 4, 6, 7)}
    # outputs: the row-wise table's partial sums for the step's samples (512 a rank x 4), the replica's for its rank's
    reserved = (table_memory_bytes(20000, 128) + table_memory_bytes(40000, 64)
                + activation_buffer_bytes(512 * 4, 128) + activation_buffer_bytes(512, 64))
    assert planner.last_task.device_memory_bytes == int(GIB * (1 - DEFAULT_STORAGE_RESERVATION)) - reserved
    assert "row-wise over every rank, not costed by the cost model" in planner.last_stats
    assert "data-parallel on every rank, not costed by the cost model (their constraints allow nothing else" \
        in planner.last_stats
    assert "the data-parallel and row-wise tables search chooses): t5" in planner.last_stats

    too_big = ShardwisePlanner(_topology(4, 2, hbm=2**20), batch_size=512, method="size_greedy",
                               constraints=constraints)
    with pytest.raises(PlannerError, match=f"^row-wise 't2', data-parallel 't5' need {reserved / 2**20:.2f} MiB on "
                                           "every rank, at least its 870.40 KiB budget"):
        too_big.plan(_model(TABLES))
    only = {f"t{i}": ParameterConstraints(sharding_types=["row_wise"]) for i in range(len(TABLES))}
    with pytest.raises(PlannerError, match="every table is restricted to row-wise or data-parallel"):
        ShardwisePlanner(_topology(4, 2), batch_size=512, method="size_greedy", constraints=only).plan(_model(TABLES))


def test_sequence_tables_are_planned_with_their_outputs_reserved_and_shared_names_kept_apart():
    from torchrec.distributed.planner import ParameterConstraints

    from shardwise.workload.memory import activation_buffer_bytes

    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, method="size_greedy",
                               constraints={"s0": ParameterConstraints(pooling_factors=[5.0])})
    model = _model(TABLES, with_sequence=True)
    sharding_plan = planner.plan(model)
    assert set(sharding_plan.plan) == {"sparse", "sequence"}
    assert sharding_plan.plan["sequence"]["s0"].sharding_type == "table_wise"
    assert planner.last_task.table("s0").pooling_factor == 5.0
    # a sequence table outputs one vector per id, not one per sample: the four extra vectors of each of the step's
    # samples (512 a rank x 2) are reserved
    expected = int(GIB * (1 - DEFAULT_STORAGE_RESERVATION)) - activation_buffer_bytes(512 * 2, 4 * 16)
    assert planner.last_task.device_memory_bytes == expected
    assert "sequence tables (EmbeddingCollection), costed as pooled lookups: s0" in planner.last_stats

    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    model.more = EmbeddingCollection(  # a second collection naming its table like one of the first's
        tables=[EmbeddingConfig(name="t0", embedding_dim=8, num_embeddings=10, feature_names=["g"])],
        device=torch.device("meta"))
    sharding_plan = ShardwisePlanner(_topology(2, 2), batch_size=512, method="size_greedy").plan(model)
    assert set(sharding_plan.plan["more"]) == {"t0"} and "t0" in sharding_plan.plan["sparse"]


def test_modules_shardwise_does_not_plan_are_named_and_left_to_torchrec(caplog):
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
    from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

    model = _model(TABLES, with_sequence=True)
    inner = EmbeddingBagCollection(  # its table is the feature-processed collection's, not shardwise's
        tables=[EmbeddingBagConfig(name="w0", embedding_dim=8, num_embeddings=100, feature_names=["f0"])],
        is_weighted=True, device=torch.device("meta"))
    model.weighted = FeatureProcessedEmbeddingBagCollection(
        inner, PositionWeightedModuleCollection({"f0": 10}, device=torch.device("meta")))
    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, method="size_greedy")
    with caplog.at_level(logging.WARNING, logger="shardwise.torchrec"):
        sharding_plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
    assert set(sharding_plan.plan) == {"sparse"}
    assert "FeatureProcessedEmbeddingBagCollection at 'weighted' is not planned" in caplog.text
    assert "EmbeddingCollection at 'sequence' has no sharder in `sharders`: not planned" in caplog.text


def test_a_forbidden_column_split_is_refused_and_an_allowed_one_planned():
    """A table too large for one device must be split: allowed, it is; table-wise only or min_partition too
    large, the planner says so by name instead of emitting a plan TorchRec would reject."""
    from torchrec.distributed.planner import ParameterConstraints

    big = [(400_000, 128), (1000, 16), (2000, 32)]  # t0: 400k x 128 fp32 + adagrad state: about 0.2 GiB
    topology = _topology(4, 4, hbm=int(0.12 * GIB))
    allowed = ShardwisePlanner(topology, batch_size=256, cost_model=FeatureCostModel(), storage_reservation=0.0)
    allowed.plan(_model(big))
    assert len([s for s in allowed.last_plan.shards if s.table == "t0"]) > 1
    for constraint, expected in (({"sharding_types": ["table_wise"]}, "the neuroshard plan splits it column-wise"),
                                 ({"min_partition": 128}, "the neuroshard plan splits it into .* min_partition 128")):
        planner = ShardwisePlanner(topology, batch_size=256, cost_model=FeatureCostModel(), storage_reservation=0.0,
                                   constraints={"t0": ParameterConstraints(**constraint)})
        with pytest.raises(PlannerError, match=f"table 't0': {expected}"):
            planner.plan(_model(big))


def test_the_stats_table_is_logged_per_plan(caplog):
    planner = ShardwisePlanner(_topology(2, 2), batch_size=512, cost_model=FeatureCostModel())
    with caplog.at_level(logging.INFO, logger="shardwise.torchrec"):
        planner.plan(_model(TABLES))
    stats = planner.last_stats
    assert stats is not None and stats in caplog.text
    assert "8 tables on 2 ranks (2 per host, 15% of memory reserved)" in stats
    assert "fwd ms" in stats and "memory GiB" in stats and "predicted plan cost" in stats


def test_the_champion_cost_model_is_found_by_default(tmp_path, monkeypatch):
    from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables

    from shardwise.costmodel import TrainConfig, train_cost_model

    frame = pd.concat([cost_frame({"a": synthetic_tables("a", 12, 0)}, {"a": 60}, 0), comm_rows(10, 0)],
                      ignore_index=True)
    frame["hardware_kind"] = hardware_kind("cpu")
    model, report = train_cost_model(frame, 0, TrainConfig(epochs=3, comm_epochs=3, progress=False))
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowService(uri).log_cost_model(model, report)

    planner = ShardwisePlanner(world_size=2, device_memory_bytes=GIB, batch_size=512, device_type="cpu",
                               tracking_uri=uri, adapt=0)  # these tables are new to it: adaptation has its own tests
    planner.plan(_model(TABLES))
    assert "predicted" in planner.last_plan.extra  # planned with the registered model

    empty = ShardwisePlanner(world_size=2, device_memory_bytes=GIB, batch_size=512, device_type="cpu",
                             tracking_uri=f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(PlannerError, match="no cost model at models:/shardwise-cost-.*@champion.*make run"):
        empty.plan(_model(TABLES))
