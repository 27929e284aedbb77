"""An exported shardwise plan run in TorchRec's DistributedModelParallel (2 gloo processes, CPU): the sharded model
computes what the unsharded one does. (The drop-in `ShardwisePlanner` in DMP: test_torchrec_dmp_models.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from service_processes import free_port
from torchrec_batches import random_kjt

from shardwise.search import Plan, Shard
from shardwise.workload import ShardingTask, TableSpec

pytestmark = pytest.mark.integration

WORLD_SIZE = 2
BATCH_SIZE = 8
TABLES = (
    TableSpec(name="t0", rows=50, dim=8, pooling_factor=3.0),
    TableSpec(name="t1", rows=40, dim=16, pooling_factor=2.0),
    TableSpec(name="t2", rows=30, dim=8, pooling_factor=4.0),
    TableSpec(name="t3", rows=60, dim=16, pooling_factor=1.0),
)
# table-wise on both ranks, plus two column-wise tables split across (and back onto) the ranks
PLAN = Plan(
    num_devices=WORLD_SIZE,
    method="handmade",
    shards=(
        Shard(table="t0", col_offset=0, dim=8, device=0),
        Shard(table="t1", col_offset=0, dim=8, device=1),
        Shard(table="t1", col_offset=8, dim=8, device=0),
        Shard(table="t2", col_offset=0, dim=8, device=1),
        Shard(table="t3", col_offset=0, dim=4, device=0),
        Shard(table="t3", col_offset=4, dim=12, device=1),
    ),
)
TASK = ShardingTask(num_devices=WORLD_SIZE, device_memory_bytes=2**30, batch_size=BATCH_SIZE, tables=TABLES)



def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardwise.search.torchrec_plan import to_sharding_plan

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        configs = [
            EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name])
            for t in TABLES
        ]
        torch.manual_seed(0)  # the same reference weights on every rank
        reference = torch.nn.Sequential()
        reference.add_module("ebc", EmbeddingBagCollection(tables=configs, device=torch.device("cpu")))
        full = {name.split(".")[-2]: w.detach().clone() for name, w in reference.state_dict().items()}

        model = torch.nn.Sequential()
        model.add_module("ebc", EmbeddingBagCollection(tables=configs, device=torch.device("meta")))
        sharders = [EmbeddingBagCollectionSharder()]
        sharding_plan = to_sharding_plan(PLAN, TASK, module_path="ebc", device_type="cpu")
        # the fused kernel: the dense one on CPU may silently get backward wrong (ENVIRONMENT.md)
        dmp = DistributedModelParallel(
            model, device=torch.device("cpu"), plan=sharding_plan, sharders=sharders
        )
        # DMP re-initialises the tables: copy the reference weights into this rank's shards
        local_shapes = []
        for name, value in dmp.state_dict().items():
            assert isinstance(value, ShardedTensor), name
            weight = full[name.split(".")[-2]]
            for shard in value.local_shards():
                (r0, c0), (rs, cs) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.detach().copy_(weight[r0 : r0 + rs, c0 : c0 + cs])
                local_shapes.append((name.split(".")[-2], c0, cs))

        batch = random_kjt(TABLES, BATCH_SIZE, 100 + rank)
        sharded = dmp(batch)
        sharded = sharded.wait() if hasattr(sharded, "wait") else sharded
        expected = reference.ebc(batch).to_dict()
        got = sharded.to_dict()  # keys come grouped by rank: compare by key, never by position
        torch.save(
            {"expected": expected, "got": got, "local_shards": local_shapes}, Path(out_dir) / f"rank{rank}.pt"
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_plan_runs_in_dmp_and_matches_unsharded(tmp_path, monkeypatch):
    # the spawned workers import this module by its importlib-mode name (tests.integration...): they need the
    # repository root on sys.path, which `python -m pytest` adds and a plain `pytest` does not
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    torch.multiprocessing.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    shards = PLAN.shards
    owned = set()
    for rank in range(WORLD_SIZE):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert set(result["got"]) == {t.name for t in TABLES}
        for name, expected in result["expected"].items():
            torch.testing.assert_close(result["got"][name], expected, rtol=1e-5, atol=1e-5)
        owned |= {(rank, table, c0, cs) for table, c0, cs in result["local_shards"]}
    # each rank holds exactly the column slices the plan put on it
    assert owned == {(s.device, s.table, s.col_offset, s.dim) for s in shards}
