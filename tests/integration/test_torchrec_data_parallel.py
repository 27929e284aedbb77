"""A shardwise plan with a data-parallel table (and one with a row-wise table too) trained in TorchRec's
DistributedModelParallel (2 gloo processes, CPU; the row-wise one on 4 too): after a few SGD steps the sharded model's weights and outputs are
the unsharded model's, trained on both ranks' samples. A row-wise table's blocks train through the fused optimizer,
their partial outputs reduce-scattered. The table-wise and column-wise tables train through the fused optimizer, the data-parallel table through
DDP's all-reduce and a dense SGD; both average the gradient over the ranks (TorchRec divides the all-to-all's
backward by the ranks, as DDP does), so the unsharded model's loss is the mean of the ranks' losses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from service_processes import free_port
from torchrec_batches import random_kjt

from shardwise.search import Plan, Shard
from shardwise.workload import ShardingTask, TableSpec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORLD_SIZE = 2
BATCH_SIZE = 8  # per rank
LR = 0.1
STEPS = 3
TABLES = (
    TableSpec(name="t0", rows=50, dim=8, pooling_factor=3.0),
    TableSpec(name="t1", rows=40, dim=16, pooling_factor=2.0),
    TableSpec(name="t2", rows=30, dim=8, pooling_factor=4.0),
    TableSpec(name="t3", rows=20, dim=16, pooling_factor=2.0),
)
# table-wise, column-wise across both ranks, and t3 replicated on both
PLAN = Plan(
    num_devices=WORLD_SIZE,
    method="handmade",
    shards=(
        Shard(table="t0", col_offset=0, dim=8, device=0),
        Shard(table="t1", col_offset=0, dim=8, device=1),
        Shard(table="t1", col_offset=8, dim=8, device=0),
        Shard(table="t2", col_offset=0, dim=8, device=1),
    ),
    data_parallel=("t3",),
)
# the same with t2 split by rows over both ranks (15 rows each)
# and on 4 ranks: t2 in blocks of 8, 8, 8 and 6 rows
PLANS = {
    ("data_parallel", 2): PLAN,
    ("row_wise", 2): PLAN.model_copy(update={"shards": PLAN.shards[:3], "row_wise": ("t2",)}),
    ("row_wise", 4): Plan(num_devices=4, method="handmade", row_wise=("t2",), data_parallel=("t3",), shards=(
        Shard(table="t0", col_offset=0, dim=8, device=3), Shard(table="t1", col_offset=0, dim=8, device=1),
        Shard(table="t1", col_offset=8, dim=8, device=2))),
}
TASK = ShardingTask(num_devices=WORLD_SIZE, device_memory_bytes=2**30, batch_size=BATCH_SIZE * WORLD_SIZE,
                    tables=TABLES)


def _task(world_size: int) -> ShardingTask:
    return TASK.model_copy(update={"num_devices": world_size, "batch_size": BATCH_SIZE * world_size})



def _loss(pooled: dict[str, torch.Tensor]) -> torch.Tensor:
    """A fixed linear read-out of every table's pooled output, summed over the samples."""
    g = torch.Generator().manual_seed(7)
    return sum((pooled[t.name] * torch.randn(t.dim, generator=g)).sum() for t in TABLES)  # type: ignore[return-value]


