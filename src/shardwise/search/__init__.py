"""Search: plans (validity, memory, JSON IO), the simulator, NeuroShard and the baselines."""

from __future__ import annotations

from .baselines import GREEDY_KEYS, GreedySearch, RandomSearch
from .neuroshard import NeuroShardConfig, NeuroShardSearch
from .plan import (
    PLAN_FORMAT,
    Plan,
    PlanError,
    Shard,
    check_memory_bounds,
    device_specs,
    load_plan,
    plan_from_json,
    plan_memory_bytes,
    save_plan,
    validate_plan,
)
from .policy_common import POLICY_METHODS  # learned policies; make_searcher needs `policy=`
from .report import finish_plan, format_plan
from .simulator import PlanCost, ShardCostCache, simulate
from .torchrec_planner import TorchRecPlannerSearch
from .types import Searcher

METHODS: tuple[str, ...] = (
    "neuroshard",
    "random",
    "size_greedy",
    "dim_greedy",
    "lookup_greedy",
    "size_lookup_greedy",
    "torchrec",
    "torchrec_cw",
)
#: methods that need a cost model to search (the others use one only to report predicted costs)
MODEL_METHODS: frozenset[str] = frozenset({"neuroshard", *POLICY_METHODS})


def make_searcher(method: str, **options: object) -> Searcher:
    """The searcher called `method` (one of METHODS), configured by `options`."""
    if method == "neuroshard":
        return NeuroShardSearch(**options)  # type: ignore[arg-type]
    if method == "random":
        return RandomSearch(**options)  # type: ignore[arg-type]
    if method.endswith("_greedy") and method.removesuffix("_greedy") in GREEDY_KEYS:
        return GreedySearch(method.removesuffix("_greedy"), **options)  # type: ignore[arg-type]
    if method in ("torchrec", "torchrec_cw"):
        return TorchRecPlannerSearch(column_wise=method == "torchrec_cw", **options)  # type: ignore[arg-type]
    if method in POLICY_METHODS:
        # learned policies: options policy=<loaded policy | directory | models:/...>, samples=, tracking_uri=
        from .policy_common import policy_searcher

        return policy_searcher(method, **options)  # type: ignore[arg-type]
    raise ValueError(f"method {method!r} is not one of {', '.join(METHODS + POLICY_METHODS)}")


__all__ = [
    "GREEDY_KEYS",
    "METHODS",
    "MODEL_METHODS",
    "POLICY_METHODS",
    "PLAN_FORMAT",
    "GreedySearch",
    "NeuroShardConfig",
    "NeuroShardSearch",
    "Plan",
    "PlanCost",
    "PlanError",
    "RandomSearch",
    "Searcher",
    "Shard",
    "ShardCostCache",
    "TorchRecPlannerSearch",
    "check_memory_bounds",
    "device_specs",
    "finish_plan",
    "format_plan",
    "load_plan",
    "make_searcher",
    "plan_from_json",
    "plan_memory_bytes",
    "save_plan",
    "simulate",
    "validate_plan",
]
