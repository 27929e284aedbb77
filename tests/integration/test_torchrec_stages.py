"""Each of shardwise's TorchRec stages on its own inside TorchRec's stock `EmbeddingShardingPlanner` (TorchRec's
defaults for every other stage), the stages that need one sharing a `ShardwiseSearch` given at construction, planning
a small `EmbeddingBagCollection` on meta; and all of them together planning as `ShardwisePlanner` does."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from search_doubles import FeatureCostModel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import Topology
from torchrec.distributed.types import ShardingPlan

from shardwise.integrations.torchrec import (
    PlacedPartitioner,
    ShardwiseEnumerator,
    ShardwisePerfModel,
    ShardwisePlanner,
    ShardwiseProposer,
    ShardwiseSearch,
    ShardwiseStats,
)
from shardwise.search import validate_plan
from shardwise.workload import TableSpec

pytestmark = pytest.mark.integration

GIB = 2**30
BATCH = 512
#: (rows, dim): t2 is the widest and largest, so that a search on 2 ranks splits it
TABLES = [(5000, 64), (200, 16), (80000, 128), (3000, 32), (100, 8), (40000, 64), (900, 32), (7000, 16)]


def _topology() -> Topology:
    return Topology(world_size=2, compute_device="cuda", hbm_cap=GIB)


def _model(tables: Sequence[tuple[int, int]] = TABLES) -> torch.nn.Module:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    model = torch.nn.Module()
    model.sparse = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, (rows, dim) in enumerate(tables)], device=torch.device("meta"))
    return model


def _search() -> ShardwiseSearch:
    return ShardwiseSearch(_topology(), cost_model=FeatureCostModel())


def _stock(**stages) -> EmbeddingShardingPlanner:  # noqa: ANN003 - TorchRec's stage arguments
    """TorchRec's planner with `stages` in place of its own, every other argument and stage TorchRec's."""
    return EmbeddingShardingPlanner(topology=_topology(), batch_size=BATCH,
                                    storage_reservation=FixedPercentageStorageReservation(0.0), **stages)


def _plan(planner: EmbeddingShardingPlanner) -> ShardingPlan:
    return planner.plan(_model(), [EmbeddingBagCollectionSharder()])


def _placed(sharding_plan: ShardingPlan) -> dict[str, tuple[str, list[tuple[int, int, int]]]]:
    """Each table's sharding type and its shards' (column offset, width, rank)."""
    return {name: (p.sharding_type, sorted((m.shard_offsets[1], m.shard_sizes[1], m.placement.rank())
                                           for m in p.sharding_spec.shards))
            for name, p in sharding_plan.plan["sparse"].items()}


def test_the_enumerator_offers_torchrecs_options_and_the_searchs_column_splits():
    enumerator = ShardwiseEnumerator(topology=_topology(), batch_size=BATCH)
    sharding_plan = _plan(_stock(enumerator=enumerator))
    assert set(sharding_plan.plan["sparse"]) == {f"t{i}" for i in range(len(TABLES))}
    theirs = EmbeddingEnumerator(topology=_topology(), batch_size=BATCH).enumerate(
        _model(), [EmbeddingBagCollectionSharder()])
    ours = enumerator.enumerate(_model(), [EmbeddingBagCollectionSharder()])
    assert enumerator.splits and len(ours) == len(theirs) + len(enumerator.splits)
    assert [(o.fqn, o.sharding_type, o.compute_kernel) for o in enumerator.torchrec_options(ours)] == [
        (o.fqn, o.sharding_type, o.compute_kernel) for o in theirs]
    assert {len(o.shards) for o in enumerator.splits} == {2}  # t2's halves on 2 ranks, each at least 4 columns


def test_the_proposer_proposes_the_searchs_plan():
    search = _search()
    sharding_plan = _plan(_stock(proposer=ShardwiseProposer(search)))
    assert search.last_plan is not None and search.last_task is not None  # the search ran in TorchRec's planner
    validate_plan(search.last_plan, search.last_task)
    assert {t.name for t in search.last_task.tables} == set(sharding_plan.plan["sparse"])
    assert search.space is not None and len(search.space.tables) == len(TABLES)


def test_the_partitioner_without_placed_shards_places_as_torchrecs():
    assert _placed(_plan(_stock(partitioner=PlacedPartitioner()))) == _placed(_plan(_stock()))


class RowsCostModel(FeatureCostModel):
    """A cost model that disagrees with TorchRec's estimator: a table costs its rows (lookups cost nothing)."""

    def table_embeddings(self, tables: Sequence[TableSpec]) -> np.ndarray:
        return np.array([[1.0, 0.0, t.rows * 1e4] for t in tables]).reshape(-1, 3)


