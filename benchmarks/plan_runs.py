"""What the plan experiments share: the task sets they draw from held-out synthetic tables and how two plans'
measurements compare task by task."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from shardwise.evaluation import PAPER_TASK_SETS, PlanResult, make_task_set
from shardwise.workload import ShardingTask
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import TableSet, split_tables

MEASURED_GREEDY = "measured_greedy"
#: NeuroShard's plan refined on this machine (run_benchmark's "<method>+refine")
REFINED = "neuroshard+refine"


def held_out_pool(seed: int, row_scale: float = 0.01, batch_size: int = 65536, *, small: bool = False) -> TableSet:
    """The held-out share of synthetic DLRM tables the task sets draw from (800 tables, 20% held out; small: 200,
    half)."""
    tables = synthesize_tables(num_tables=200 if small else 800, seed=seed, row_scale=row_scale,
                               batch_size=batch_size, progress=False)
    return split_tables(tables, holdout_fraction=0.5 if small else 0.2, seed=seed)[1]


def paper_tasks(per_set: int, seed: int, batch_size: int) -> list[tuple[str, ShardingTask]]:
    """(set name, task) for the first `per_set` tasks of each paper task set, at `batch_size` (at 65536, TorchRec's
    storage estimate finds no plan for them)."""
    pool = held_out_pool(seed, batch_size=batch_size)
    return [(spec.name, task) for spec in PAPER_TASK_SETS
            for task in make_task_set(pool, spec.model_copy(update={"num_tasks": per_set}), seed=seed)]


def at_or_below(results: list[PlanResult], method: str, reference: str, value: Callable[[PlanResult], float]) -> str:
    """On how many tasks `method`'s figure is at or below `reference`'s, the worst ratio and the mean of the
    ratios ("" when no task has both)."""
    mine = {r.task_index: value(r) for r in results if r.method == method}
    theirs = {r.task_index: value(r) for r in results if r.method == reference}
    if not (tasks := sorted(set(mine) & set(theirs))):
        return ""
    ratios = [mine[k] / theirs[k] for k in tasks]
    return (f"{method} at or below {reference} on {sum(r <= 1 for r in ratios)} of {len(tasks)} tasks (worst ratio "
            f"{max(ratios):.3f}, mean {statistics.fmean(ratios):.3f})")
