"""shardwise plans for TorchRec: `ShardwisePlanner`, TorchRec's `EmbeddingShardingPlanner` with shardwise's search
in its stages, the stages themselves, (re-exported from `shardwise.search.torchrec_plan`, where they live) the
export of a shardwise plan to a `ShardingPlan`, and a model's tables exported as shardwise's workload.

    DistributedModelParallel(model, plan=ShardwisePlanner(topology).collective_plan(model, sharders, pg))
    DistributedModelParallel(model, plan=to_sharding_plan(plan, task, module_path="ebc"))
    save_tables(export_tables(model, constraints, batch_size=65536), "tables.json")

This package needs TorchRec (the `torchrec` extra); docs/torchrec.md says what is honoured and how.
"""

from shardwise.search.torchrec_plan import (
    COMPUTE_KERNEL,
    ebc_on_meta,
    parameter_sharding,
    plan_from_module_sharding,
    to_module_sharding_plan,
    to_sharding_plan,
)

from .enumerator import ShardwiseEnumerator
from .errors import PlannerError
from .export import export_tables
from .partitioner import PlacedPartitioner
from .perf_model import ShardwisePerfModel
from .planner import ShardwisePlanner
from .proposer import ShardwiseProposer
from .search import DEFAULT_ADAPT_S, DEFAULT_REFINE_S, ShardwiseSearch
from .stats import ShardwiseStats

__all__ = [
    "COMPUTE_KERNEL",
    "DEFAULT_ADAPT_S",
    "DEFAULT_REFINE_S",
    "PlacedPartitioner",
    "PlannerError",
    "ShardwiseEnumerator",
    "ShardwisePerfModel",
    "ShardwisePlanner",
    "ShardwiseProposer",
    "ShardwiseSearch",
    "ShardwiseStats",
    "ebc_on_meta",
    "export_tables",
    "parameter_sharding",
    "plan_from_module_sharding",
    "to_module_sharding_plan",
    "to_sharding_plan",
]
