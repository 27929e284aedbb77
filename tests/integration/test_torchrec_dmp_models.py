"""TorchRec's own models planned by the drop-in `ShardwisePlanner` and run in `DistributedModelParallel`: DLRM,
DLRM_DCN and a model with sequence embeddings (`EmbeddingCollection`), on 2 ranks and on 4 ranks with 2 ranks per
simulated host (gloo, CPU). Memory is tight enough that a table must be split column-wise, one table is
restricted to row-wise and one to data-parallel (TorchRec's sharders offer row-wise on GPUs only: the bags' sharder
here offers it on CPU too, as gloo runs it, and the other bags' constraints keep to the types offered on CPU); each
sharded model computes what the unsharded one does, and each rank holds exactly the shards the plan gave it."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DIM = 16
BATCH = 8  # per rank
DENSE_IN = 4
#: (name, rows, lookups per sample) of the bag tables: t0 cannot fit on one rank, t2 is row-wise only, t3
#: data-parallel only
BAGS = (("t0", 4000, 3), ("t1", 300, 2), ("t2", 500, 2), ("t3", 200, 1), ("t4", 800, 4), ("t5", 150, 1))
#: (name, rows, dim, lookups per sample) of the sequence tables
SEQUENCES = (("s0", 200, DIM, 3), ("s1", 120, DIM, 2))  # one dim per EmbeddingCollection
MODELS = ("dlrm", "dlrm_dcn", "sequence")
ROWS = {n: r for n, r, _ in BAGS} | {n: r for n, r, _, _ in SEQUENCES}


class SequenceModel(nn.Module):
    """Pooled bags and sequence embeddings side by side, as a two-tower or a transformer's input would use them."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        from torchrec.modules.embedding_configs import EmbeddingConfig
        from torchrec.modules.embedding_modules import EmbeddingCollection

        self.bags = _bags(device)
        self.sequence = EmbeddingCollection(
            tables=[EmbeddingConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"])
                    for n, r, d, _ in SEQUENCES], device=device)

    def forward(self, bags, sequence):  # noqa: ANN001, ANN201 - KeyedJaggedTensors in, tensors out
        pooled = self.bags(bags).to_dict()  # a sharded collection's keys come grouped by rank: take them by name
        embedded = self.sequence(sequence)
        return torch.cat([pooled[f"f_{n}"] for n, *_ in BAGS], dim=1), torch.cat([embedded[f"f_{n}"].values().flatten() for n, *_ in SEQUENCES])


def _bags(device: torch.device):  # noqa: ANN202 - an EmbeddingBagCollection
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=r, feature_names=[f"f_{n}"])
                for n, r, _ in BAGS], device=device)


def _model(kind: str, device: torch.device) -> nn.Module:
    from torchrec.models.dlrm import DLRM, DLRM_DCN

    if kind == "sequence":
        return SequenceModel(device)
    dense = torch.device("cpu")
    if kind == "dlrm":
        return DLRM(_bags(device), DENSE_IN, [8, DIM], [8, 1], dense_device=dense)
    return DLRM_DCN(_bags(device), DENSE_IN, [8, DIM], [8, 1], dcn_num_layers=2, dcn_low_rank_dim=4,
                    dense_device=dense)


def _jagged(tables, rank: int, seed: int):  # noqa: ANN001, ANN202 - (name, rows, lookups) -> KeyedJaggedTensor
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed + rank)
    lengths = [torch.randint(0, 2 * lookups + 1, (BATCH,), generator=g) for _, _, lookups in tables]
    values = [torch.randint(0, rows, (int(n.sum()),), generator=g) for (_, rows, _), n in zip(tables, lengths)]
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{name}" for name, *_ in tables], values=torch.cat(values),
                                               lengths=torch.cat(lengths))


def _inputs(kind: str, rank: int) -> tuple:
    bags = _jagged(BAGS, rank, 100)
    if kind == "sequence":
        return bags, _jagged([(n, r, k) for n, r, _, k in SEQUENCES], rank, 200)
    return torch.randn(BATCH, DENSE_IN, generator=torch.Generator().manual_seed(300 + rank)), bags


