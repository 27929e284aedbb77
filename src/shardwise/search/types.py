"""The one interface every search method implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from shardwise.costmodel.types import CostModel
from shardwise.workload import ShardingTask

from .plan import Plan


@runtime_checkable
class Searcher(Protocol):
    """A sharding method: `search` returns a valid, memory-feasible plan or raises PlanError.

    Baselines ignore `cost_model`; when one is given, every method reports predicted costs with it."""

    name: str

    def search(self, task: ShardingTask, cost_model: CostModel | None, seed: int) -> Plan:
        """A plan for `task` (seeded where the method is random)."""
        ...
