"""A production task planned the way its training job will shard it: the model rebuilt on the meta device from its
context, planned by `ShardwisePlanner` (and, to compare, by TorchRec's own planner) with the same topology, batch
size, constraints, sharders and storage reservation, so that the registered plan's context hash is the job's."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.types import ShardingPlan

from shardwise.costmodel.types import CostModel
from shardwise.search import Plan
from shardwise.search.plan import Shard
from shardwise.search.torchrec_plan import plan_from_module_sharding

from .context import ProductionTask
from .plan_loader import TorchRecPlanDoc, enumerated_fingerprint, plan_doc
from .planner import ShardwisePlanner


@dataclass(frozen=True)
class PlannedTask:
    """A production task's plan: shardwise's form (to measure), TorchRec's (to register), the planner's account."""

    plan: Plan
    torchrec: TorchRecPlanDoc
    stats: str | None


def plan_production_task(production: ProductionTask, cost_model: CostModel, *, refine_s: float | None = None,
                         seed: int = 0) -> PlannedTask:
    """`ShardwisePlanner`'s plan of the production task's model, with `cost_model` (refinement on this machine
    for up to `refine_s` seconds where the drop-in refines)."""
    context = production.context
    planner = ShardwisePlanner(**_planner_args(production), cost_model=cost_model, task=production.task,
                               refine=refine_s, seed=seed)
    with _quiet_planner():
        sharding_plan = planner.plan(context.module(), context.torchrec_sharders())
    best = getattr(planner, "_best_plan", None) or []
    fingerprint = enumerated_fingerprint(planner._enumerator) or {}
    doc = plan_doc(best, planner.hash_planner_context_inputs_str(), fingerprint)
    return PlannedTask(plan=as_shardwise_plan(sharding_plan, production, "ShardwisePlanner"), torchrec=doc,
                       stats=planner.last_stats)


def torchrec_planner_plan(production: ProductionTask) -> Plan:
    """TorchRec's own planner's plan of the production task's model, in shardwise's form."""
    planner = EmbeddingShardingPlanner(**_planner_args(production))
    with _quiet_planner():
        sharding_plan = planner.plan(production.context.module(), production.context.torchrec_sharders())
    return as_shardwise_plan(sharding_plan, production, "TorchRec's planner")


def as_shardwise_plan(sharding_plan: ShardingPlan, production: ProductionTask, method: str) -> Plan:
    """A TorchRec plan of the production task's collections as one shardwise plan of its task (table names are
    unique across the collections: `export_task`)."""
    world_size = production.context.topology.world_size
    shards: list[Shard] = []
    data_parallel: list[str] = []
    row_wise: list[str] = []
    for collection in production.context.collections:
        module_plan = sharding_plan.plan.get(collection.path)
        if module_plan is None:
            continue
        part = plan_from_module_sharding(module_plan, world_size, method)  # type: ignore[arg-type]
        shards += part.shards
        data_parallel += part.data_parallel
        row_wise += part.row_wise
    return Plan(num_devices=world_size, shards=tuple(shards), data_parallel=tuple(data_parallel),
                row_wise=tuple(row_wise), method=method)


@contextlib.contextmanager
def _quiet_planner() -> Iterator[None]:
    """TorchRec's planner's stats table and its dry-run storage warning off the console: publish prints its own
    comparison, and a rebuilt model is always a dry run."""
    quiet = logging.getLogger("torchrec.distributed.planner")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)


def _planner_args(production: ProductionTask) -> dict[str, Any]:
    context = production.context
    return {"topology": context.torchrec_topology(), "batch_size": context.batch_size,
            "constraints": context.torchrec_constraints(),
            "storage_reservation": context.torchrec_storage_reservation()}
