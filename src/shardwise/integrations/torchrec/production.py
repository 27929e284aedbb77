"""A production task planned the way its training job will shard it: the model rebuilt on the meta device from its
context, planned by `ShardwisePlanner` (and, to compare, by TorchRec's own planner) with the same topology, batch
size, constraints, sharders and storage reservation, so that the registered plan's context hash is the job's."""

from __future__ import annotations

import contextlib
import logging
import time
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
class RefinementOutcome:
    """What refinement on this machine did to the searched plan: its time, whether the plan it returned is another
    layout, the cost model's prediction of both, and refinement's own measurements (its sessions)."""

    seconds: float
    changed: bool
    unrefined_predicted_ms: float | None
    predicted_ms: float | None
    #: the searched plan's slowest device measured beside the other starts, refinement's first session
    unrefined_measured_ms: float | None
    #: the plan refinement went on from ("neuroshard", "torchrec", ...) and it and the returned plan side by side
    start: str
    before_ms: float
    after_ms: float

    def figures(self) -> dict[str, Any]:
        """As publish records them (`figures.json`, the registered version's tags)."""
        return {"refinement_s": self.seconds, "refinement_changed": self.changed,
                "unrefined_predicted_ms": self.unrefined_predicted_ms, "predicted_ms": self.predicted_ms,
                "unrefined_measured_ms": self.unrefined_measured_ms, "refinement_start": self.start,
                "refinement_before_ms": self.before_ms, "refinement_after_ms": self.after_ms}


@dataclass(frozen=True)
class PlannedTask:
    """A production task's plan: shardwise's form (to measure), TorchRec's (to register), the planner's account,
    what refinement did (None where it did not run) and the planner's time."""

    plan: Plan
    torchrec: TorchRecPlanDoc
    stats: str | None
    refinement: RefinementOutcome | None = None
    planning_s: float = 0.0


def plan_production_task(production: ProductionTask, cost_model: CostModel, *, refine_s: float | None = None,
                         device: str | None = None, seed: int = 0) -> PlannedTask:
    """`ShardwisePlanner`'s plan of the production task's model, with `cost_model`, refined on this machine for
    `refine_s` seconds (0: not refined; None: the drop-in's default, only after adaptation ran). `device` is where
    adaptation and refinement time kernels (default: the task topology's compute device), the one the plans are
    measured on after."""
    context = production.context
    planner = ShardwisePlanner(**_planner_args(production), cost_model=cost_model, task=production.task,
                               refine=refine_s, seed=seed)
    if device is not None:
        planner.search.device_type = device
    started = time.perf_counter()
    with _quiet_planner():
        sharding_plan = planner.plan(context.module(), context.torchrec_sharders())
    planning_s = time.perf_counter() - started
    best = planner.last_best_plan or []
    fingerprint = enumerated_fingerprint(planner.enumerator) or {}
    doc = plan_doc(best, planner.hash_planner_context_inputs_str(), fingerprint)
    return PlannedTask(plan=as_shardwise_plan(sharding_plan, production, "ShardwisePlanner"), torchrec=doc,
                       stats=planner.last_stats, refinement=_refinement_outcome(planner),
                       planning_s=planning_s)


def _refinement_outcome(planner: ShardwisePlanner) -> RefinementOutcome | None:
    """What refinement did to the last search's plan; None where it did not run."""
    search = planner.search
    record, refined, unrefined = search.last_refinement, search.last_plan, search.last_searched
    if record is None or refined is None or unrefined is None:
        return None
    return RefinementOutcome(
        seconds=search.last_seconds.get("refinement", record.seconds), changed=_layout(refined) != _layout(unrefined),
        unrefined_predicted_ms=_predicted_ms(unrefined), predicted_ms=_predicted_ms(refined),
        unrefined_measured_ms=record.starts.get(unrefined.method), start=record.start, before_ms=record.before_ms,
        after_ms=record.after_ms)


def _layout(plan: Plan) -> tuple[frozenset[frozenset[tuple[str, int, int]]], frozenset[str], frozenset[str]]:
    """What makes two plans one layout: each device's column slices (devices are alike: in any order), the
    data-parallel and the row-wise tables."""
    devices = frozenset(frozenset((s.table, s.col_offset, s.dim) for s in plan.device_shards(d))
                        for d in range(plan.num_devices))
    return devices, frozenset(plan.data_parallel), frozenset(plan.row_wise)


def _predicted_ms(plan: Plan) -> float | None:
    predicted = plan.extra.get("predicted", {}).get("max_cost_ms")
    return float(predicted) if predicted is not None else None


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