def _sharders() -> list:
    """TorchRec's sharders of both collections, the bags' offering row-wise on CPU too."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    class RowWiseOnCpu(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            types = super().sharding_types(compute_device_type)
            return types if "row_wise" in types else [*types, "row_wise"]

    return [RowWiseOnCpu(), EmbeddingCollectionSharder()]


def _planner(world_size: int):  # noqa: ANN202 - a ShardwisePlanner whose memory forces a column split
    from search_doubles import FeatureCostModel
    from torchrec.distributed.comm import get_local_size
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.types import Topology

    from shardwise.integrations.torchrec import ShardwisePlanner
    from shardwise.workload import TableSpec
    from shardwise.workload.memory import shard_memory_bytes

    batch = BATCH * world_size
    # the bags other than t2 and t3 with the sharding types TorchRec offers on CPU (no row-wise)
    constraints = {name: ParameterConstraints(sharding_types=["table_wise", "column_wise", "data_parallel"],
                                              pooling_factors=[float(k)]) for name, _, k in BAGS}
    constraints |= {name: ParameterConstraints(pooling_factors=[float(k)]) for name, _, _, k in SEQUENCES}
    constraints["t2"] = ParameterConstraints(sharding_types=["row_wise"], pooling_factors=[2.0])
    constraints["t3"] = ParameterConstraints(sharding_types=["data_parallel"], pooling_factors=[1.0])
    everything = [TableSpec(name=n, rows=r, dim=DIM, pooling_factor=1.0) for n, r, _ in BAGS] + [
        TableSpec(name=n, rows=r, dim=d, pooling_factor=1.0) for n, r, d, _ in SEQUENCES]
    largest = shard_memory_bytes(everything[:1], batch)
    # t0 alone is over a rank's memory; everything spread evenly fits with room to spare
    memory = min(int(0.9 * largest), 2 * shard_memory_bytes(everything, batch) // world_size)
    # the ranks per host as torchrun gives them (LOCAL_WORLD_SIZE), as TorchRec's planner reads them
    topology = Topology(world_size=world_size, compute_device="cpu", local_world_size=get_local_size(world_size),
                        ddr_cap=memory)
    return ShardwisePlanner(topology, batch_size=BATCH, storage_reservation=0.0, constraints=constraints,
                            cost_model=FeatureCostModel())


def _copy_weights(dmp: nn.Module, reference: nn.Module) -> list[tuple[str, int, int, int, int]]:
    """Copy the reference weights into this rank's shards; (table, row offset, rows, col offset, cols) held."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    full = reference.state_dict()
    held = []
    for name, value in dmp.state_dict().items():
        weight = full[name]
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                (r0, c0), (rs, cs) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.detach().copy_(weight[r0 : r0 + rs, c0 : c0 + cs])
                held.append((name.split(".")[-2], r0, rs, c0, cs))
        else:  # dense layers and data-parallel tables: replicated
            value.detach().copy_(weight)
            if name.endswith(".weight") and ("embedding_bags." in name or "embeddings." in name):
                held.append((name.split(".")[-2], 0, weight.shape[0], 0, weight.shape[1]))
    return held


def _placed(plan, world_size: int, rows: dict[str, int]) -> set[tuple[int, str, int, int, int, int]]:  # noqa: ANN001
    """(rank, table, row offset, rows, col offset, cols) of every shard a ShardingPlan places (a data-parallel table:
    all of it on every rank)."""
    placed = set()
    for params in plan.plan.values():
        for table, param in params.items():
            if param.sharding_spec is None:
                placed |= {(r, table, 0, rows[table], 0, DIM) for r in range(world_size)}
                continue
            for meta in param.sharding_spec.shards:
                (r0, c0), (rs, cs) = meta.shard_offsets, meta.shard_sizes
                placed.add((meta.placement.rank(), table, r0, rs, c0, cs))
    return placed


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel

    sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # search_doubles
    torch.set_num_threads(1)
    # 2 ranks per simulated host, as torchrun sets them
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE="2", LOCAL_RANK=str(rank % 2))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    results = {}
    try:
        for kind in MODELS:
            torch.manual_seed(0)  # the same reference weights on every rank
            reference = _model(kind, torch.device("cpu"))
            model = _model(kind, torch.device("meta"))
            sharders = _sharders()
            planner = _planner(world_size)
            plan = planner.collective_plan(model, sharders, dist.group.WORLD)
            dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
            held = _copy_weights(dmp, reference)
            inputs = _inputs(kind, rank)
            with torch.no_grad():
                got, expected = dmp(*inputs), reference(*inputs)
            results[kind] = {
                "got": got, "expected": expected, "held": held,
                "planned": [(s.table, s.col_offset, s.dim, s.device) for s in planner.last_plan.shards]
                if rank == 0 else None,
                "placed": _placed(plan, world_size, ROWS) if rank == 0 else None,
                "stats": planner.last_stats if rank == 0 else None,
            }
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world_size", [2, 4], ids=["2-ranks", "4-ranks-2-per-host"])
def test_torchrec_models_planned_by_shardwise_match_unsharded(world_size, tmp_path, monkeypatch):
    # the spawned workers import this module by its importlib-mode name: they need the repository root on sys.path
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    torch.multiprocessing.spawn(_worker, args=(world_size, _free_port(), str(tmp_path)), nprocs=world_size, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    for kind in MODELS:
        first = ranks[0][kind]
        assert f"on {world_size} ranks (2 per host" in first["stats"]
        assert "the plan: shardwise's neuroshard search" in first["stats"], first["stats"]
        assert "not searched by shardwise, their own option kept: t2 (" in first["stats"]
        planned = first["planned"]
        assert len([s for s in planned if s[0] == "t0"]) > 1, f"{kind}: t0 must be split to fit: {planned}"
        # the search's shards, t2 in row blocks and t3 replicated, as the plan DMP was given places them
        searched = {(rank, table, 0, ROWS[table], col, dim) for table, col, dim, rank in planned}
        block = -(-ROWS["t2"] // world_size)
        blocks = {(r, "t2", r * block, min(block, ROWS["t2"] - r * block), 0, DIM) for r in range(world_size)}
        replicas = {(r, "t3", 0, ROWS["t3"], 0, DIM) for r in range(world_size)}
        assert first["placed"] == searched | blocks | replicas, kind
        held = {(rank, *shard) for rank in range(world_size) for shard in ranks[rank][kind]["held"]}
        assert held == first["placed"], kind
        for rank in range(world_size):
            result = ranks[rank][kind]
            torch.testing.assert_close(result["got"], result["expected"], rtol=1e-4, atol=1e-5,
                                       msg=lambda m, kind=kind, rank=rank: f"{kind}, rank {rank}: {m}")