def _worker(rank: int, port: int, out_dir: str, plan_name: str = "data_parallel", world_size: int = WORLD_SIZE) -> None:
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardwise.search.torchrec_plan import to_sharding_plan

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name])
                   for t in TABLES]
        torch.manual_seed(0)  # the same reference weights on every rank
        reference = torch.nn.Sequential()
        reference.add_module("ebc", EmbeddingBagCollection(tables=configs, device=torch.device("cpu")))
        full = {name.split(".")[-2]: w.detach().clone() for name, w in reference.state_dict().items()}

        model = torch.nn.Sequential()
        model.add_module("ebc", EmbeddingBagCollection(tables=configs, device=torch.device("meta")))
        sharders = [EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD,
                                                                "learning_rate": LR})]
        sharding_plan = to_sharding_plan(PLANS[plan_name, world_size], _task(world_size), module_path="ebc",
                                         device_type="cpu")
        dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=sharding_plan, sharders=sharders)
        held, blocks = [], []
        for name, value in dmp.state_dict().items():
            weight = full[name.split(".")[-2]]
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    (r0, c0), (rs, cs) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.detach().copy_(weight[r0 : r0 + rs, c0 : c0 + cs])
                    blocks.append((name.split(".")[-2], r0, rs))
            else:  # the data-parallel table: a replica
                value.detach().copy_(weight)
                held.append(name.split(".")[-2])
        # the replica trains through DDP's all-reduce: the dense optimizer is the only one that sees it
        dense = [p for n, p in dmp.named_parameters() if "t3" in n]
        assert dense, "the data-parallel table's replica is not among DMP's parameters"
        dense_optimizer = torch.optim.SGD(dense, lr=LR)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=LR)

        for step in range(STEPS):
            dense_optimizer.zero_grad()
            out = dmp(random_kjt(TABLES, BATCH_SIZE, 1000 * step + rank))
            out = out.wait() if hasattr(out, "wait") else out
            _loss(out.to_dict()).backward()  # the fused optimizer updates the sharded tables here
            dense_optimizer.step()
            # the unsharded model on the whole step's samples, every rank's
            reference_optimizer.zero_grad()
            mean = sum(_loss(reference.ebc(random_kjt(TABLES, BATCH_SIZE, 1000 * step + r)).to_dict())
                       for r in range(world_size)) / world_size
            mean.backward()
            reference_optimizer.step()

        check = random_kjt(TABLES, BATCH_SIZE, 1000 * STEPS + rank)
        got = dmp(check)
        got = got.wait() if hasattr(got, "wait") else got
        with torch.no_grad():
            expected = reference.ebc(check).to_dict()
        trained = {name.split(".")[-2]: w.detach().clone() for name, w in reference.state_dict().items()}
        replica = {n.split(".")[-2]: v.detach().clone() for n, v in dmp.state_dict().items()
                   if not isinstance(v, ShardedTensor)}
        local = {n.split(".")[-2]: s.tensor.detach().clone() for n, v in dmp.state_dict().items()
                 if isinstance(v, ShardedTensor) for s in v.local_shards()}
        torch.save({"got": {k: v.detach() for k, v in got.to_dict().items()}, "expected": expected, "held": held,
                    "replica": replica, "trained": trained, "initial": full, "blocks": blocks, "local": local},
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("plan_name", "world_size"), sorted(PLANS))
def test_a_data_parallel_and_a_row_wise_plan_train_in_dmp_as_the_unsharded_model(tmp_path, monkeypatch, plan_name,
                                                                                 world_size):
    # the spawned workers import this module by its importlib-mode name: they need the repository root on sys.path
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    torch.multiprocessing.spawn(_worker, args=(free_port(), str(tmp_path), plan_name, world_size), nprocs=world_size,
                                join=True)
    for rank in range(world_size):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        if plan_name == "row_wise":
            # each rank holds its block of t2's rows, ceil(30 / ranks), trained as the unsharded table's rows
            size = -(-30 // world_size)
            lo, rows = size * rank, min(size, 30 - size * rank)
            assert ("t2", lo, rows) in result["blocks"]
            block = result["local"]["t2"]
            assert not torch.allclose(block, result["initial"]["t2"][lo : lo + rows])
            torch.testing.assert_close(block, result["trained"]["t2"][lo : lo + rows], rtol=1e-5, atol=1e-6)
        assert result["held"] == ["t3"]  # a replica of the data-parallel table on every rank, nothing else dense
        # training moved the replica, and exactly as the unsharded model's table
        assert not torch.allclose(result["replica"]["t3"], result["initial"]["t3"])
        torch.testing.assert_close(result["replica"]["t3"], result["trained"]["t3"], rtol=1e-5, atol=1e-6)
        for name, expected in result["expected"].items():
            torch.testing.assert_close(result["got"][name], expected, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, name=name, rank=rank: f"rank {rank}, {name}: {m}")


def test_the_drop_in_planner_emits_the_tables_its_search_replicates():
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # search_doubles
    from search_doubles import FeatureCostModel
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardwise.costmodel.data_parallel import AllReduceCost
    from shardwise.integrations.torchrec import ShardwisePlanner

    class CommHeavy(FeatureCostModel):  # wide, rarely looked-up tables are worth replicating
        def predict_comm(self, widths, compute_ms):  # noqa: ANN001, ANN201 - as FeatureCostModel's
            return 20 * super().predict_comm(widths, compute_ms)

    model = CommHeavy()
    model.all_reduce = AllReduceCost(0.001, 0.0, 0.1)  # type: ignore[attr-defined]
    configs = [EmbeddingBagConfig(name=f"big{i}", embedding_dim=64, num_embeddings=100_000, feature_names=[f"big{i}"])
               for i in range(6)]
    configs += [EmbeddingBagConfig(name=f"s{i}", embedding_dim=128, num_embeddings=100, feature_names=[f"s{i}"])
                for i in range(6)]
    module = torch.nn.Sequential()
    module.add_module("ebc", EmbeddingBagCollection(tables=configs, device=torch.device("meta")))
    # uneven lookups: TorchRec's greedy proposal, also in the running, is not as balanced as the search's plan
    lookups = {f"big{i}": ParameterConstraints(pooling_factors=[p]) for i, p in enumerate([1.0, 2.0, 3.0, 5.0, 8.0, 13.0])}
    planner = ShardwisePlanner(world_size=4, batch_size=1024, device_memory_bytes=2**30, storage_reservation=0.0,
                               device_type="cpu", cost_model=model, adapt=0, constraints=lookups)
    params = planner.plan(module).plan["ebc"]
    assert "the plan: shardwise's neuroshard search" in planner.last_stats
    replicated = planner.last_plan.data_parallel
    assert replicated and set(replicated) <= {f"s{i}" for i in range(6)}
    for name in replicated:
        assert (params[name].sharding_type, params[name].compute_kernel, params[name].ranks) == (
            "data_parallel", "dense", [0, 1, 2, 3])
    assert f"{len(replicated)} data_parallel (dense)" in planner.last_stats


def test_the_drop_in_planner_emits_the_tables_its_search_splits_by_rows():
    """TorchRec's sharders offer row-wise sharding on GPUs (not on a CPU topology): the search takes it where the
    sharders and constraints allow, and the plan lays it out in TorchRec's blocks."""
    import sys

    import numpy as np

    sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # search_doubles
    from search_doubles import FeatureCostModel
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardwise.costmodel.data_parallel import AllReduceCost
    from shardwise.integrations.torchrec import ShardwisePlanner

    class PerIdCost(FeatureCostModel):  # a cost per id looked up: splitting by rows spreads the ids
        def table_embeddings(self, tables):  # noqa: ANN001, ANN201 - as FeatureCostModel's
            return np.array([[1.0, t.pooling_factor * (t.dim + 256), t.rows * t.dim] for t in tables]).reshape(-1, 3)

    model = PerIdCost()
    model.reduce_scatter = AllReduceCost(0.01, 0.0, 0.05, collective="reduce_scatter")  # type: ignore[attr-defined]
    configs = [EmbeddingBagConfig(name="hot", embedding_dim=64, num_embeddings=400_000, feature_names=["hot"])]
    configs += [EmbeddingBagConfig(name=f"t{i}", embedding_dim=32, num_embeddings=20_000, feature_names=[f"t{i}"])
                for i in range(8)]
    module = torch.nn.Sequential()
    module.add_module("ebc", EmbeddingBagCollection(tables=configs, device=torch.device("meta")))
    options = {"world_size": 4, "batch_size": 1024, "device_memory_bytes": 2**30, "storage_reservation": 0.0,
               "device_type": "cuda", "cost_model": model, "adapt": 0,
               "constraints": {"hot": ParameterConstraints(pooling_factors=[100.0])}}
    planner = ShardwisePlanner(**options)
    params = planner.plan(module).plan["ebc"]
    assert "the plan: shardwise's neuroshard search" in planner.last_stats
    assert planner.last_plan.row_wise == ("hot",)
    assert (params["hot"].sharding_type, params["hot"].compute_kernel, params["hot"].ranks) == (
        "row_wise", "fused", [0, 1, 2, 3])
    assert [m.shard_sizes[0] for m in params["hot"].sharding_spec.shards] == [100_000] * 4
    assert "1 row_wise (fused)" in planner.last_stats
    # constraints without row-wise: the plan keeps to them
    forbidding = {"hot": ParameterConstraints(sharding_types=["table_wise", "column_wise"], pooling_factors=[100.0])}
    kept = ShardwisePlanner(**{**options, "constraints": forbidding})
    hot = kept.plan(module).plan["ebc"]["hot"]
    assert hot.sharding_type in ("table_wise", "column_wise") and not kept.last_plan.row_wise
    assert "row_wise" not in (kept.last_task.table("hot").sharding_types or ())
    on_cpu = ShardwisePlanner(**{**options, "device_type": "cpu"})
    assert on_cpu.plan(module).plan["ebc"]["hot"].sharding_type != "row_wise"