def _offering(sharding_type: str) -> EmbeddingBagCollectionSharder:
    class Offering(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return [sharding_type]

    return Offering()


def test_the_perf_model_picks_the_proposal_the_cost_model_rates_fastest():
    perf_model = ShardwisePerfModel(ShardwiseSearch(_topology(), cost_model=RowsCostModel()))
    stock = _stock()
    theirs = _plan(stock)
    rated = _stock(performance_model=perf_model)
    ours = _plan(rated)
    # TorchRec's proposers propose the same proposals to both planners; the cost model picks another
    assert _placed(ours) != _placed(theirs)
    assert rated._best_plan is not None and stock._best_plan is not None
    assert perf_model.rate(rated._best_plan) < perf_model.rate(stock._best_plan)


def test_the_perf_model_rates_what_its_cost_model_cannot_price_in_its_units():
    """Row-wise shards, which the cost model has no line for, are TorchRec's estimates scaled to the cost model's
    ms by the same tables: a plan of them is rated in the unit a table-wise plan of the same tables is."""
    perf_model = ShardwisePerfModel(_search())
    rated = {}
    tables = TABLES[:4]  # TorchRec's proposers rate thousands of proposals of the 8 (4 s on 2 cores), 4 are enough
    for sharding_type in ("table_wise", "row_wise"):
        planner = _stock(performance_model=perf_model)
        planner.plan(_model(tables), [_offering(sharding_type)])
        assert planner._best_plan is not None
        rated[sharding_type] = perf_model.rate(planner._best_plan)
        by_torchrec = perf_model.costs(planner._best_plan).by_torchrec
        assert len(by_torchrec) == (0 if sharding_type == "table_wise" else len(tables))
        assert all("(row_wise, " in table for table in by_torchrec)
    assert 0.1 < rated["row_wise"] / rated["table_wise"] < 10, rated  # unscaled, TorchRec's ms are 100x smaller


def test_the_stats_account_for_a_plan_it_did_not_search(caplog):
    stats = ShardwiseStats(_search())
    with caplog.at_level(logging.INFO, logger="shardwise.torchrec"):
        _plan(_stock(stats=stats))
    assert stats.last is not None and stats.last in caplog.text
    assert stats.last.startswith("ShardwisePlanner: 8 tables on 2 ranks")
    assert "the plan: the planner's proposers' (no ShardwiseProposer among them)" in stats.last
    assert "predicted ms" in stats.last


def test_the_stages_together_in_torchrecs_planner_plan_as_shardwise_planner():
    search = _search()
    enumerator = ShardwiseEnumerator(topology=_topology(), batch_size=BATCH)
    stats = ShardwiseStats(search)
    theirs = _plan(_stock(enumerator=enumerator, proposer=ShardwiseProposer(search), partitioner=PlacedPartitioner(),
                          performance_model=ShardwisePerfModel(search), stats=stats))
    planner = ShardwisePlanner(_topology(), batch_size=BATCH, storage_reservation=0.0, cost_model=FeatureCostModel())
    ours = _plan(planner)
    assert _placed(theirs) == _placed(ours)
    assert "the plan: shardwise's neuroshard search" in stats.last
