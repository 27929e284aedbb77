"""A TorchRec `PerfModel` that rates a placed proposal by shardwise's cost model: the predicted slowest rank
(kernels, all-to-alls, data-parallel and row-wise collectives). Shards the model has not measured (other kernels
and sharding types, collectives it has no line for) get TorchRec's estimate, scaled to the cost model's hardware by
the searched tables both price alone, so that one rank's sum is in one unit. Where the search defers to TorchRec's
planner (`ShardwiseSearch.defers`), it rates as TorchRec's planner does: each rank's TorchRec estimates, summed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torchrec.distributed.planner.types import PerfModel, ShardingOption

from shardwise.costmodel.data_parallel import all_reduce_of
from shardwise.costmodel.row_wise import reduce_scatter_of
from shardwise.costmodel.types import CostModel
from shardwise.search.simulator import ShardCostCache, simulate

from .search import ShardwiseSearch
from .space import PlanSpace, torchrec_ms


@dataclass(frozen=True)
class RankCosts:
    """A rated proposal: predicted ms per rank, and the tables TorchRec's estimator priced."""

    ms: tuple[float, ...]
    by_torchrec: tuple[str, ...]


class ShardwisePerfModel(PerfModel):
    """The slowest rank's predicted ms (TorchRec's estimate alone where the search has no cost model, or defers to
    TorchRec's planner)."""

    def __init__(self, search: ShardwiseSearch) -> None:
        self.search = search
        self._scaled: tuple[PlanSpace, CostModel, float] | None = None
        self._deferred: tuple[PlanSpace, bool] | None = None

    def costs(self, plan: list[ShardingOption]) -> RankCosts:
        """Each rank's predicted ms for `plan`, and which tables TorchRec's estimator priced."""
        space = self.search.space_of(plan)
        model: CostModel | None = self.search.resolved_cost_model()
        if model is None or self._defers(space):  # TorchRec's estimate of every shard, as its planner rates
            return RankCosts(tuple(torchrec_ms(plan, space.world_size)), tuple(t.key for t in space.tables))
        kinds = frozenset({"table_wise", "column_wise"} | ({"data_parallel"} if all_reduce_of(model) else set())
                          | ({"row_wise"} if reduce_scatter_of(model) else set()))
        priced, task, estimated, by_torchrec = space.priced(plan, kinds)
        ms = np.asarray(estimated, dtype=np.float64) * (self._scale(space, model, plan) if by_torchrec else 1.0)
        if task is not None:
            ms = ms + simulate(priced, task, model).total_ms
        return RankCosts(tuple(float(x) for x in ms), tuple(by_torchrec))

    def _defers(self, space: PlanSpace) -> bool:
        """Whether the search leaves `space`'s tables to TorchRec's planner (asked once per plan space: every
        proposal is rated)."""
        if self._deferred is None or self._deferred[0] is not space:
            self._deferred = (space, self.search.defers(space.described) is not None)
        return self._deferred[1]

    def _scale(self, space: PlanSpace, model: CostModel, plan: list[ShardingOption]) -> float:
        """Cost-model ms per TorchRec-estimated ms: the searched tables' table-wise shards, each alone; where the
        space has none (a space of `plan`'s own options, none table-wise: no ShardwiseProposer loaded TorchRec's),
        each table's option in `plan`, all its shards against the table alone."""
        if self._scaled is not None and self._scaled[0] is space and self._scaled[1] is model:
            return self._scaled[2]
        pairs = [(t.priced, t.option("table_wise")) for t in space.searched if t.priced is not None
                 and t.spec is not None and "table_wise" in (t.spec.sharding_types or ())]
        if not pairs:
            placed = {o.fqn: o for o in plan}
            pairs = [(t.priced, placed[t.fqn]) for t in space.tables if t.priced is not None and t.fqn in placed]
        learned = ShardCostCache(model).compute_ms([[spec] for spec, _ in pairs]).sum() if pairs else 0.0
        theirs = sum(s.perf.total for _, option in pairs for s in option.shards if s.perf is not None)
        scale = float(learned / theirs) if theirs > 0 and learned > 0 else 1.0
        self._scaled = (space, model, scale)
        return scale

    def rate(self, plan: list[ShardingOption]) -> float:
        return max(self.costs(plan).ms)

