"""`ShardwiseStats` says when the plan's slowest rank holds one table alone, as `shardwise plan` does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from shardwise.integrations.torchrec import ShardwisePlanner

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from search_doubles import FeatureCostModel, WidthFreeCostModel  # noqa: E402

pytestmark = pytest.mark.integration

#: (rows, dim, pooling factor): t0 looks up 400 ids per sample, about 4x a balanced rank's share of the work on 4 ranks
TABLES = [(5000, 128, 400.0), *((3000, 32, 5.0) for _ in range(7))]


def _plan(cost_model: FeatureCostModel) -> ShardwisePlanner:
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.types import Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    model = torch.nn.Module()
    model.sparse = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, (rows, dim, _) in enumerate(TABLES)], device=torch.device("meta"))
    # table-wise or column-wise slices down to 32 wide: what NeuroShard searches with a model that has no collectives
    constraints = {f"t{i}": ParameterConstraints(sharding_types=["table_wise", "column_wise"], min_partition=32,
                                                 pooling_factors=[pooling]) for i, (_, _, pooling) in enumerate(TABLES)}
    planner = ShardwisePlanner(Topology(world_size=4, compute_device="cuda", hbm_cap=2**30), batch_size=512,
                               constraints=constraints, cost_model=cost_model)
    planner.plan(model)
    return planner


def test_the_stats_name_a_table_alone_on_the_slowest_rank_and_nothing_where_it_was_split():
    whole = _plan(WidthFreeCostModel())  # a half costs what the whole does: t0 stays whole, alone on its rank
    rank = next(s.device for s in whole.last_plan.shards if s.table == "t0")
    assert whole.last_stats is not None and f"t0 alone on device {rank}: " in whole.last_stats
    assert "ms predicted, balanced share" in whole.last_stats
    split = _plan(FeatureCostModel())  # halves pay: t0 is split by columns, no rank holds one shard alone
    assert sum(s.table == "t0" for s in split.last_plan.shards) >= 2
    assert split.last_stats is not None and "alone on device" not in split.last_stats
