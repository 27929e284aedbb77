"""TorchRec's `DLRM_DCN` over the MLPerf DLRM-DCNv2 tables (rows scaled down to 2 cores), its constraints, its
batches and a few training steps under `DistributedModelParallel`: the real client the DMP tests plan for."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

WORLD_SIZE = 2
BATCH = 8  # per rank
DENSE_IN = 13  # Criteo's dense features
ROW_SCALE = 1e-4  # the 40M-row tables keep 4,000 rows
STEPS = 3


@contextlib.contextmanager
def gloo_rank(rank: int, out_dir: str) -> Iterator[None]:
    """This process as rank `rank` of a gloo group of WORLD_SIZE meeting in `out_dir`, one thread: a rank left
    waiting on a broadcast fails within a minute instead of gloo's 30."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{Path(out_dir) / 'rendezvous'}", rank=rank,
                            world_size=WORLD_SIZE, timeout=datetime.timedelta(seconds=60))
    try:
        yield
    finally:
        dist.destroy_process_group()


def dcnv2_tables(row_scale: float = ROW_SCALE):  # noqa: ANN201 - the DCNv2 TableSpecs
    from shardwise.workload import mlperf_dcnv2_tables

    return mlperf_dcnv2_tables(row_scale)


def dcnv2(device: torch.device, row_scale: float = ROW_SCALE, rows: dict[str, int] | None = None) -> nn.Module:
    """TorchRec's DLRM_DCN over the 26 DCNv2 tables (dim 128; the dense layers narrowed to keep the tests cheap);
    `rows` overrides some tables' rows."""
    from torchrec.models.dlrm import DLRM_DCN
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=(rows or {}).get(t.name, t.rows),
                                  feature_names=[f"cat_{i}"]) for i, t in enumerate(dcnv2_tables(row_scale))]
    dim = configs[0].embedding_dim
    return DLRM_DCN(EmbeddingBagCollection(tables=configs, device=device), DENSE_IN, [32, dim], [32, 1],
                    dcn_num_layers=2, dcn_low_rank_dim=8, dense_device=torch.device("cpu"))


def dcnv2_constraints():  # noqa: ANN201 - TorchRec's ParameterConstraints: each table's multi-hot size
    from torchrec.distributed.planner import ParameterConstraints

    return {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in dcnv2_tables()}


def dcnv2_sharders() -> list:
    """The sharder a DCNv2 training job passes: the fused row-wise Adagrad in backward."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return [EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1})]


def dcnv2_batch(rank: int, step: int):  # noqa: ANN201 - (dense, KeyedJaggedTensor, labels) with each table's hotness
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1000 * rank + step)
    tables = dcnv2_tables()
    lengths = [torch.full((BATCH,), int(t.pooling_factor)) for t in tables]
    values = [torch.randint(0, t.rows, (BATCH * int(t.pooling_factor),), generator=g) for t in tables]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"cat_{i}" for i in range(len(tables))],
                                              values=torch.cat(values), lengths=torch.cat(lengths))
    return torch.randn(BATCH, DENSE_IN, generator=g), kjt, torch.randint(0, 2, (BATCH,), generator=g).float()


def train_dcnv2(plan, rank: int, steps: int = STEPS) -> dict:  # noqa: ANN001 - a TorchRec ShardingPlan
    """`steps` training steps of DLRM_DCN sharded by `plan` on this rank: the losses, whether each local embedding
    shard changed (the fused optimizer ran), and the dense parameters."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    torch.manual_seed(0)
    model = DistributedModelParallel(dcnv2(torch.device("meta")), device=torch.device("cpu"), plan=plan,
                                     sharders=dcnv2_sharders())
    before = {k: v.local_shards()[0].tensor.clone() for k, v in model.state_dict().items()
              if isinstance(v, ShardedTensor) and v.local_shards()}
    optimizer = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                      lambda params: torch.optim.SGD(params, lr=0.1))
    losses = []
    for step in range(steps):
        dense, kjt, labels = dcnv2_batch(rank, step)
        optimizer.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(dense, kjt).squeeze(-1), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    state = model.state_dict()
    return {"losses": losses,
            "changed": {k: bool((state[k].local_shards()[0].tensor != v).any()) for k, v in before.items()},
            "dense": {k: v.detach().clone() for k, v in state.items() if not isinstance(v, ShardedTensor)}}
