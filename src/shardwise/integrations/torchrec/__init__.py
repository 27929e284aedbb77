"""shardwise plans for TorchRec: `ShardwisePlanner`, TorchRec's `EmbeddingShardingPlanner` with shardwise's search
in its stages, the stages themselves, (re-exported from `shardwise.search.torchrec_plan`, where they live) the
export of a shardwise plan to a `ShardingPlan`, a model's tables exported as shardwise's workload, a model exported
as a production task for `shardwise publish`, and the registered plan loaded back through TorchRec's `PlanLoader`.

    DistributedModelParallel(model, plan=ShardwisePlanner(topology).collective_plan(model, sharders, pg))
    DistributedModelParallel(model, plan=to_sharding_plan(plan, task, module_path="ebc"))
    save_tables(export_tables(model, constraints, batch_size=65536), "tables.json")
    save_production_task(export_task(model, topology, constraints=constraints, name="ranking"), "ranking.task.json")
    ShardwisePlanner(topology, constraints=constraints,
                     plan_loader=MlflowPlanLoader("models:/shardwise-plan-ranking@champion"))

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

from .context import PlannerContext, ProductionTask, export_task, load_production_task, save_production_task
from .enumerator import ShardwiseEnumerator
from .errors import PlannerError
from .export import export_tables
from .partitioner import PlacedPartitioner
from .perf_model import ShardwisePerfModel
from .plan_loader import MlflowPlanLoader
from .planner import ShardwisePlanner
from .proposer import ShardwiseProposer
from .search import DEFAULT_ADAPT_S, DEFAULT_REFINE_S, ShardwiseSearch
from .stats import ShardwiseStats

__all__ = [
    "COMPUTE_KERNEL",
    "DEFAULT_ADAPT_S",
    "DEFAULT_REFINE_S",
    "MlflowPlanLoader",
    "PlacedPartitioner",
    "PlannerContext",
    "PlannerError",
    "ProductionTask",
    "ShardwiseEnumerator",
    "ShardwisePerfModel",
    "ShardwisePlanner",
    "ShardwiseProposer",
    "ShardwiseSearch",
    "ShardwiseStats",
    "ebc_on_meta",
    "export_task",
    "export_tables",
    "load_production_task",
    "parameter_sharding",
    "plan_from_module_sharding",
    "save_production_task",
    "to_module_sharding_plan",
    "to_sharding_plan",
]
