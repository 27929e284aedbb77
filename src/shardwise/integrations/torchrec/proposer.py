"""A TorchRec `Proposer` backed by a shardwise search.

It proposes TorchRec's greedy proposal first (its feedback brings the planner's storage constraint, and it stays in
the running), then the shardwise plan of the searched tables within each rank's storage, placed, searched again with
less memory where TorchRec's storage estimate of it does not fit. Where the search finds no plan that fits, TorchRec's
greedy proposals go on, so that the planner finds what TorchRec's would, or raises the error it would raise. Where
the search defers to TorchRec's planner (`ShardwiseSearch.defers`: by default, tables the cost model has not
learned), it proposes what TorchRec's default proposers propose from TorchRec's own options, in their order."""

from __future__ import annotations

import logging
from typing import Any

from torchrec.distributed.planner.proposers import GreedyProposer, GridSearchProposer, UniformProposer
from torchrec.distributed.planner.types import Enumerator, Proposer, ShardingOption, Topology

from shardwise.search import PlanError

from .enumerator import ShardwiseEnumerator
from .errors import PlannerError
from .search import LEARNED_PLAN_HOWTO, ShardwiseSearch
from .space import device_tier, rank_capacity

log = logging.getLogger("shardwise.torchrec")

#: searches again with less memory where TorchRec's storage estimate of the plan is over a rank's (its estimate of
#: a shard's buffers is not shardwise's)
ACCOUNTING_REPLANS = 4


def proposal_key(proposal: list[ShardingOption]) -> frozenset[tuple[Any, ...]]:
    """The placements of a proposal's placed options (type, kernel, shards and their ranks): the same in the
    plan the planner returns where it returns this proposal."""
    return frozenset((o.fqn, o.sharding_type, o.compute_kernel,
                      tuple((tuple(s.size), tuple(s.offset), s.rank) for s in o.shards))
                     for o in proposal if o.shards and all(s.rank is not None for s in o.shards))


def torchrec_proposers() -> list[Proposer]:
    """The proposers TorchRec's `EmbeddingShardingPlanner` runs by default, in its order."""
    return [GridSearchProposer(), GreedyProposer(), GreedyProposer(use_depth=False), UniformProposer()]


class ShardwiseProposer(Proposer):
    """Proposes TorchRec's greedy proposal, then the plan `search` makes of the tables shardwise searches (the plan
    space, the search's task and plan, or why it found none, kept on `search` for the other stages)."""

    def __init__(self, search: ShardwiseSearch) -> None:
        self.search = search
        self._greedy = GreedyProposer()
        self._torchrec: list[Proposer] = []
        self._enumerated_by: Enumerator | None = None
        self._storage: Topology | None = None
        self._phase = "greedy"
        self._first_fitted: bool | None = None
        self._memory_cut = 0
        self._replans = 0

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None:
        space = self.search.load(search_space)
        assert space is not None  # loaded from a search space
        self._enumerated_by = enumerator
        self._storage = None
        self._phase, self._first_fitted, self._memory_cut, self._replans = "greedy", None, 0, 0
        deferred = self.search.defers(space.described)
        if deferred is None:
            self._greedy.load(search_space, enumerator)
            return
        log.warning("ShardwisePlanner: the plan is TorchRec's planner's own, the cost model has not learned these "
                    "tables (%s); %s", deferred, LEARNED_PLAN_HOWTO)
        own = enumerator.torchrec_options(search_space) if isinstance(enumerator, ShardwiseEnumerator) else search_space
        self._torchrec = torchrec_proposers()
        for proposer in self._torchrec:
            proposer.load(own, enumerator)
        self._phase = "deferred"

    def propose(self) -> list[ShardingOption] | None:
        while self._phase == "deferred" and self._torchrec:  # each of TorchRec's proposers until it has no more
            proposal = self._torchrec[0].propose()
            if proposal:
                return proposal
            self._torchrec.pop(0)
        if self._phase in ("greedy", "torchrec"):
            return self._greedy.propose()
        space = self.search.space
        if self._phase != "search" or space is None or self._storage is None:
            return None
        tier = device_tier(self._storage)
        budget = rank_capacity(self._storage, tier) - space.kept_bytes(tier) - self._memory_cut
        if not space.searched or budget <= 0:
            self.search.last_error = "no table to search" if not space.searched else (
                f"nothing is left of each rank's {tier.upper()} for the tables shardwise searches after the others")
            return self._fall_back()
        try:
            plan = self.search.plan(space.task(budget))  # kept as the search's last_task and last_plan
        except PlannerError:
            raise  # a setting the planner cannot honour (adapt, refine, the cost model): the caller's to fix
        except PlanError as err:  # kept as the search's last_error
            log.info("ShardwisePlanner: %s", err)
            return self._fall_back()
        return space.proposal(plan, self._enumerated_by)

    def _fall_back(self) -> list[ShardingOption] | None:
        """TorchRec's greedy proposals after its first, where the search has no plan that fits: TorchRec's planner
        then finds what it would have found, or raises what it would have raised."""
        self._phase = "torchrec"
        return self._greedy.propose() if self._first_fitted is False else None

    def feedback(self, partitionable: bool, plan: list[ShardingOption] | None = None,
                 perf_rating: float | None = None, storage_constraint: Topology | None = None) -> None:
        self._storage = storage_constraint
        if self._phase == "deferred":
            self._torchrec[0].feedback(partitionable, plan, perf_rating, storage_constraint)
            return
        if self._phase == "greedy":
            self._first_fitted = partitionable
            self._greedy.feedback(partitionable, plan, perf_rating, storage_constraint)
            self._phase = "search"
            return
        if self._phase == "torchrec":
            self._greedy.feedback(partitionable, plan, perf_rating, storage_constraint)
            return
        self._replans += 1
        if partitionable or plan is None or storage_constraint is None:
            self._phase = "done"
            return
        if self._replans > ACCOUNTING_REPLANS:
            self.search.last_error = (f"its plan is over a rank's storage by TorchRec's estimate after {ACCOUNTING_REPLANS} "
                               "searches with less memory")
            self._fall_back()
            return
        # the most a rank is over in TorchRec's estimate: the search gets that much less memory, and a little more
        tier = device_tier(storage_constraint)
        used = [0] * len(storage_constraint.devices)
        for option in plan:
            for shard in option.shards:
                if shard.rank is not None and shard.storage is not None:
                    used[shard.rank] += getattr(shard.storage, tier)
        over = max(u - getattr(d.storage, tier) for u, d in zip(used, storage_constraint.devices, strict=True))
        self._memory_cut += max(over, 0) + rank_capacity(storage_constraint, tier) // 100
