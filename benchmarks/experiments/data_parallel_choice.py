"""Does replicating the smallest tables pay on this machine? A finished plan_quality run's refined plans, measured
beside the same plans with their k smallest tables made data-parallel, next to what the cost model says.

NeuroShard prices data-parallel roots (the tables in ascending rows, as prefixes of 1, 2, 4, ... tables) and keeps one
only where the model predicts a cheaper plan. This experiment asks the hardware the same question without the search:
each task's refined plan (`neuroshard+refine` of --run) and, for each k of --counts, that plan with its k tables of
fewest rows taken off their devices and replicated on every device (their dense kernel on the local batch and their
gradients' all-reduce on every device, the rest where it was), measured together in one session under the run's
protocol (`measure_plans`, the run's reference pinned), and each predicted by the cost model (`simulate`). A variant
whose replicas do not fit in a device's memory beside its shards is left out and said so. Per task and k: the measured
and predicted plan cost over the plan's without replicas; per k the mean and on how many tasks it measured cheaper:
whether the search's choice (none, or which k) is the hardware's.

    python -m benchmarks data_parallel_choice --run runs/bench_pq_s28_4 --model runs/model_s28
    python -m benchmarks data_parallel_choice --run RUN --model MODEL --counts 1,2,4 --num-tasks 5 --record
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from pydantic import Field

from benchmarks.harness import BenchmarkError, Context, Experiment, ExperimentSettings, Outcome, register
from benchmarks.plan_runs import REFINED, finished_run


class DataParallelChoiceSettings(ExperimentSettings):
    """Which run's plans, which model predicts, how many tables replicated."""

    run: str = Field(description="a plan_quality experiment's --out directory")
    model: str = Field(description="the cost model the run planned with (its predictions)")
    counts: tuple[int, ...] = Field(default=(1, 2, 4), description="how many of the smallest tables to replicate",
                                    json_schema_extra={"sep": ","})
    num_tasks: int | None = Field(default=None, ge=1, description="the first this many tasks of each set")


def replicated(plan: Any, task: Any, count: int) -> Any:
    """`plan` with its `count` tables of fewest rows (that it does not already replicate) data-parallel: their shards
    taken off their devices, the tables on every device. PlanError where the replicas do not fit."""
    from shardwise.search import validate_plan

    chosen = [t.name for t in sorted(task.tables, key=lambda t: (t.rows, t.name))
              if t.name not in plan.data_parallel and t.name not in plan.row_wise][:count]
    variant = plan.model_copy(update={
        "shards": tuple(s for s in plan.shards if s.table not in chosen),
        "data_parallel": tuple(sorted((*plan.data_parallel, *chosen))), "method": f"{plan.method}+dp{count}"})
    validate_plan(variant, task)  # over a device's memory: PlanError
    return variant


def run(settings: DataParallelChoiceSettings, context: Context) -> Outcome:
    """Each refined plan beside its replicated variants, measured and predicted; one row per plan."""
    from shardwise.costmodel.data_parallel import gradient_bytes
    from shardwise.evaluation import measure_plans
    from shardwise.profiling import MeasurementSettings
    from shardwise.search import PlanError, load_plan
    from shardwise.search.simulator import simulate
    from shardwise.workload import load_task

    if any(c < 1 for c in settings.counts):
        raise BenchmarkError(f"--counts {','.join(map(str, settings.counts))}: each at least 1")
    run_dir, original = finished_run(settings.run)
    model = context.cost_model(settings.model, required=True)
    measurement = MeasurementSettings(**original["measurement"])  # the run's protocol, its reference pinned
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    left_out: list[str] = []
    for task_dir in sorted(run_dir.glob("*/task*")):
        if not (task_dir / f"{REFINED}.plan.json").is_file():
            continue
        index = int(task_dir.name.removeprefix("task"))
        if settings.num_tasks is not None and index >= settings.num_tasks:
            continue
        task, plan = load_task(task_dir / "task.json"), load_plan(task_dir / f"{REFINED}.plan.json")
        plans = [(0, plan)]
        for count in settings.counts:
            try:
                plans.append((count, replicated(plan, task, count)))
            except PlanError as err:
                left_out.append(f"{task_dir.parent.name} task {index}, {count} replicated: {err}")
        measured = measure_plans([(task, p) for _, p in plans], measurement, progress=False)
        predicted = [simulate(p, task, model).max_cost_ms for _, p in plans]
        rows += [{"task_set": task_dir.parent.name, "task": index, "replicated": count,
                  "gradient_kib": round(gradient_bytes([task.table(n) for n in p.data_parallel]) / 1024, 1),
                  "measured_ms": round(cost.max_cost_ms, 4), "predicted_ms": round(ms, 4),
                  "measured_ratio": round(cost.max_cost_ms / measured[0].max_cost_ms, 4),
                  "predicted_ratio": round(ms / predicted[0], 4)}
                 for (count, p), cost, ms in zip(plans, measured, predicted, strict=True)]
    if not rows:
        raise BenchmarkError(f"--run {run_dir}: no task there has a {REFINED} plan")
    headlines = []
    for name in sorted({r["task_set"] for r in rows}):
        for count in settings.counts:
            mine = [r for r in rows if r["task_set"] == name and r["replicated"] == count]
            if mine:
                cheaper = sum(r["measured_ratio"] < 1 for r in mine)
                headlines.append(
                    f"{name}: {count} smallest replicated, over the plan without: measured "
                    f"{statistics.mean(r['measured_ratio'] for r in mine):.3f} (cheaper on {cheaper} of {len(mine)} "
                    f"tasks, best {min(r['measured_ratio'] for r in mine):.3f}), predicted "
                    f"{statistics.mean(r['predicted_ratio'] for r in mine):.3f}")
    headlines += [f"left out (memory): {line}" for line in left_out]
    return Outcome(rows, notes=[
        f"the refined plans of {run_dir} (plan_quality), each measured beside its variants in one session under the "
        f"run's protocol ({measurement.timing_rounds} kernel timings, {measurement.comm_rounds} x "
        f"{measurement.comm_iters} all-to-alls, all-reduces measured), predicted by {context.model}; ratios over the "
        f"plan without replicas ({time.perf_counter() - started:.0f} s)", *headlines])


register(Experiment(
    name="data_parallel_choice",
    title="Replicating the smallest tables: measured and predicted, beside the refined plan",
    settings=DataParallelChoiceSettings,
    run=run,
))
